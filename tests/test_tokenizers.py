"""Subword tokenizers: a byte-level BPE trained here and round-tripped; GPT-2's vocab/merges
format (files built here with `tokenizers`) loaded as TOKENIZER=gpt2; the token cache (hit,
miss, damage); perplexity per word against NumPy; tiny end-to-end runs with both kinds, their
evaluation, generation and resume; and the errors (damaged or missing files, mismatches)."""

from __future__ import annotations

import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the hf extra's tokenizers library")

from rustyflow_py import data  # noqa: E402
from rustyflow_py.errors import (  # noqa: E402
    CheckpointError,
    ConfigError,
    DataError,
    TrainingError,
    install_command,
)
from rustyflow_py.model.generate import Sampling, generate_text  # noqa: E402
from rustyflow_py.model.gpt import build_model  # noqa: E402
from rustyflow_py.reporting.log_parser import read_log  # noqa: E402
from rustyflow_py.reporting.log_writer import format_block  # noqa: E402
from rustyflow_py.reporting.report_page import render_report  # noqa: E402
from rustyflow_py.training.config.config import KEYS, load_config  # noqa: E402
from rustyflow_py.training.evaluation import evaluate  # noqa: E402
from rustyflow_py.training.outputs.checkpoint import Checkpoint  # noqa: E402
from rustyflow_py.training.run.loop import train  # noqa: E402
from rustyflow_py.training.subword import cache  # noqa: E402
from rustyflow_py.training.subword.text import ByteStream  # noqa: E402
from rustyflow_py.training.subword.tokenizer import identity, load_file, load_gpt2, train_bpe  # noqa: E402

_WORDS = "the cat sat on a mat , naïve dogs ran to über parks = @-@ 1 000".split()
TEXT = "".join(" ".join(_WORDS[(i * 7) % 11: (i * 7) % 11 + 4 + i % 5]) + " \n"
               for i in range(400)) + "\n ünïcödé ☃ 日本語 tail without newline"

TINY = {"SEQ_LEN": 16, "BATCH_SIZE": 4, "EMBED_DIM": 32, "NUM_HEADS": 2, "NUM_LAYERS": 1,
        "DEVICE": "cpu", "PROFILE": False, "MAX_STEPS": 3, "LOG_FILE": "log.txt",
        "MODEL_PATH": "models/tiny-cpu.npz", "DATASET": "tiny.txt"}  # as typed: no -cpu added


@pytest.fixture(autouse=True)
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUSTYFLOW_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tiny.txt").write_text(TEXT)
    return tmp_path


def gpt2_folder(root: Path, vocab: int = 300) -> Path:
    """GPT-2's tokenizer files (vocab.json, merges.txt) for a BPE trained on TEXT."""
    folder = root / "gpt2-tok"
    folder.mkdir(exist_ok=True)
    train_bpe(TEXT, vocab).tok.model.save(str(folder))
    return folder


def run(**changes: Any) -> Any:
    cfg, _ = load_config(None, {**TINY, **changes}, environ={})
    return train(cfg, say=lambda _m: None)


# ------------------------------------------------------------------------- tokenizers


def test_bpe_round_trips_text_exactly() -> None:
    tok = train_bpe(TEXT, 300)
    ids = tok.encode(TEXT)
    assert ids.dtype == np.uint32 and 257 <= len(tok) <= 300
    assert int(ids.max()) < len(tok)
    assert len(ids) < len(TEXT.encode())  # merges happened
    assert tok.decode(ids) == TEXT
    assert b"".join(tok.token_bytes(i) for i in ids.tolist()) == TEXT.encode()
    assert tok.tok.decode(ids.tolist()) == TEXT  # the library's own decoder agrees


def test_gpt2_files_load_as_the_same_tokenizer(here: Path) -> None:
    trained = train_bpe(TEXT, 300)
    first, again = load_gpt2(gpt2_folder(here)), load_gpt2(here / "gpt2-tok")
    assert first.sha256 == again.sha256
    assert first.kind == "gpt2" and len(first) == len(trained)
    np.testing.assert_array_equal(first.encode(TEXT), trained.encode(TEXT))
    assert first.decode(first.encode(TEXT)) == TEXT


