"""`rustyflow export --format hf` writes the tokenizer files: a subword run's BPE (trained, or
GPT-2's format) and a word-level run's words load with transformers' AutoTokenizer and encode
text to the ids rustyflow trains on; the files are rustyflow's own and nobody else's is
written over; an import without a tokenizer exports none, and says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the hf extra's tokenizers library")
pytest.importorskip("safetensors", reason="the hf extra: pip install 'rustyflow-py[hf]'")

from test_tokenizers import TEXT, gpt2_folder, here, run  # noqa: E402, F401 (here: a fixture)

from rustyflow_py import data  # noqa: E402
from rustyflow_py.errors import CheckpointError, InteropError  # noqa: E402
from rustyflow_py.interop.hf_export import export_hf  # noqa: E402
from rustyflow_py.interop.hf_import import import_hf  # noqa: E402
from rustyflow_py.training.outputs.checkpoint import Checkpoint  # noqa: E402
from rustyflow_py.training.subword.corpus import checkpoint_tokenizer  # noqa: E402
from rustyflow_py.training.subword.tokenizer import load_gpt2  # noqa: E402

pytestmark = pytest.mark.usefixtures("here")  # in tmp_path, with tiny.txt and its own cache
LINES = TEXT.splitlines(keepends=True)[:40] + ["\n ünïcödé ☃ 日本語 tail\n"]


def _trained(kind: str, tmp_path: Path) -> str:
    """A 2-step tiny run with tokenizer `kind`; its checkpoint's path."""
    extra = ({"TOKENIZER": "bpe", "BPE_VOCAB": 300} if kind == "bpe" else
             {"TOKENIZER": "gpt2", "TOKENIZER_PATH": str(gpt2_folder(tmp_path))} if kind == "gpt2"
             else {})
    run(**extra, MAX_STEPS=2, MODEL_PATH=f"models/{kind}-cpu.npz")  # used as given
    return f"models/{kind}-cpu.npz"


def _export(ckpt: str, out: str = "hf") -> dict:
    said: list[str] = []
    result = export_hf(ckpt, out, said.append)
    result["said"] = said
    return result


@pytest.mark.parametrize("kind", ["bpe", "gpt2"])
def test_subword_export_loads_with_autotokenizer(kind: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="AutoTokenizer is transformers'")
    ckpt = _trained(kind, tmp_path)
    result = _export(ckpt)
    assert {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"} <= set(
        result["files"])
    assert any("tokenizer: " + kind in line for line in result["said"])
    ours = checkpoint_tokenizer(Checkpoint(ckpt).meta, ckpt, "--model")
    assert ours is not None
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for line in LINES:  # rustyflow encodes line by line; so does this
        assert theirs.encode(line, add_special_tokens=False) == ours.encode(line).tolist()
    ids = ours.encode("".join(LINES)).tolist()
    assert theirs.decode(ids) == "".join(LINES)
    assert theirs.eos_token == "<|endoftext|>" and theirs.model_max_length == 16
    assert theirs.convert_ids_to_tokens(theirs.eos_token_id) == "<|endoftext|>"
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert model.config.vocab_size == len(ours)
    # the folder is a GPT-2 tokenizer folder for rustyflow too: the same tokens come back
    # (and for GPT-2's own, the same tokenizer: a trained BPE's <|endoftext|> is an added
    # token, which vocab.json + merges.txt cannot say, so its hash differs)
    again = load_gpt2(tmp_path / "hf")
    np.testing.assert_array_equal(again.encode(TEXT), ours.encode(TEXT))
    assert (again.sha256 == ours.sha256) == (kind == "gpt2")


def test_word_level_export_tokenizes_as_rustyflow(tmp_path: Path) -> None:
    ckpt = _trained("word", tmp_path)
    result = _export(ckpt)
    assert set(result["files"]) == {"config.json", "model.safetensors", "tokenizer.json",
                                    "tokenizer_config.json"}
    assert any("word-level tokenizer.json" in line for line in result["said"])
    vocab = data.Vocab(str(t) for t in Checkpoint(ckpt).vocab)
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    text = "".join(LINES[:-1])  # the words of the training text, every line ended
    expected = vocab.encode(data.tokenize(text)).tolist()
    assert tok.encode(text).ids == expected
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == data.EOS and config["model_max_length"] == 16
    transformers = pytest.importorskip("transformers", reason="AutoTokenizer is transformers'")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert theirs.encode(text, add_special_tokens=False) == expected
    assert theirs.eos_token_id == vocab.eos_id
    assert theirs.decode(expected[:5]) == " ".join(vocab.decode(expected[:5]))


def test_tokenizer_files_are_rustyflows_own(tmp_path: Path) -> None:
    """Someone's tokenizer file stops the export; our own is replaced; a file of ours that
    was edited since is someone's; an export of another kind removes the files it no longer
    writes."""
    bpe, word = _trained("bpe", tmp_path), _trained("word", tmp_path)
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "merges.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(InteropError, match="merges.txt exists and was not written by rustyflow"):
        _export(bpe, "theirs")
    assert (tmp_path / "theirs" / "merges.txt").read_text() == "#version: 0.2\na b\n"
    assert not (tmp_path / "theirs" / "config.json").exists()
    _export(bpe)
    _export(bpe)  # again: its own files
    _export(word)  # another kind: vocab.json and merges.txt were ours and are gone
    assert not any((tmp_path / "hf" / n).exists() for n in ("vocab.json", "merges.txt"))
    listed = json.loads((tmp_path / "hf" / "config.json").read_text())["rustyflow"]["files"]
    assert set(listed) == {"tokenizer.json", "tokenizer_config.json"}
    (tmp_path / "hf" / "tokenizer.json").write_text("{}")
    with pytest.raises(InteropError, match="tokenizer.json exists and was not written"):
        _export(bpe)


def test_import_without_a_tokenizer_exports_none(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the GPT-2 folder is made by it")
    pytest.importorskip("torch")
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                  n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "src", safe_serialization=True)
    import_hf(str(tmp_path / "src"), "models/imported.npz", False, lambda _m: None)
    result = _export("models/imported.npz")
    assert result["files"] == ["config.json", "model.safetensors"]
    assert any("none written" in line for line in result["said"])
    assert not (tmp_path / "hf" / "tokenizer.json").exists()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    assert np.isfinite(loaded.transformer.wte.weight.detach().numpy()).all()


def test_a_subword_checkpoint_without_its_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    ckpt = _trained("bpe", tmp_path)
    (tmp_path / "models" / Checkpoint(ckpt).meta["tokenizer"]["file"]).unlink()
    with pytest.raises(CheckpointError, match="not beside it: copy that file"):
        _export(ckpt)
    assert not (tmp_path / "hf").exists()  # nothing was written
