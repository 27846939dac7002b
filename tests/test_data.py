"""Datasets: tokenization, lookup, checksums, the downloader (local HTTP only) and batching."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import os
import re
import socket
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rustyflow_py import data
from rustyflow_py.cli import main
from rustyflow_py.data import DataError
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.training.config import config
from rustyflow_py.training.evaluation.evaluate import perplexity

REPO = Path(__file__).resolve().parents[1]
# Read at import: the autouse fixture below hides $RUSTYFLOW_DATA_DIR from the tests.
REAL_DATA_DIR = Path(os.environ.get("RUSTYFLOW_DATA_DIR") or REPO.parent / "shared" / "data")
TRAIN = "the cat sat\n \nthe <unk> ran\n"
VALID = "the dog sat\n"
TEST = "cat ran\n \n"


def sha(data_: bytes) -> str:
    return hashlib.sha256(data_).hexdigest()


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real data folder is visible unless a test points at one, and a failing URL is not
    tried again (pooch waits seconds between tries; test_a_failing_url_is_retried tries)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RUSTYFLOW_DATA_DIR", raising=False)
    monkeypatch.setattr(data.download, "RETRIES", 0)


def fixture_source(monkeypatch: pytest.MonkeyPatch, urls: tuple[str, ...] = (),
                   archive: bytes = b"") -> None:
    """Make 'wikitext-2' mean the small fixture texts above (hashes, URLs, archive)."""
    sums = {"train.txt": sha(TRAIN.encode()), "valid.txt": sha(VALID.encode()),
            "test.txt": sha(TEST.encode())}
    source = dataclasses.replace(data.SOURCES["wikitext-2"], sha256=sums,
                                 urls=urls or data.SOURCES["wikitext-2"].urls,
                                 archive_sha256=sha(archive))
    monkeypatch.setitem(data.SOURCES, "wikitext-2", source)


def write_splits(folder: Path, official_names: bool = False) -> None:
    folder.mkdir(parents=True)
    for split, text in zip(data.SPLITS, (TRAIN, VALID, TEST), strict=True):
        name = f"wiki.{split}.tokens" if official_names else f"{split}.txt"
        (folder / name).write_text(text)


def make_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for split, text in zip(data.SPLITS, (TRAIN, VALID, TEST), strict=True):
            zf.writestr(f"wikitext-2/wiki.{split}.tokens", text)
    return buffer.getvalue()


# ------------------------------------------------------------------------- tokenization


def test_tokenize_lines_blank_lines_and_last_line() -> None:
    assert data.tokenize("a b\n \n\nc") == ["a", "b", "<eos>", "<eos>", "<eos>", "c", "<eos>"]
    assert data.tokenize("") == []


def test_corpus_vocab_first_appearance_and_unknown_words(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    write_splits(tmp_path / "d" / "wikitext-2", official_names=True)
    corpus = data.load_corpus("wikitext-2", str(tmp_path / "d"), download=False)
    assert corpus.vocab.itos == ["the", "cat", "sat", "<eos>", "<unk>", "ran"]
    assert corpus.vocab.decode(corpus.train) == data.tokenize(TRAIN)
    assert corpus.vocab.decode(corpus.valid) == ["the", "<unk>", "sat", "<eos>"]
    assert corpus.train.dtype == np.int32 and len(corpus.test) == 4
    assert corpus.source == str(tmp_path / "d" / "wikitext-2") and not corpus.test_is_valid


def test_dataset_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    missing = data.dataset_info("wikitext-2")
    assert missing["found"] is False
    assert missing["looked_in"] == [str(tmp_path / "data" / "wikitext-2"),
                                    str(tmp_path.parent / "shared" / "data" / "wikitext-2")]
    write_splits(tmp_path / "data" / "wikitext-2")
    info = data.dataset_info("wikitext-2")
    assert info["found"] is True and info["checksum_ok"] is True and info["vocab_size"] == 6
    assert info["tokens"] == {"train": 9, "valid": 4, "test": 4}
    assert [f["name"] for f in info["files"]] == ["train.txt", "valid.txt", "test.txt"]
    (tmp_path / "data" / "wikitext-2" / "test.txt").write_text("x\n")
    info = data.dataset_info("wikitext-2")
    assert info["checksum_ok"] is False and "checksum mismatch" in info["error"]


def test_format_info_shows_files_checksums_tokens_and_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    folder = tmp_path / "data" / "wikitext-2"
    folder.mkdir(parents=True)
    (folder / "train.txt").write_text(TRAIN)
    missing = data.dataset_info("wikitext-2")
    text = data.format_info(missing)
    assert "not found" in text
    problem = str(data.info_problem(missing))
    assert f"{folder}  (./data; found train.txt; missing valid.txt, test.txt)" in problem
    assert "Three ways to fix it" in problem and "never downloads" in problem
    (folder / "valid.txt").write_text(VALID)
    (folder / "test.txt").write_text(TEST)
    info = data.dataset_info("wikitext-2")
    text = data.format_info(info)
    assert data.info_problem(info) is None
    assert f"location  {folder}" in text
    assert re.search(rf"train.txt +{len(TRAIN.encode())} bytes  sha256 ok", text)
    assert "tokens    train 9, valid 4, test 4" in text and "vocab     6 words" in text
    (folder / "valid.txt").write_text("tampered\n")
    info = data.dataset_info("wikitext-2")
    assert "valid.txt" in data.format_info(info) and "sha256 MISMATCH" in data.format_info(info)
    assert "checksum mismatch in valid.txt" in str(data.info_problem(info))


def test_format_info_of_a_dataset_without_recorded_checksums(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "tinyshakespeare"
    folder.mkdir(parents=True)
    (folder / "input.txt").write_text("".join(f"w{i} w{i + 1}\n" for i in range(30)))
    text = data.format_info(data.dataset_info("tinyshakespeare"))
    assert "sha256 unrecorded" in text
    assert "tokens    train 81, valid 9 (test = valid: no official test split)" in text


def test_cli_data_info_exits_1_when_missing_or_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    runner = CliRunner()
    result = runner.invoke(main, ["data", "info"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not found" in result.stdout and "Error: WikiText-2 (v1, word level) not found" in (
        result.stderr)
    assert "RUSTYFLOW_DATA_DIR" in result.stderr and "Three ways to fix it" in result.stderr
    write_splits(tmp_path / "data" / "wikitext-2")
    result = runner.invoke(main, ["data", "info"])
    assert result.exit_code == 0 and result.stdout.count("sha256 ok") == 3
    result = runner.invoke(main, ["data", "info", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["vocab_size"] == 6
    (tmp_path / "data" / "wikitext-2" / "test.txt").write_text("x\n")
    result = runner.invoke(main, ["data", "info", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout)["checksum_ok"] is False
    assert "checksum mismatch in test.txt" in result.stderr


def test_unknown_word_without_unk_is_an_error() -> None:
    vocab = data.Vocab.build(["a", "b", "<eos>"])
    assert vocab.unk_id is None and vocab.eos_id == 2
    with pytest.raises(DataError, match="'zebra' .* no <unk>"):
        vocab.encode(["a", "zebra"])


def test_vocab_survives_npz_without_pickle(tmp_path: Path) -> None:
    vocab = data.Vocab.build(["héllo", "<eos>", "<unk>", "x"])
    np.savez(tmp_path / "v.npz", vocab=vocab.to_array())
    with np.load(tmp_path / "v.npz", allow_pickle=False) as f:
        again = data.Vocab.from_array(f["vocab"])
    assert again.itos == vocab.itos and again.stoi == vocab.stoi and len(again) == 4
    assert again.encode(["x", "nope"]).tolist() == [3, 2]


def test_text_file_dataset_splits_90_10(tmp_path: Path) -> None:
    path = tmp_path / "poems.txt"
    path.write_text("".join(f"w{i} w{i + 1}\r\n" for i in range(30)))  # 90 tokens
    corpus = data.load_corpus(str(path))
    assert (len(corpus.train), len(corpus.valid)) == (81, 9)
    assert corpus.test is corpus.valid and corpus.test_is_valid and corpus.name == "poems"
    assert corpus.vocab.decode(corpus.valid[-3:]) == ["w29", "w30", "<eos>"]


def test_text_file_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("ok line\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin.txt is not UTF-8 .*0xe9 at offset 11 \(line 2\)"):
        data.load_corpus(str(path))


def test_checksum_mismatch_on_load_is_an_error(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    write_splits(tmp_path / "data" / "wikitext-2")
    (tmp_path / "data" / "wikitext-2" / "valid.txt").write_text("tampered\n")
    with pytest.raises(DataError, match="checksum mismatch: .*valid.txt"):
        data.load_corpus("wikitext-2", download=False)


def test_resolution_order_and_folder_named_like_the_dataset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    write_splits(tmp_path / "env" / "wikitext-2")
    write_splits(tmp_path / "data" / "wikitext-2")
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(tmp_path / "env"))
    assert data.load_corpus("wikitext-2").source == str(tmp_path / "env" / "wikitext-2")
    direct = str(tmp_path / "data" / "wikitext-2")
    assert data.load_corpus("wikitext-2", direct).source == direct
    assert set(data.SOURCES) == set(config.BUILTIN_DATASETS)


def test_partial_folders_list_found_and_missing_files(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    shared, local = tmp_path / "shared" / "wikitext-2", tmp_path / "data" / "wikitext-2"
    shared.mkdir(parents=True)
    local.mkdir(parents=True)
    (shared / "train.txt").write_text(TRAIN)
    (local / "wiki.valid.tokens").write_text(VALID)
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(tmp_path / "shared"))
    with pytest.raises(DataError) as err:
        data.load_corpus("wikitext-2", download=False)
    message = str(err.value)
    assert (f"{shared}  ($RUSTYFLOW_DATA_DIR; found train.txt; missing valid.txt, test.txt)"
            in message)
    assert f"{local}  (./data; found wiki.valid.tokens; missing train.txt, test.txt)" in message


def test_mistyped_data_dir_is_reported_and_never_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch)
    downloads: list[Path] = []

    def offline(dataset: str, dest: Path, *args: object, **kwargs: object) -> Path:
        downloads.append(dest)
        raise DataError("no network in tests")

    monkeypatch.setattr(data.download, "download_dataset", offline)
    typo = tmp_path / "sahred"
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(typo))
    with pytest.raises(DataError) as err:
        data.load_corpus("wikitext-2")
    assert f"RUSTYFLOW_DATA_DIR={typo} does not exist" in str(err.value)
    assert not typo.exists() and downloads == []
    with pytest.raises(DataError, match="DATA_DIR=.*dtaa does not exist"):
        data.default_download_dir(tmp_path / "dtaa")
    assert not (tmp_path / "dtaa").exists()
    monkeypatch.delenv("RUSTYFLOW_DATA_DIR")
    assert data.default_download_dir() == tmp_path / "data"  # ./data alone is created
    assert (tmp_path / "data").is_dir()


def test_real_wikitext2_counts() -> None:
    folder = REAL_DATA_DIR
    if not (folder / "wikitext-2" / "train.txt").is_file():
        pytest.skip(f"WikiText-2 not found under {folder} (set RUSTYFLOW_DATA_DIR)")
    corpus = data.load_corpus("wikitext-2", str(folder), download=False)
    assert len(corpus.vocab) == 33278
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (2088628, 217646, 245569)
    assert corpus.vocab.itos[:2] == ["<eos>", "="] and corpus.vocab.unk_id is not None


# ---------------------------------------------------------------------------- download


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A local HTTP server on 127.0.0.1 serving `routes`; '/short/...' lies about its length;
    a route with a 'fail-once:<path>' entry answers 503 the first time."""
    routes: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = routes.get(self.path.removeprefix("/short"))
            if body is None or routes.pop(f"fail-once:{self.path}", None) is not None:
                self.send_error(404 if body is None else 503)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2] if self.path.startswith("/short") else body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", routes
    httpd.shutdown()
    httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/wikitext-2-v1.zip"


