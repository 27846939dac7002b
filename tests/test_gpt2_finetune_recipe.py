"""configs/gpt2-finetune-wikitext2.env: the recipe parses as docs/interop.md describes it, and
its whole path runs on the CPU: a tiny random GPT-2 saved by transformers (with a GPT-2 format
tokenizer trained here: no Hub access) is imported, fine-tuned with the recipe for 2 steps,
and exported back to a folder transformers loads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the hf extra's tokenizers library")
pytest.importorskip("safetensors", reason="the hf extra: pip install 'rustyflow-py[hf]'")

from helpers import invoke, log_records  # noqa: E402
from test_tokenizers import TEXT, gpt2_folder, here  # noqa: E402, F401 (here: a fixture)

from rustyflow_py.training.config.config import load_config  # noqa: E402
from rustyflow_py.training.outputs.checkpoint import Checkpoint  # noqa: E402
from rustyflow_py.training.subword.tokenizer import load_gpt2  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "gpt2-finetune-wikitext2.env"
pytestmark = pytest.mark.usefixtures("here")  # in tmp_path, with tiny.txt and its own cache


def test_recipe_parses_as_documented() -> None:
    cfg, warnings = load_config(RECIPE, environ={})
    assert warnings == []
    assert (cfg.dataset, cfg.tokenizer, cfg.precision, cfg.seq_len, cfg.batch_size) == (
        "wikitext-2", "gpt2", "bf16", 1024, 16)
    assert cfg.eval_stride == 512 and cfg.learning_rate == 5e-5 and cfg.dropout == 0.1
    text = RECIPE.read_text()
    assert "--init-from models/gpt2.npz" in text and "NUM_LAYERS" not in text.split("\nDATASET")[1]


def test_recipe_fine_tunes_an_imported_gpt2_on_the_cpu(tmp_path: Path) -> None:
    """The recipe, with the CPU's overrides only: fp32 (bf16 is GPU-only), a tiny text, a
    short window (and a stride within it), 2 steps."""
    transformers = pytest.importorskip("transformers", reason="the GPT-2 is made by it")
    torch = pytest.importorskip("torch", reason="transformers runs on torch")
    folder = gpt2_folder(tmp_path)  # vocab.json + merges.txt of a BPE trained on TEXT
    vocab = len(load_gpt2(folder))
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=32, n_embd=32, n_layer=2,
                                  n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder, safe_serialization=True)
    imported = invoke("import", "hf", str(folder), "--out", "models/gpt2.npz")
    assert imported.exit_code == 0, imported.output

    result = invoke("train", "--config", str(RECIPE), "--init-from", "models/gpt2.npz",
                    "--tokenizer-path", str(folder), "--dataset", "tiny.txt", "--device", "cpu",
                    "--precision", "fp32", "--seq-len", "16", "--batch-size", "2",
                    "--eval-stride", "8", "--max-steps", "2", "--no-profile",
                    "--log-file", "log.txt")
    assert result.exit_code == 0, result.output
    record = log_records()[-1]
    assert record["steps"] == 2
    assert math.isfinite(record["test_ppl"]) and math.isfinite(record["test_ppl_word"])
    tuned = Checkpoint("models/gpt2-ft-cpu.npz")
    assert tuned.meta["tokenizer"]["kind"] == "gpt2"
    assert tuned.weights["h.1.mlp.c_fc.weight"].shape == (32, 128)  # the checkpoint's shape
    start = Checkpoint("models/gpt2.npz").weights
    assert not np.array_equal(tuned.weights["h.0.attn.c_attn.weight"],
                              start["h.0.attn.c_attn.weight"])  # it trained

    exported = invoke("export", "--format", "hf", "models/gpt2-ft-cpu.npz", "--out", "out")
    assert exported.exit_code == 0, exported.output
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out")
    assert back.config.n_positions == 16 and back.config.vocab_size == vocab
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    line = TEXT.splitlines(keepends=True)[3]
    assert tok.encode(line) == load_gpt2(folder).encode(line).tolist()

    # the fourth of the README's commands: text from the fine-tuned model
    generated = invoke("generate", "--model", "models/gpt2-ft-cpu.npz", "--prompt",
                       line.split()[0], "--max-tokens", "6", "--seed", "1")
    assert generated.exit_code == 0, generated.output
    # six tokens: the first is timed as start-up, the other five are the decode rate's
    assert "first token" in generated.output, generated.output
    assert "Decoding: 5 tokens in" in generated.output, generated.output