def test_the_hash_is_the_vocabulary_and_merges_not_the_json_layout() -> None:
    """Library versions write merges as "a b" or as pairs: one tokenizer, one hash."""
    tok = train_bpe(TEXT, 300)
    doc = json.loads(tok.json)
    merges = doc["model"]["merges"]
    doc["model"]["merges"] = [m.split(" ") if isinstance(m, str) else " ".join(m)
                              for m in merges]
    doc["truncation"] = {"max_length": 9}  # a setting that is no part of the BPE
    assert identity(json.dumps(doc), "t") == tok.sha256
    doc["model"]["merges"] = doc["model"]["merges"][:-1]
    assert identity(json.dumps(doc), "t") != tok.sha256


def test_missing_or_damaged_tokenizer_files_are_errors(here: Path) -> None:
    folder = gpt2_folder(here)
    (folder / "merges.txt").unlink()
    with pytest.raises(DataError, match="lacks merges.txt"):
        load_gpt2(folder)
    folder = gpt2_folder(here)
    (folder / "vocab.json").write_text('{"a": 0, ')
    with pytest.raises(DataError, match="not a valid GPT-2 tokenizer"):
        load_gpt2(folder)
    with pytest.raises(DataError, match="is no folder"):
        load_gpt2(here / "nowhere")
    saved = train_bpe(TEXT, 300).save(here / "t.json")
    saved.write_text(saved.read_text()[:500])
    with pytest.raises(DataError, match="is damaged"):
        load_file(saved, "bpe")


def test_without_the_library_the_error_names_the_extra(
        here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers fails
    with pytest.raises(DataError, match=re.escape(install_command("hf"))):
        run(TOKENIZER="bpe", BPE_VOCAB=300)


def test_a_vocabulary_that_is_not_byte_level_is_refused(here: Path) -> None:
    folder = gpt2_folder(here)
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["日本"] = len(vocab)  # not GPT-2's byte alphabet
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(DataError, match="not made of byte-level characters"):
        load_gpt2(folder)


@pytest.mark.parametrize("changes, match", [
    ({"TOKENIZER": "bpe", "BPE_VOCAB": 100}, "BPE_VOCAB='100' is not valid"),
    ({"TOKENIZER": "gpt2"}, "TOKENIZER_PATH, which is empty"),
    ({"TOKENIZER": "sentencepiece"}, "one of word, gpt2, bpe"),
])
def test_bad_tokenizer_settings_are_config_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, {**TINY, **changes}, environ={})


def test_byte_stream_waits_for_a_split_character() -> None:
    out = io.StringIO()
    stream = ByteStream(out, line_start=True)
    snow = "☃".encode()
    stream.write(b"a" + snow[:1])
    assert out.getvalue() == "a"  # half a character is not written
    stream.write(snow[1:])
    stream.end_line()
    assert out.getvalue() == "a☃\n"


# ------------------------------------------------------------------------------ cache


def test_token_cache_hit_miss_and_damage(here: Path) -> None:
    path = cache.token_file(here / "c", "train", "a" * 64, "b" * 64)
    ids = np.arange(1000, dtype=np.uint32) % 700
    calls, warnings = [], []

    def encode() -> np.ndarray:
        calls.append(1)
        return ids

    first = cache.cached_tokens(path, encode, 700, warnings.append)
    hit = cache.cached_tokens(path, encode, 700, warnings.append)
    assert len(calls) == 1 and not warnings  # a miss, then a hit
    assert isinstance(hit, np.memmap) and hit.dtype == np.dtype("<u2")
    np.testing.assert_array_equal(first, ids)
    np.testing.assert_array_equal(hit, ids)
    del first, hit
    raw = bytearray(path.read_bytes())
    raw[cache.HEADER_BYTES + 10] ^= 0xFF  # one flipped byte of the ids
    path.write_bytes(bytes(raw))
    rebuilt = cache.cached_tokens(path, encode, 700, warnings.append)
    assert len(calls) == 2 and "do not match their checksum" in warnings[-1]
    np.testing.assert_array_equal(rebuilt, ids)
    del rebuilt
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    np.testing.assert_array_equal(cache.cached_tokens(path, encode, 700, warnings.append), ids)
    assert len(calls) == 3 and "header says" in warnings[-1]
    big = cache.token_file(here / "c", "valid", "a" * 64, "c" * 64)
    cache.write_tokens(big, np.array([70_000, 1]), 70_001)
    assert cache.read_tokens(big).dtype == np.dtype("<u4")  # type: ignore[union-attr]


