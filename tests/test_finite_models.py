"""Finite models only: a checkpoint with a nan or inf weight is refused by every command that
loads one, naming the first such tensor and how many values in it are not finite.

Such a model scores perplexity nan, generates empty text, and a run from it diverges at its
first step (where the learning rate would be blamed); a refusal at load says what is wrong.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import TRAIN, TRAINED, assert_intact, invoke, snapshot

from rustyflow_py.cli import main
from rustyflow_py.training.outputs.checkpoint import nonfinite

BAD = "diverged.npz"

COMMANDS = {
    "eval": (("eval", "--model", BAD, "--device", "cpu"), "--model", None),
    "generate": (("generate", "--model", BAD, "--device", "cpu", "--prompt", "the",
                  "--max-tokens", "2"), "--model", None),
    "chat": (("chat", "--model", BAD, "--device", "cpu", "--max-tokens", "2"), "--model",
             "the\nexit\n"),
    "export": (("export", BAD, "--format", "hf", "--out", "exported"), "`rustyflow export`",
               None),
    "init-from": ((*TRAIN, "--init-from", BAD, "--model-path", "models/f.npz",
                   "--max-steps", "2"), "--init-from", None),
    "resume": ((*TRAIN, "--resume", BAD, "--model-path", "models/r.npz", "--max-steps", "4"),
               "--resume", None),
}


def poisoned(good: Path, key: str, values: list[float]) -> int:
    """Write `good`'s checkpoint to BAD with the first values of array `key` set to
    `values` (the array is added, as a copy of param/wte, when `good` lacks it); its size."""
    with np.load(good) as z:
        arrays = {k: z[k] for k in z.files}
    array = arrays.get(key, arrays["param/wte"]).copy()
    array.flat[: len(values)] = values
    arrays[key] = array
    np.savez(BAD, **arrays)  # type: ignore[arg-type]
    return array.size


@pytest.mark.parametrize("command", COMMANDS)
def test_a_nan_weight_is_refused(workspace: Path, command: str) -> None:
    args, flag, stdin = COMMANDS[command]
    size = poisoned(workspace / TRAINED[0], "param/wte", [np.nan])
    before = snapshot(workspace)
    result = CliRunner().invoke(main, list(args), input=stdin)  # chat reads stdin
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: {BAD}: tensor wte holds 1 non-finite value (nan/inf) of "
                      f"{size:,}: the model diverged or the file is damaged; pass another "
                      f"checkpoint to {flag}"], result.output
    assert not Path("exported").exists()
    assert_intact(before, snapshot(workspace))


def test_a_non_finite_weight_average_is_refused(workspace: Path) -> None:
    """The weight average (EMA) is what a best checkpoint evaluates: it is held to the same."""
    size = poisoned(workspace / TRAINED[0], "avg/ema", [np.inf, -np.inf, np.nan])
    result = invoke(*COMMANDS["eval"][0])
    assert result.exit_code == 1, result.output
    assert (f"Error: {BAD}: tensor avg/ema holds 3 non-finite values (nan/inf) of {size:,}"
            in result.output)


def test_nonfinite_names_the_first_array_and_counts_its_values() -> None:
    arrays = {
        "ids": np.arange(5),  # integers: always finite, never looked into
        "big": np.array([1e308, 1e308]),  # finite, though their sum overflows
        "half": np.array([60000, 60000], np.float16),  # likewise in float16
        "a": np.array([1.0, np.inf, -np.inf, np.nan], np.float32),
        "b": np.array([np.nan]),
    }
    assert nonfinite(arrays) == ("a", 3)
    assert nonfinite({k: arrays[k] for k in ("b", "a")}) == ("b", 1)
    assert nonfinite({k: arrays[k] for k in ("ids", "big", "half")}) is None
    assert nonfinite({"empty": np.zeros(0, np.float32)}) is None
