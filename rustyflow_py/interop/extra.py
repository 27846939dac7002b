"""The optional `hf` extra (safetensors, tokenizers, huggingface_hub), imported on demand."""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import InteropError, install_command

HF_PACKAGES = "safetensors, tokenizers, huggingface_hub"


def require(module: str, what: str) -> ModuleType:
    """`module` imported, or an InteropError naming the extra that provides it: the package
    works without the extra, and only the commands that need it say so."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InteropError(f"{what} needs the optional extra 'hf' ({HF_PACKAGES}), which is not "
                           f"installed (no module {module!r}): {install_command('hf')}"
                           ) from None