# --------------------------------------------------------------------------- per word


def test_per_word_perplexity_matches_numpy() -> None:
    """The evaluator's NLL against a NumPy log-softmax of the model's own logits, and the
    per-word number as exp(total NLL / words)."""
    rng = np.random.default_rng(0)
    cfg, _ = load_config(None, TINY, environ={})
    model = build_model(cfg, 50, "cpu")
    model.training = False
    tokens = rng.integers(0, 50, 4 * 33).astype(np.int32)  # (B=4) x (2 windows of 16 + 1)
    stream = tokens.reshape(4, 33)
    result = evaluate.perplexity(model, stream, 16)
    total, scored = 0.0, 0
    for start in (0, 16):
        x, y = stream[:, start:start + 16], stream[:, start + 1:start + 17]
        logits = model(evaluate.Tensor(np.ascontiguousarray(x))).data.astype(np.float64)
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
            -1, keepdims=True)) - logits.max(-1, keepdims=True)
        total -= np.take_along_axis(logp, y[..., None], -1).sum()
        scored += y.size
    assert result["tokens"] == scored == tokens.size - 4
    assert result["nll"] == pytest.approx(total / scored, rel=1e-5)
    words = 97
    # every token of the split scored but each row's first: the total is scaled to the split
    expect = math.exp(total * tokens.size / scored / words)
    assert evaluate.per_word(result["nll"], tokens.size, words) == pytest.approx(expect,
                                                                                  rel=1e-5)


def test_word_count_and_split_match_the_word_tokenizer() -> None:
    for text in (TEXT, "a b\n\nc", "x\n", ""):
        assert data.word_count(text) == len(data.tokenize(text))
    (train_text, n_train), (valid_text, n_valid) = data.split_text(TEXT)
    words = data.corpus_from_text("t", TEXT, "t")
    assert train_text + valid_text == TEXT
    assert (n_train, n_valid) == (len(words.train), len(words.valid))
    assert data.word_count(valid_text) == n_valid


# ------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("kind", ["bpe", "gpt2"])
def test_tiny_subword_run_reports_both_perplexities(here: Path, kind: str, device: str) -> None:
    changes: dict[str, Any] = {"TOKENIZER": kind, "BPE_VOCAB": 300, "DEVICE": device}
    if kind == "gpt2":
        changes = {"TOKENIZER": kind, "TOKENIZER_PATH": str(gpt2_folder(here)),
                   "DEVICE": device}
    record = run(**changes)
    assert record["status"] == "completed"
    assert record["tokenizer"]["kind"] == kind
    for split in ("val", "test"):
        per_token, per_word = record[f"{split}_ppl"], record[f"{split}_ppl_word"]
        assert math.isfinite(per_token) and math.isfinite(per_word)
        assert per_word > per_token  # more tokens than words: each word costs more
    words = record["tokenizer"]["words"]
    assert words["valid"] == len(data.corpus_from_text("t", TEXT, "t").valid)
    block = format_block(record)
    assert f"Tokenizer: {kind}" in block and "/token" in block and "/word" in block
    logged = read_log("log.txt")[-1]
    assert logged["val_ppl_word"] == pytest.approx(record["val_ppl_word"])
    assert "/word" in render_report([logged])

    path = record["checkpoint"]
    ckpt = Checkpoint(path)
    meta = ckpt.meta["tokenizer"]
    assert meta["kind"] == kind and (here / "models" / meta["file"]).is_file()
    assert len(ckpt.vocab) == record["model"]["vocab"] == meta["vocab"]
    result = evaluate.evaluate_checkpoint(path, "valid", device)
    assert result["perplexity"] == pytest.approx(record["val_ppl"], rel=1e-5)
    assert result["word_perplexity"] == pytest.approx(record["val_ppl_word"], rel=1e-5)

    session = evaluate.open_session(path, device, True, Sampling(0.0), 0, lambda _m: None)
    out = io.StringIO()
    generate_text(session, "the cat über", 12, out, io.StringIO())
    assert out.getvalue().startswith("the cat über") and session.generated == 12


