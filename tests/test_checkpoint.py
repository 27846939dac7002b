"""Checkpoints: clear errors for files that are not ours, damaged members, and misfit tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rustyflow_py.cli import main
from rustyflow_py.data import Vocab
from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.outputs.checkpoint import Checkpoint, CheckpointError, validate_against

SHAPES = {"wte": (10, 4), "ln_f.weight": (4,)}
OPT_SIZES = {"m": 44, "v": 44, "step_count": 1}
NOT_OURS = "is not a readable RustyFlow checkpoint (.npz written by `rustyflow train`)"


@pytest.fixture
def good(tmp_path: Path) -> Path:
    """A small checkpoint as checkpoint.save writes it: weights, optimizer, meta, vocab."""
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in SHAPES.items()}
    optimizer = {"m": np.zeros(44, np.float32), "v": np.zeros(44, np.float32),
                 "step_count": np.array(3, np.int32)}
    meta = {"config": {"SEQ_LEN": 8}, "train": {"step": 3}}
    vocab = Vocab([f"w{i}" for i in range(10)]).to_array()
    return checkpoint.save(tmp_path / "good.npz", weights, meta, vocab, optimizer)


def damaged(good: Path, drop: tuple[str, ...] = (), **replace: object) -> Path:
    """A copy of `good` with members dropped or replaced (keys use '__' for '/')."""
    with np.load(good, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in drop}
    arrays.update({k.replace("__", "/"): v for k, v in replace.items()})
    path = good.with_name("damaged.npz")
    np.savez(path, **arrays)
    return path


def not_ours_files(tmp_path: Path, good: Path) -> dict[str, Path]:
    files = {
        "random": np.random.default_rng(1).bytes(300),
        "text": b"garbage" * 20,
        "truncated": good.read_bytes()[:1000],
    }
    paths = {}
    for name, content in files.items():
        paths[name] = tmp_path / f"{name}.npz"
        paths[name].write_bytes(content)
    np.save(tmp_path / "array.npy", np.zeros(3))
    paths["npy"] = (tmp_path / "array.npy").rename(tmp_path / "npy.npz")
    np.savez(tmp_path / "pickled.npz", meta=np.array([{"a": 1}], dtype=object))
    paths["pickled"] = tmp_path / "pickled.npz"
    return paths


@pytest.mark.parametrize("flag", ["--model", "--resume"])
def test_files_that_are_not_checkpoints_name_the_flag_and_never_suggest_pickle(
        tmp_path: Path, good: Path, flag: str) -> None:
    for name, path in not_ours_files(tmp_path, good).items():
        with pytest.raises(CheckpointError) as err:
            Checkpoint(path, flag=flag)
        message = str(err.value)
        assert message.startswith(f"{path} {NOT_OURS}: "), name
        assert message.endswith(f"; pass another file to {flag}"), name
        assert "allow_pickle" not in message and "pickle.load" not in message, name
    with pytest.raises(CheckpointError, match=f"checkpoint not found: .*missing.npz; .* {flag}$"):
        Checkpoint(tmp_path / "missing.npz", flag=flag)


def test_cli_eval_of_random_bytes_is_one_clean_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(np.random.default_rng(2).bytes(500))
    result = CliRunner().invoke(main, ["eval", "--model", str(bad), "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert NOT_OURS in result.output and "pass another file to --model" in result.output
    assert "allow_pickle" not in result.output


@pytest.mark.parametrize(("drop", "replace", "reason"), [
    (("meta",), {}, "it has no 'meta' entry"),
    ((), {"meta": np.array("{not json")}, "its 'meta' entry is not JSON"),
    ((), {"meta": np.array(json.dumps([1, 2]))}, "its 'meta' entry is not a JSON object"),
    (("vocab",), {}, "it has no 'vocab' entry"),
    ((), {"vocab": np.arange(3)}, "its 'vocab' entry is not a list of words"),
    (("param/wte", "param/ln_f.weight"), {}, "it holds no weights"),
    ((), {"param__wte": np.array(["a", "b"])}, "its array 'wte' is not numeric"),
])
def test_damaged_members_are_checkpoint_errors(good: Path, drop: tuple[str, ...],
                                               replace: dict[str, object], reason: str) -> None:
    path = damaged(good, drop, **replace)
    with pytest.raises(CheckpointError) as err:
        Checkpoint(path, flag="--resume")
    assert str(err.value).startswith(f"{path} {NOT_OURS}: {reason}")
    assert str(err.value).endswith("; pass another file to --resume")


def test_good_checkpoint_loads_and_validates(good: Path) -> None:
    ckpt = Checkpoint(good)
    assert set(ckpt.weights) == set(SHAPES) and set(ckpt.optimizer) == set(OPT_SIZES)
    assert ckpt.meta["train"]["step"] == 3 and len(ckpt.vocab) == 10
    validate_against(ckpt, SHAPES, OPT_SIZES, "--resume")
    validate_against(ckpt, SHAPES, None, "--model")


@pytest.mark.parametrize(("drop", "replace", "expect"), [
    ((), {"param__wte": np.zeros((10, 5), np.float32)},
     "tensor wte has shape (10, 5), this model needs (10, 4)"),
    (("param/ln_f.weight",), {}, "the checkpoint lacks the tensor ln_f.weight (shape (4,))"),
    ((), {"opt__m": np.zeros(10, np.float32)},
     "optimizer state 'm' has 10 values, this model needs 44"),
    ((), {"opt__step_count": np.zeros(0, np.int32)},
     "optimizer state 'step_count' has 0 values, this model needs 1"),
    (("opt/v",), {}, "the checkpoint lacks optimizer state 'v'"),
    (("opt/m", "opt/v", "opt/step_count"), {}, "the checkpoint holds no optimizer state"),
])
def test_validate_against_names_the_first_misfit(good: Path, drop: tuple[str, ...],
                                                 replace: dict[str, object], expect: str) -> None:
    path = damaged(good, drop, **replace)
    ckpt = Checkpoint(path, flag="--resume")
    with pytest.raises(CheckpointError) as err:
        validate_against(ckpt, SHAPES, OPT_SIZES, "--resume")
    assert str(err.value).startswith(f"--resume {path}: {expect}")
    if all(name.startswith("opt") for name in (*drop, *replace)):
        validate_against(ckpt, SHAPES, None, "--model")  # the weights alone still fit


def test_written_files_get_the_mode_umask_allows(tmp_path: Path) -> None:
    """write_atomically's file has a plain open()'s mode (0644 under umask 022), not the
    temporary file's 0600: a checkpoint is readable by whoever may read its folder."""
    import os

    from rustyflow_py.training.outputs.writing import write_atomically

    old = os.umask(0o022)
    try:
        path = write_atomically(tmp_path / "f.bin", lambda f: f.write(b"x"))
        os.umask(0o027)
        other = write_atomically(tmp_path / "g.bin", lambda f: f.write(b"x"))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert other.stat().st_mode & 0o777 == 0o640