def test_download_good_zip_installs_verified_files(
        tmp_path: Path, server: tuple[str, dict[str, bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    base, routes = server
    archive = make_zip()
    routes["/w.zip"] = archive
    fixture_source(monkeypatch, urls=(closed_port_url(), f"{base}/w.zip"), archive=archive)
    (tmp_path / "dl").mkdir()  # DATA_DIR must exist: only ./data is ever created
    corpus = data.load_corpus("wikitext-2", str(tmp_path / "dl"))  # downloads: mirror works
    target = tmp_path / "dl" / "wikitext-2"
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["wikitext-2"]
    assert sorted(p.name for p in target.iterdir()) == ["test.txt", "train.txt", "valid.txt"]
    assert (target / "train.txt").read_text() == TRAIN and len(corpus.vocab) == 6


@pytest.mark.parametrize(("case", "error"), [
    ("truncated-zip", "not a valid zip archive"),
    ("short-read", "connection closed after"),
    ("zip-checksum", "checksum mismatch"),
    ("file-checksum", "checksum mismatch for train.txt"),
])
def test_download_failures_leave_nothing(tmp_path: Path, server: tuple[str, dict[str, bytes]],
                                         case: str, error: str) -> None:
    base, routes = server
    archive = make_zip()
    served = archive[: len(archive) // 2] if case == "truncated-zip" else archive
    routes["/w.zip"] = served
    url = f"{base}/short/w.zip" if case == "short-read" else f"{base}/w.zip"
    sums = {"archive": "0" * 64 if case == "zip-checksum" else sha(served),
            "train.txt": "1" * 64 if case == "file-checksum" else sha(TRAIN.encode()),
            "valid.txt": sha(VALID.encode()), "test.txt": sha(TEST.encode())}
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match=error):
        data.download_dataset("wikitext-2", dest, [url], checksums=sums)
    assert list(dest.iterdir()) == []


def test_a_failing_url_is_retried(tmp_path: Path, server: tuple[str, dict[str, bytes]]) -> None:
    """pooch tries a URL again after a failure (here a 503) before the next mirror."""
    base, routes = server
    archive = make_zip()
    routes["/w.zip"] = archive
    routes["fail-once:/w.zip"] = b""
    sums = {"archive": sha(archive), "train.txt": sha(TRAIN.encode()),
            "valid.txt": sha(VALID.encode()), "test.txt": sha(TEST.encode())}
    with pytest.raises(DataError, match="503"):
        data.download_dataset("wikitext-2", tmp_path / "once", [f"{base}/w.zip"],
                              checksums=sums, retries=0)
    routes["fail-once:/w.zip"] = b""
    folder = data.download_dataset("wikitext-2", tmp_path / "twice", [f"{base}/w.zip"],
                                   checksums=sums, retries=1)
    assert (folder / "train.txt").read_text() == TRAIN and "fail-once:/w.zip" not in routes
    assert sorted(p.name for p in (tmp_path / "twice").iterdir()) == ["wikitext-2"]


def test_progress_bar_follows_poochs_protocol() -> None:
    """pooch sets `total`, calls update per chunk, then reset, update(total) and close."""
    bar = data.download._Bar("w.zip")
    bar.total = 100
    bar.update(60)
    task = bar._bar.tasks[0]
    assert (task.description, task.total, task.completed) == ("w.zip", 100, 60)
    bar.reset()
    bar.update(100)
    assert task.completed == 100
    bar.close()
    assert bar._bar is None


def test_offline_message_lists_places_and_fixes(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_source(monkeypatch, urls=(closed_port_url(),))
    monkeypatch.setenv("RUSTYFLOW_DATA_DIR", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()  # a named folder must exist
    (tmp_path / "mine").mkdir()
    with pytest.raises(DataError) as err:
        data.load_corpus("wikitext-2", str(tmp_path / "mine"))
    message = str(err.value)
    for place in ("mine", "shared", "data"):
        assert str(tmp_path / place / "wikitext-2") in message
    assert "Download failed" in message and "RUSTYFLOW_DATA_DIR" in message
    assert " data download wikitext-2" in message
    assert list((tmp_path / "mine").iterdir()) == []  # the download attempt left nothing


def test_tinyshakespeare_records_and_checks_its_checksum(
        tmp_path: Path, server: tuple[str, dict[str, bytes]]) -> None:
    base, routes = server
    routes["/input.txt"] = ("First Citizen:\nBefore we proceed any further, hear me speak.\n"
                            * 5).encode()
    folder = data.download_dataset("tinyshakespeare", tmp_path, [f"{base}/input.txt"])
    assert (folder / "input.txt.sha256").read_text().split()[0] == sha(routes["/input.txt"])
    corpus = data.load_corpus("tinyshakespeare", str(tmp_path), download=False)
    assert corpus.test_is_valid and len(corpus.train) + len(corpus.valid) == 60
    (folder / "input.txt").write_text("changed\n")
    with pytest.raises(DataError, match="checksum mismatch"):
        data.load_corpus("tinyshakespeare", str(tmp_path), download=False)


# ---------------------------------------------------------------------------- batching


def test_batchify_contiguous_streams_and_remainder() -> None:
    tokens = np.arange(103, dtype=np.int32)
    stream = data.batchify(tokens, 4)
    assert stream.shape == (4, 25)
    assert stream[1].tolist() == list(range(25, 50)) and stream[-1, -1] == 99
    assert np.shares_memory(stream, tokens)
    with pytest.raises(DataError, match="smaller BATCH_SIZE"):
        data.batchify(tokens[:7], 4)


def test_windows_and_targets_shifted_by_one() -> None:
    stream = data.batchify(np.arange(100, dtype=np.int32), 4)  # (4, 25)
    assert data.num_batches(stream, 6) == 4  # 24 // 6: a window needs seq_len + 1 tokens
    x, y = data.get_batch(stream, 3, 6)
    assert x.shape == y.shape == (4, 6)
    assert (y == x + 1).all() and x[0].tolist() == list(range(18, 24))
    assert data.num_batches(stream, 5, partial=True) == 5 and data.num_batches(stream, 5) == 4
    x, y = data.get_batch(stream, 4, 5, partial=True)
    assert x.shape == (4, 4) and y[0, -1] == 24
    with pytest.raises(IndexError):
        data.get_batch(stream, 4, 6)


def test_seed_shape_steps_per_epoch() -> None:
    stream = data.batchify(np.zeros(2088628, dtype=np.int32), 16)
    assert stream.shape == (16, 130539)
    assert data.num_batches(stream, 64) == 2039
    assert data.num_batches(stream, 64, partial=True) == 2040


def nine_thousand_word_corpus(tmp_path: Path) -> data.Corpus:
    path = tmp_path / "notes.txt"
    path.write_text((" ".join(f"w{i}" for i in range(9)) + "\n") * 900)  # 9000 tokens
    return data.load_corpus(str(path))


def test_check_layout_names_the_short_split_and_settings_that_fit(tmp_path: Path) -> None:
    corpus = nine_thousand_word_corpus(tmp_path)
    assert (len(corpus.train), len(corpus.valid)) == (8100, 900)
    with pytest.raises(DataError) as err:
        data.check_layout(corpus, 16, 64)  # the defaults
    message = str(err.value)
    assert "the valid split has 900 tokens" in message and "train split" not in message
    assert "at least 1040 tokens" in message
    assert "BATCH_SIZE=13 or less (at SEQ_LEN=64)" in message
    assert "SEQ_LEN=55 or less (at BATCH_SIZE=16)" in message and "more text" in message
    data.check_layout(corpus, 13, 64)
    data.check_layout(corpus, 16, 55)
    for batch_size, seq_len in ((14, 64), (16, 56)):
        with pytest.raises(DataError):
            data.check_layout(corpus, batch_size, seq_len)


def test_check_layout_checks_every_split() -> None:
    vocab = data.Vocab.build(["a"])
    long, short = np.zeros(100, np.int32), np.zeros(9, np.int32)
    corpus = data.Corpus("x", vocab, long, long, short, "x")
    with pytest.raises(DataError, match=r"^x: the test split has 9 tokens, too few .* least 10"):
        data.check_layout(corpus, 2, 4)
    data.check_layout(dataclasses.replace(corpus, test=np.zeros(10, np.int32)), 2, 4)


def test_check_layout_agrees_with_batchify_and_its_advice_fits() -> None:
    vocab = data.Vocab.build(["a"])
    for n, batch_size, seq_len in itertools.product(range(1, 40), range(1, 6), range(1, 9)):
        tokens = np.zeros(n, np.int32)
        corpus = data.Corpus("x", vocab, tokens, tokens, tokens, "x")
        try:
            fits = data.num_batches(data.batchify(tokens, batch_size), seq_len) >= 1
        except DataError:
            fits = False
        try:
            data.check_layout(corpus, batch_size, seq_len)
        except DataError as err:
            assert not fits, (n, batch_size, seq_len)
            for b, s in re.findall(r"BATCH_SIZE=(\d+) or less \(at SEQ_LEN=(\d+)", str(err)):
                data.check_layout(corpus, int(b), int(s))
            for s, b in re.findall(r"SEQ_LEN=(\d+) or less \(at BATCH_SIZE=(\d+)", str(err)):
                data.check_layout(corpus, int(b), int(s))
        else:
            assert fits, (n, batch_size, seq_len)


def test_perplexity_of_a_too_short_split_is_a_data_error() -> None:
    model = GPT(GPTConfig(10, 8, 1, 2, 8), "cpu", 0)
    stream = data.batchify(np.arange(40, dtype=np.int32) % 10, 8)  # 8 streams of 5 tokens
    with pytest.raises(DataError) as err:
        perplexity(model, stream, 8)
    message = str(err.value)
    assert "split of 40 tokens is too short for BATCH_SIZE=8 streams of SEQ_LEN+1=9" in message
    assert "at least 72" in message and "BATCH_SIZE=4 or less (at SEQ_LEN=8)" in message


def test_check_layout_with_random_offsets_agrees_with_num_batches_and_its_advice_fits() -> None:
    """RANDOM_OFFSETS: the training split must hold a window after the largest offset."""
    vocab = data.Vocab.build(["a"])
    for n, batch_size, seq_len in itertools.product(range(1, 40), range(1, 6), range(1, 9)):
        train, other = np.zeros(n, np.int32), np.zeros(100, np.int32)
        corpus = data.Corpus("x", vocab, train, other, other, "x")
        try:
            fits = data.num_batches(data.batchify(train, batch_size), seq_len,
                                    shifted=True) >= 1
        except DataError:
            fits = False
        try:
            data.check_layout(corpus, batch_size, seq_len, shifted=True)
        except DataError as err:
            assert not fits, (n, batch_size, seq_len)
            if "RANDOM_OFFSETS" in str(err):
                b = int(re.search(r"BATCH_SIZE=(\d+) or less", str(err))[1])
                s = int(re.search(r"SEQ_LEN=(\d+) or less", str(err))[1])
                if n >= 2 * seq_len:
                    data.check_layout(corpus, b, seq_len, shifted=True)
                if n // batch_size >= 2:
                    data.check_layout(corpus, batch_size, s, shifted=True)
        else:
            assert fits, (n, batch_size, seq_len)