def test_cache_is_reused_and_a_damaged_one_rebuilt(here: Path) -> None:
    run(TOKENIZER="bpe", BPE_VOCAB=300)
    files = sorted((here / "cache" / "tokens").iterdir())
    assert [f.name.split("-")[0] for f in files] == ["train", "valid"]
    stamps = [f.stat().st_mtime_ns for f in files]
    first = run(TOKENIZER="bpe", BPE_VOCAB=300, MODEL_PATH="models/again.npz")
    assert [f.stat().st_mtime_ns for f in files] == stamps  # hits: nothing rewritten
    raw = bytearray(files[1].read_bytes())
    raw[-1] ^= 0x01
    files[1].write_bytes(bytes(raw))
    warnings: list[str] = []
    cfg, _ = load_config(None, {**TINY, "TOKENIZER": "bpe", "BPE_VOCAB": 300,
                                "MODEL_PATH": "models/third.npz"}, environ={})
    third = train(cfg, say=lambda _m: None, warn=warnings.append)
    assert any("is damaged" in w and "rebuilding" in w for w in warnings)
    assert third["val_ppl"] == pytest.approx(first["val_ppl"])  # the same tokens again


def test_tokenizer_mismatches_and_missing_files_are_errors(here: Path) -> None:
    run(TOKENIZER="bpe", BPE_VOCAB=300)
    for changes, match in (({}, "TOKENIZER=bpe, this run asks for TOKENIZER=word"),
                           ({"TOKENIZER": "bpe", "BPE_VOCAB": 280}, "BPE_VOCAB=300")):
        cfg, _ = load_config(None, {**TINY, **changes, "MAX_STEPS": 6}, environ={})
        with pytest.raises(TrainingError, match=match):
            train(cfg, say=lambda _m: None, resume="models/tiny-cpu.npz")
    meta = Checkpoint("models/tiny-cpu.npz").meta["tokenizer"]
    beside = here / "models" / meta["file"]
    beside.write_text(json.dumps({"version": "1.0"}))
    with pytest.raises(CheckpointError, match="is damaged"):
        evaluate.evaluate_checkpoint("models/tiny-cpu.npz", "valid", "cpu")
    beside.unlink()
    with pytest.raises(CheckpointError, match="not beside it"):
        evaluate.open_session("models/tiny-cpu.npz", "cpu", True, Sampling(0.0), 0,
                              lambda _m: None)


def test_subword_run_resumes_with_its_own_tokenizer(here: Path) -> None:
    run(TOKENIZER="bpe", BPE_VOCAB=300)
    cfg, _ = load_config(None, {**TINY, "TOKENIZER": "bpe", "BPE_VOCAB": 300,
                                "MAX_STEPS": 5}, environ={})
    record = train(cfg, say=lambda _m: None, resume="models/tiny-cpu.npz")
    assert record["steps"] == 5 and math.isfinite(record["val_ppl_word"])


def test_an_imported_gpt2_folder_brings_its_tokenizer(here: Path) -> None:
    """A Hugging Face GPT-2 folder with vocab.json and merges.txt imports with its tokenizer
    recorded and written beside the checkpoint, so eval/generate/chat read text through it."""
    pytest.importorskip("safetensors", reason="the hf extra: pip install 'rustyflow-py[hf]'")
    from rustyflow_py.interop.hf_export import export_hf
    from rustyflow_py.interop.hf_import import import_hf
    from rustyflow_py.training.subword.corpus import checkpoint_tokenizer

    folder = gpt2_folder(here)
    run(TOKENIZER="gpt2", TOKENIZER_PATH=str(folder), MAX_STEPS=2,
        MODEL_PATH="models/sub-cpu.npz")
    export_hf("models/sub-cpu.npz", "hf", lambda _m: None)
    for name in ("vocab.json", "merges.txt"):
        (here / "hf" / name).write_bytes((folder / name).read_bytes())
    import_hf("hf", "models/imported.npz", False, lambda _m: None)
    meta = Checkpoint("models/imported.npz").meta
    assert meta["tokenizer"]["kind"] == "gpt2"
    tok = checkpoint_tokenizer(meta, "models/imported.npz", "--model")
    assert tok is not None and tok.sha256 == load_gpt2(folder).sha256
    assert (here / "models" / tok.file_name).is_file()
    assert tok.decode(tok.encode(TEXT[:200])) == TEXT[:200]
