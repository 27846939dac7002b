"""`rustyflow import hf`, `export --format hf` and `train --init-from` without transformers:
GPT-2 folders written here with the safetensors library, every bad input one clear line."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import make_cfg, quiet

from rustyflow_py import data
from rustyflow_py.cli import main
from rustyflow_py.errors import command, install_command
from rustyflow_py.model.gpt import GPTConfig, init_weights
from rustyflow_py.training.outputs import checkpoint
from rustyflow_py.training.run.loop import Trainer

st_numpy = pytest.importorskip("safetensors.numpy",
                               reason="the hf extra: pip install 'rustyflow-py[hf]'")

from rustyflow_py.interop.hf_export import hf_name  # noqa: E402

pytestmark = pytest.mark.usefixtures("tiny_dir")


def hf_folder(folder: Path, vocab: list[str] | None = None, size: int = 20,
              drop: tuple[str, ...] = (), extra: dict[str, np.ndarray] | None = None,
              **config: Any) -> Path:
    """A GPT-2 folder as save_pretrained writes one (1 layer, width 32, 32 positions)."""
    v = len(vocab) if vocab is not None else size
    folder.mkdir(parents=True, exist_ok=True)
    hf = {"model_type": "gpt2", "vocab_size": v, "n_positions": 32, "n_embd": 32,
          "n_layer": 1, "n_head": 2, "activation_function": "gelu_new",
          "layer_norm_epsilon": 1e-5, **config}
    (folder / "config.json").write_text(json.dumps(hf))
    weights = {hf_name(k): w for k, w in init_weights(GPTConfig(v, 32, 1, 2, 32), 7).items()
               if k not in drop}
    st_numpy.save_file({**weights, **(extra or {})}, str(folder / "model.safetensors"),
                       {"format": "pt"})
    if vocab is not None:
        (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    return folder


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def one_line_error(result: Any, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    line = result.output.strip()
    assert line.startswith("Error: ") and "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def corpus_vocab() -> list[str]:
    return data.load_corpus("tiny.txt").vocab.itos


def test_import_writes_a_checkpoint_with_the_mark_and_the_shape(tmp_path: Path) -> None:
    hf_folder(tmp_path / "hf")
    result = run("import", "hf", "hf", "--out", "models/g.npz")
    assert result.exit_code == 0, result.output
    assert "L1 H2 E32, 32 positions" in result.output and "<token-N>" in result.output
    ckpt = checkpoint.Checkpoint("models/g.npz")
    assert ckpt.meta["writer"] == "rustyflow"
    assert ckpt.meta["imported"]["format"] == "huggingface"
    assert ckpt.config["SEQ_LEN"] == 32 and ckpt.config["EMBED_DIM"] == 32


@pytest.mark.parametrize("config, needle", [
    ({"model_type": "llama"}, "model_type is 'llama', not 'gpt2'"),
    ({"activation_function": "gelu"}, "activation_function='gelu' cannot be expressed"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06 cannot be expressed"),
    ({"n_inner": 100}, "n_inner=100 cannot be expressed"),
    ({"scale_attn_weights": False}, "scale_attn_weights=False cannot be expressed"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings=False cannot be expressed"),
    ({"n_layer": "two"}, "n_layer='two' is not a positive integer"),
])
def test_configs_rustyflow_cannot_express_are_named(tmp_path: Path, config: dict[str, Any],
                                                     needle: str) -> None:
    hf_folder(tmp_path / "hf", **config)
    one_line_error(run("import", "hf", "hf", "--out", "g.npz"), needle)
    assert not Path("g.npz").exists()


def test_a_folder_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    one_line_error(run("import", "hf", "empty", "--out", "g.npz"), "has no config.json")
    hf_folder(tmp_path / "bin").joinpath("model.safetensors").unlink()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    one_line_error(run("import", "hf", "bin", "--out", "g.npz"),
                   "has no model.safetensors", "never reads")
    one_line_error(run("import", "hf", "./nowhere", "--out", "g.npz"), "does not exist")


def test_missing_untied_and_foreign_tensors(tmp_path: Path) -> None:
    hf_folder(tmp_path / "a", drop=("h.0.ln_1.bias",))
    one_line_error(run("import", "hf", "a", "--out", "g.npz"),
                   "lacks the tensor h.0.ln_1.bias (shape (32,))")
    head = np.ones((20, 32), np.float32)
    hf_folder(tmp_path / "b", extra={"lm_head.weight": head})
    one_line_error(run("import", "hf", "b", "--out", "g.npz"), "lm_head.weight differs")
    hf_folder(tmp_path / "c", extra={"score.weight": head})
    one_line_error(run("import", "hf", "c", "--out", "g.npz"), "score.weight")


def test_safetensors_headers_that_lie_about_the_size(tmp_path: Path) -> None:
    path = hf_folder(tmp_path / "big") / "model.safetensors"
    blob = path.read_bytes()
    path.write_bytes(struct.pack("<Q", 10**12) + blob[8:])
    one_line_error(run("import", "hf", "big", "--out", "g.npz"),
                   "header says it is 1000000000000 bytes long")
    path = hf_folder(tmp_path / "cut") / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    one_line_error(run("import", "hf", "cut", "--out", "g.npz"), "lies about the file's size")


def test_outputs_rustyflow_did_not_make_are_never_overwritten(tmp_path: Path) -> None:
    hf_folder(tmp_path / "hf")
    Path("mine.npz").write_text("someone's notes")
    one_line_error(run("import", "hf", "hf", "--out", "mine.npz"), "not a rustyflow checkpoint")
    assert Path("mine.npz").read_text() == "someone's notes"
    assert run("import", "hf", "hf", "--out", "g.npz").exit_code == 0
    one_line_error(run("import", "hf", "hf", "--out", "g.npz"), "--overwrite")
    assert run("import", "hf", "hf", "--out", "g.npz", "--overwrite").exit_code == 0
    # export: into our own export again is fine; over someone's config.json it is refused
    assert run("export", "g.npz", "--format", "hf", "--out", "out").exit_code == 0
    assert run("export", "g.npz", "--format", "hf", "--out", "out").exit_code == 0
    Path("theirs").mkdir()
    Path("theirs/config.json").write_text("{}")
    one_line_error(run("export", "g.npz", "--format", "hf", "--out", "theirs"),
                   "theirs/config.json exists and was not written by rustyflow")
    assert Path("theirs/config.json").read_text() == "{}"


def test_missing_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf_folder(tmp_path / "hf")
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import fails as if not installed
    one_line_error(run("import", "hf", "hf", "--out", "g.npz"), "optional extra 'hf'",
                   install_command("hf"))


def test_hub_name_offline_says_how_to_pass_a_folder(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    proc = subprocess.run([sys.executable, "-m", "rustyflow_py", "import", "hf", "gpt2",
                           "--out", "g.npz"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "downloading it from the Hugging Face Hub failed" in proc.stderr
    assert f"pass its path: `{command()} import hf ./gpt2`" in proc.stderr


def test_init_from_fine_tunes_an_imported_gpt2(tmp_path: Path) -> None:
    words = corpus_vocab()
    hf_folder(tmp_path / "hf", vocab=words)
    assert run("import", "hf", "hf", "--out", "models/gpt2.npz").exit_code == 0
    result = run("train", "--config", "tiny.env", "--init-from", "models/gpt2.npz",
                 "--max-steps", "2")
    assert result.exit_code == 0, result.output
    assert "Initialised from models/gpt2.npz" in result.output
    assert "using the first 16 of the checkpoint's 32 positions" in result.output
    tuned = checkpoint.Checkpoint("models/tiny-cpu.npz")
    assert tuned.config["EMBED_DIM"] == 32 and tuned.config["NUM_LAYERS"] == 1  # its shape
    assert tuned.meta["train"]["step"] == 2


def test_init_from_loads_the_weights_and_a_fresh_optimizer(tmp_path: Path) -> None:
    hf_folder(tmp_path / "hf", vocab=corpus_vocab())
    assert run("import", "hf", "hf", "--out", "models/gpt2.npz").exit_code == 0
    trainer = Trainer(make_cfg(), quiet, init_from="models/gpt2.npz")
    try:
        loaded = trainer.model.buffer.state_dict()
        source = checkpoint.Checkpoint("models/gpt2.npz").weights
        assert all(np.array_equal(loaded[k], source[k][: loaded[k].shape[0]]) for k in source)
        assert not np.any(trainer.optimizer.m) and trainer.history.pos.step == 0
    finally:
        trainer.parts.lock.release()


def test_init_from_vocabulary_and_shape_mismatches(tmp_path: Path) -> None:
    hf_folder(tmp_path / "ids", size=20)  # no vocab.json: placeholder tokens
    assert run("import", "hf", "ids", "--out", "ids.npz").exit_code == 0
    words = corpus_vocab()
    one_line_error(run("train", "--config", "tiny.env", "--init-from", "ids.npz"),
                   "its vocabulary has 20 tokens", f"this run's (tiny.txt's words) has "
                   f"{len(words)}")
    hf_folder(tmp_path / "swapped", vocab=[words[1], words[0], *words[2:]])
    assert run("import", "hf", "swapped", "--out", "swapped.npz").exit_code == 0
    one_line_error(run("train", "--config", "tiny.env", "--init-from", "swapped.npz"),
                   "differ from id 0 on")
    one_line_error(run("train", "--config", "tiny.env", "--init-from", "ids.npz",
                       "--embed-dim", "64"), "--embed-dim 64 contradicts --init-from ids.npz")
    hf_folder(tmp_path / "good", vocab=words)
    assert run("import", "hf", "good", "--out", "good.npz").exit_code == 0
    one_line_error(run("train", "--config", "tiny.env", "--init-from", "good.npz",
                       "--seq-len", "40", "--batch-size", "2"),
                   "SEQ_LEN=40 needs 40 positions, the checkpoint's model has 32")
    result = run("train", "--config", "tiny.env", "--init-from", "ids.npz", "--resume",
                 "ids.npz")
    assert result.exit_code == 2 and "pass one of them" in result.output
