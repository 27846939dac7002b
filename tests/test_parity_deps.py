"""CI runs the parity tests against PyTorch (test_torch_parity.py, test_optim_suite.py) and
transformers (test_hf_interop.py). Those skip when their reference is not installed, which
is right on a developer's machine and wrong in CI: there a skip would pass silently. So with
RUSTYFLOW_WITH_TORCH=1 (which .ci/run sets, and which makes test.sh install both), a missing
reference is a failure here."""

from __future__ import annotations

import importlib
import os

import pytest

WITH_TORCH = os.environ.get("RUSTYFLOW_WITH_TORCH") == "1"


@pytest.mark.skipif(not WITH_TORCH, reason="RUSTYFLOW_WITH_TORCH is not 1: the parity tests "
                    "run where torch and transformers are installed, and skip elsewhere")
@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_the_parity_references_are_installed(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"RUSTYFLOW_WITH_TORCH=1 but {module} does not import ({exc}), so its parity "
                    f"tests would skip: `RUSTYFLOW_WITH_TORCH=1 ./test.sh` installs it")
