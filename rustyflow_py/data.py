"""Datasets: find or download them, verify checksums, tokenize word by word, and batch.

Checksums are checked on every load (cheap next to tokenizing) because perplexities are only
comparable across runs and with the literature when the text is byte-for-byte the official one.
Downloads go to a temporary folder next to the destination and are moved into place file by file
with os.replace, so a visible file is always complete and verified.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import http.client
import os
import re
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError, command

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")
VALID_FRACTION = 0.1  # held-out share for datasets without official splits


@dataclass(frozen=True)
class Source:
    """Where a built-in dataset lives locally, where it is downloaded from, how it is checked.

    `files` are the canonical local names; `aliases` maps each to the official file name,
    which is also accepted locally and is the member's base name inside the archive.
    A file with no entry in `sha256` is trusted on first use: its hash is recorded in a
    `<file>.sha256` sidecar and checked on every later load.
    """

    title: str
    folder: str
    files: tuple[str, ...]
    urls: tuple[str, ...]
    archive_sha256: str | None = None  # None: the URL serves the single file itself
    aliases: dict[str, str] = field(default_factory=dict)
    sha256: dict[str, str] = field(default_factory=dict)


SOURCES: dict[str, Source] = {
    "wikitext-2": Source(
        title="WikiText-2 (v1, word level)",
        folder="wikitext-2",
        files=("train.txt", "valid.txt", "test.txt"),
        urls=("https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
              "https://wikitext.smerity.com/wikitext-2-v1.zip"),
        archive_sha256="92675f1d63015c1c8b51f1656a52d5bdbc33aafa60cc47a218a66e7ee817488c",
        aliases={f"{s}.txt": f"wiki.{s}.tokens" for s in SPLITS},
        sha256={
            "train.txt": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
            "valid.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
            "test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        },
    ),
    "tinyshakespeare": Source(
        title="Tiny Shakespeare",
        folder="tinyshakespeare",
        files=("input.txt",),
        urls=("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
              "tinyshakespeare/input.txt",),
    ),
}


# ----------------------------------------------------------------------------- tokens


def tokenize(text: str) -> list[str]:
    """Whitespace tokens with <eos> after every line (a blank line is just <eos>)."""
    tokens = text.replace("\n", f" {EOS} ").split()
    if text and not text.endswith("\n"):  # the last line ends without a newline
        tokens.append(EOS)
    return tokens


class Vocab:
    """Word <-> id tables; ids follow first appearance, the WikiText-2 convention."""

    def __init__(self, itos: Iterable[str]) -> None:
        self.itos: list[str] = list(itos)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise DataError("vocabulary has duplicate words: the checkpoint is damaged")

    @classmethod
    def build(cls, tokens: Iterable[str]) -> Vocab:
        """Vocabulary of `tokens` in first-appearance order."""
        return cls(dict.fromkeys(tokens))

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def unk_id(self) -> int | None:
        """Id of <unk> (unknown words map to it), or None when the vocabulary has none."""
        return self.stoi.get(UNK)

    @property
    def eos_id(self) -> int | None:
        """Id of <eos>, the end-of-line token, or None when the vocabulary has none."""
        return self.stoi.get(EOS)

    def encode(self, words: Sequence[str]) -> np.ndarray:
        """int32 ids; unknown words become <unk>, or a DataError when there is no <unk>."""
        ids = np.fromiter(map(self.stoi.get, words, repeat(-1)), np.int32, count=len(words))
        missing = np.flatnonzero(ids < 0)
        if missing.size:
            if self.unk_id is None:
                first = int(missing[0])
                raise DataError(f"word {words[first]!r} (token {first}) is not in the "
                                f"vocabulary, which has no {UNK} to stand for it")
            ids[missing] = self.unk_id
        return ids

    def decode(self, ids: Any) -> list[str]:
        """Words of a sequence of ids (a list, NumPy or CuPy array)."""
        return [self.itos[i] for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]

    def to_array(self) -> np.ndarray:
        """The words as a fixed-width str array, storable in .npz without pickle."""
        return np.array(self.itos, dtype=np.str_)

    @classmethod
    def from_array(cls, array: np.ndarray) -> Vocab:
        """Inverse of to_array."""
        return cls(str(w) for w in array.tolist())


@dataclass
class Corpus:
    """A tokenized dataset. When the dataset has no official test split, `test_is_valid` is
    True and `test` is the same array as `valid` (a 90/10 split of the token stream)."""

    name: str
    vocab: Vocab
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    source: str
    test_is_valid: bool = False
    # a subword corpus: the words of each split's text (per-word perplexity divides by them)
    # and its tokenizer (also its `vocab`); None for words
    words: dict[str, int] | None = None
    tokenizer: Any = None


def read_text(path: Path, data: bytes | None = None) -> str:
    """Decode a file as UTF-8 (no BOM, '\\r\\n' -> '\\n'); DataError names the bad byte."""
    raw = path.read_bytes() if data is None else data
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise DataError(f"{path} is not UTF-8 text: byte 0x{raw[err.start]:02x} at offset "
                        f"{err.start} (line {line}); convert it first, e.g. "
                        f"`iconv -f latin1 -t utf-8`") from None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def corpus_from_splits(name: str, texts: dict[str, str], source: str) -> Corpus:
    """Corpus from train/valid/test texts; the vocabulary comes from train alone."""
    train = tokenize(texts["train"])
    vocab = Vocab.build(train)
    return Corpus(name, vocab, vocab.encode(train), vocab.encode(tokenize(texts["valid"])),
                  vocab.encode(tokenize(texts["test"])), source)


def word_count(text: str) -> int:
    """len(tokenize(text)) without building the list: whitespace words plus one <eos> per line."""
    return len(text.split()) + text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def split_text(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """`text` cut where corpus_from_text cuts its word tokens 90/10: ((training text, its
    words), (validation text, its words)), so a subword corpus validates on exactly the
    words a word-level one does. The word counts are the word-level token counts."""
    starts = [m.start() for m in re.finditer(r"\S+|\n", text)]
    if text and not text.endswith("\n"):
        starts.append(len(text))  # the last line's <eos>
    cut = round(len(starts) * (1 - VALID_FRACTION))
    if cut < 2 or len(starts) - cut < 2:
        raise DataError(f"the text has only {len(starts)} tokens: too few to split 90/10 into "
                        f"training and validation text")
    return (text[: starts[cut]], cut), (text[starts[cut]:], len(starts) - cut)


def corpus_from_text(name: str, text: str, source: str) -> Corpus:
    """Corpus from one text: the token stream is split 90/10 into train/valid, test = valid.

    The vocabulary covers the whole text, so validation words always have an id.
    """
    tokens = tokenize(text)
    cut = round(len(tokens) * (1 - VALID_FRACTION))
    if cut < 2 or len(tokens) - cut < 2:
        raise DataError(f"{source} has only {len(tokens)} tokens: too few to split 90/10 into "
                        f"training and validation text")
    vocab = Vocab.build(tokens)
    ids = vocab.encode(tokens)
    valid = ids[cut:]
    return Corpus(name, vocab, ids[:cut], valid, valid, source, test_is_valid=True)


# ------------------------------------------------------------------------ finding files


LOOKUP = "--data-dir / DATA_DIR, then $RUSTYFLOW_DATA_DIR, ./data and ../shared/data"


def search_dirs(data_dir: str | os.PathLike[str] | None = None) -> list[tuple[Path, str]]:
    """Data folders in lookup order, each with where it came from (for messages): DATA_DIR
    (the --data-dir flag or the config key), $RUSTYFLOW_DATA_DIR, ./data, ../shared/data.

    A DATA_DIR that was given but does not exist is a DataError, never a fallback to the
    other folders: the run would otherwise silently read data from somewhere else."""
    if data_dir and not Path(data_dir).is_dir():
        raise DataError(f"DATA_DIR={data_dir} does not exist (or is no folder): fix the path "
                        f"(--data-dir or DATA_DIR), or leave it empty to look in "
                        f"$RUSTYFLOW_DATA_DIR, ./data and ../shared/data")
    candidates = [(data_dir, "DATA_DIR"), (os.environ.get("RUSTYFLOW_DATA_DIR"),
                                           "$RUSTYFLOW_DATA_DIR"), ("data", "./data"),
                  (os.path.join("..", "shared", "data"), "../shared/data")]
    found: dict[Path, str] = {}
    for folder, label in candidates:
        if folder:
            found.setdefault(Path(os.path.abspath(folder)), label)
    return list(found.items())


def unknown_dataset(dataset: str) -> DataError:
    """A name that is neither a built-in dataset nor a file: a did-you-mean, no download."""
    hint = difflib.get_close_matches(dataset, SOURCES, n=1)
    return DataError(f"unknown dataset '{dataset}': expected {' or '.join(SOURCES)}, or the "
                     f"path of a UTF-8 text file{f' (did you mean {hint[0]}?)' if hint else ''}")


def _folders(source: Source, dirs: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """Folders that may hold the files: <dir>/<folder>, or <dir> itself if it is named so."""
    out = []
    for folder, label in dirs:
        out.append((folder / source.folder, label))
        if folder.name == source.folder:
            out.append((folder, label))
    return out


def _locate(source: Source, folder: Path) -> dict[str, Path | None]:
    """Each file of `source` in `folder` (canonical or official name), None where absent."""
    paths = {}
    for name in source.files:
        hits = [folder / n for n in (name, source.aliases.get(name)) if n]
        paths[name] = next((p for p in hits if p.is_file()), None)
    return paths


def _find(source: Source, dirs: list[tuple[Path, str]]) -> dict[str, Path] | None:
    """The first folder holding every file (canonical or official name), or None."""
    for folder, _ in _folders(source, dirs):
        paths = _locate(source, folder)
        if all(paths.values()):
            return paths  # type: ignore[return-value]
    return None


def _searched(source: Source, dirs: list[tuple[Path, str]]) -> list[dict[str, Any]]:
    """Every folder looked in, whether its data folder exists, and which files it holds.

    A folder with some files but not all (say train.txt alone) is the usual half-finished
    copy; naming what is there and what is not saves guessing why it was "not found".
    """
    out = []
    for root, label in dirs:
        for folder, _ in _folders(source, [(root, label)]):
            paths = _locate(source, folder)
            out.append({"folder": str(folder), "from": label, "root": str(root),
                        "exists": root.is_dir(),
                        "found": [p.name for p in paths.values() if p],
                        "missing": [name for name, p in paths.items() if p is None]})
    return out


def _searched_line(entry: dict[str, Any]) -> str:
    """One folder of the "looked in" list, with why nothing usable was there."""
    notes = [entry["from"]]
    if not entry["exists"]:
        notes.append(f"{entry['root']} does not exist")
    elif entry["found"]:
        notes.append(f"found {', '.join(entry['found'])}; missing {', '.join(entry['missing'])}")
    return f"  {entry['folder']}  ({'; '.join(notes)})"


def where_found(dataset: str, data_dir: str | None = None) -> str:
    """Where `dataset` would be read from, in words, without reading it (for banners)."""
    source = SOURCES.get(dataset)
    if source is None:
        return str(Path(dataset).absolute()) if Path(dataset).is_file() else "not found"
    dirs = search_dirs(data_dir)
    paths = _find(source, dirs)
    if paths is None:
        return "not found locally: train downloads it into ./data"
    folder = next(iter(paths.values())).parent
    label = next((lbl for f, lbl in _folders(source, dirs) if f == folder), "")
    return f"{folder}" + (f" (from {label})" if label else "")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected_sha(source: Source, name: str, path: Path) -> str | None:
    """Official hash, else the trust-on-first-use sidecar's, else None."""
    sidecar = path.with_name(path.name + ".sha256")
    if name in source.sha256:
        return source.sha256[name]
    return sidecar.read_text().split()[0] if sidecar.is_file() else None


def _read_verified(source: Source, name: str, path: Path) -> str:
    data = path.read_bytes()
    digest, expected = _sha256(data), _expected_sha(source, name, path)
    if expected is None:
        with contextlib.suppress(OSError):  # a read-only copy just stays unrecorded
            path.with_name(path.name + ".sha256").write_text(f"{digest}  {path.name}\n")
    elif digest != expected:
        raise DataError(
            f"checksum mismatch: {path} has sha256 {digest}, expected {expected} "
            f"({source.title}); the file is damaged or a different version. Delete it and run "
            f"`{command()} data download`, or to train on your own text set DATASET=<path>")
    return read_text(path, data)


def _missing(dataset: str, source: Source, dirs: list[tuple[Path, str]], why: str) -> DataError:
    """The one "not found" error: what is needed, every folder looked in, why nothing was
    downloaded, and the three ways to fix it."""
    names = ", ".join(source.files)
    official = ", ".join(source.aliases[n] for n in source.files if n in source.aliases)
    looked = "\n".join(_searched_line(entry) for entry in _searched(source, dirs))
    return DataError(
        f"{source.title} not found: need {names}"
        f"{f' (or the official {official})' if official else ''} in one of:\n{looked}\n"
        f"{why}\nThree ways to fix it:\n"
        f"  1. copy the files into one of those folders (e.g. ./data/{source.folder}/);\n"
        f"  2. point at a folder holding {source.folder}/: --data-dir DIR, DATA_DIR=DIR in "
        f"config.env, or the environment variable RUSTYFLOW_DATA_DIR=DIR;\n"
        f"  3. download it: `{command()} data download {dataset}` (from {source.urls[0]}, "
        f"checksums verified; on an offline machine, run it elsewhere and copy ./data over).")


def default_download_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The first resolution folder that exists (./data is created) and is writable.

    DATA_DIR and $RUSTYFLOW_DATA_DIR are never created: a typo there would otherwise become a
    new folder holding the download while the intended one stays empty, so a missing one is a
    DataError naming it.
    """
    dirs = search_dirs(data_dir)
    for folder, label in dirs:
        if folder == Path("data").absolute():
            with contextlib.suppress(OSError):
                folder.mkdir(parents=True, exist_ok=True)
        elif not folder.exists() and label == "../shared/data":
            continue  # a default that is absent here: nothing was asked of it
        elif not folder.exists():
            raise DataError(f"{label.lstrip('$')}={folder} does not exist: fix the path, or "
                            f"create the folder first (mkdir -p {folder}); it is not created "
                            f"for you, so that a typo cannot become a new data folder")
        if folder.is_dir() and os.access(folder, os.W_OK):
            return folder
    raise DataError("no writable data folder among: " + ", ".join(str(d) for d, _ in dirs))


def _download(dataset: str, data_dir: str | None, download: bool) -> Path:
    """Download `dataset` into default_download_dir, or the not-found error saying why not."""
    source, dirs = SOURCES[dataset], search_dirs(data_dir)
    if not download:
        raise _missing(dataset, source, dirs, "Downloading was not requested.")
    try:
        dest = default_download_dir(data_dir)
    except DataError as err:
        raise _missing(dataset, source, dirs, f"Not downloaded: {err}") from None
    try:
        return download_dataset(dataset, dest)
    except DataError as err:
        raise _missing(dataset, source, dirs, f"Download failed: {err}") from None


@dataclass(frozen=True)
class Texts:
    """A dataset's verified text, before tokenizing: `splits` maps train/valid/test to their
    text, or `text` is the one text of a dataset without official splits."""

    name: str
    source: str
    splits: dict[str, str] | None = None
    text: str | None = None


def load_texts(dataset: str, data_dir: str | None = None, download: bool = True) -> Texts:
    """Find (or download) and verify `dataset`: a built-in name or a text file path."""
    if dataset not in SOURCES:
        path = Path(dataset)
        if not path.is_file():
            raise unknown_dataset(dataset)
        return Texts(path.stem, str(path), text=read_text(path))
    source, dirs = SOURCES[dataset], search_dirs(data_dir)
    paths = _find(source, dirs)
    if paths is None:
        folder = _download(dataset, data_dir, download)
        paths = {name: folder / name for name in source.files}
    texts = {name: _read_verified(source, name, p) for name, p in paths.items()}
    where = str(paths[source.files[0]].parent)
    if len(texts) == 1:
        return Texts(dataset, where, text=texts[source.files[0]])
    return Texts(dataset, where, splits={s: texts[f"{s}.txt"] for s in SPLITS})


def load_corpus(dataset: str, data_dir: str | None = None, download: bool = True) -> Corpus:
    """Find (or download), verify and tokenize `dataset` word by word."""
    texts = load_texts(dataset, data_dir, download)
    if texts.splits is None:
        return corpus_from_text(texts.name, texts.text or "", texts.source)
    return corpus_from_splits(texts.name, texts.splits, texts.source)


def dataset_info(dataset: str, data_dir: str | None = None) -> dict[str, object]:
    """What `rustyflow data info` shows: location, files, checksums, token counts, vocab."""
    source = SOURCES.get(dataset)
    if source is None and not Path(dataset).is_file():
        raise unknown_dataset(dataset)
    dirs = search_dirs(data_dir)
    info: dict[str, object] = {"dataset": dataset, "title": source.title if source else dataset,
                               "looked_in": [str(f) for f, _ in _folders(source, dirs)]
                               if source else [dataset]}
    if source is None:
        paths = {Path(dataset).name: Path(dataset)} if Path(dataset).is_file() else None
    else:
        paths = _find(source, dirs)
    info["found"] = paths is not None
    if paths is None:
        if source is not None:
            info["searched"] = _searched(source, dirs)
            info["problem"] = str(_missing(dataset, source, dirs,
                                           "(`rustyflow data info` only looks, it never "
                                           "downloads.)"))
        return info
    files = []
    for name, path in paths.items():
        digest = _sha256(path.read_bytes())
        expected = _expected_sha(source, name, path) if source else None
        files.append({"name": name, "path": str(path), "bytes": path.stat().st_size,
                      "sha256": digest, "expected_sha256": expected,
                      "checksum_ok": None if expected is None else digest == expected})
    info["location"] = str(next(iter(paths.values())).parent)
    info["files"] = files
    info["checksum_ok"] = all(f["checksum_ok"] is not False for f in files)
    try:
        corpus = load_corpus(dataset, data_dir, download=False)
    except DataError as err:
        info["error"] = str(err)
        return info
    info["vocab_size"] = len(corpus.vocab)
    info["tokens"] = {s: int(getattr(corpus, s).shape[0]) for s in SPLITS}
    info["test_is_valid"] = corpus.test_is_valid
    return info


def info_problem(info: dict[str, Any]) -> str | None:
    """Why a dataset_info() result is not usable as it is (missing, damaged), or None.

    `rustyflow data info` exits 1 with this line, so scripts can test a dataset before a run.
    """
    name = info["dataset"]
    if not info["found"]:
        return str(info.get("problem") or f"{name} not found")
    if info.get("checksum_ok") is False:
        bad = [f["name"] for f in info["files"] if f["checksum_ok"] is False]
        return (f"{name}: checksum mismatch in {', '.join(bad)}; delete the damaged files and "
                f"run `{command()} data download {name}`")
    if "error" in info:
        return f"{name}: {info['error']}"
    return None


def _file_line(entry: dict[str, Any]) -> str:
    """One file of `data info`: name, size and checksum state."""
    state = {True: "sha256 ok", False: f"sha256 MISMATCH (is {entry['sha256'][:12]}..., "
             f"expected {str(entry['expected_sha256'])[:12]}...)",
             None: "sha256 unrecorded"}[entry["checksum_ok"]]
    alias = "" if Path(entry["path"]).name == entry["name"] else f" ({Path(entry['path']).name})"
    return f"  {entry['name'] + alias:<32}{entry['bytes']:>14,} bytes  {state}"


def format_info(info: dict[str, Any]) -> str:
    """dataset_info() as lines for a terminal: where, files, checksums, tokens, vocabulary."""
    lines = [f"{info['title']} ({info['dataset']})"]
    if not info["found"]:
        lines.append("  not found (the error below lists where it looked)")
        return "\n".join(lines)
    lines.append(f"  location  {info['location']}")
    lines += [_file_line(entry) for entry in info["files"]]
    if "tokens" in info:
        tokens = info["tokens"]
        counts = [f"{split} {tokens[split]:,}" for split in SPLITS
                  if not (split == "test" and info.get("test_is_valid"))]
        same = " (test = valid: no official test split)" if info.get("test_is_valid") else ""
        lines.append(f"  tokens    {', '.join(counts)}{same}")
        lines.append(f"  vocab     {info['vocab_size']:,} words")
    if "error" in info:
        lines.append(f"  error     {info['error']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- download


@contextlib.contextmanager
def _progress(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on an interactive stderr; nothing when output is a file or pipe."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    with Progress("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _fetch(url: str, out: Path, timeout: float) -> str:
    """Stream `url` into `out`; return its sha256."""
    digest, received = hashlib.sha256(), 0
    with urllib.request.urlopen(url, timeout=timeout) as resp, open(out, "wb") as f, \
            _progress(Path(url).name, resp.length) as advance:
        total = resp.length
        while chunk := resp.read(1 << 16):
            f.write(chunk)
            digest.update(chunk)
            received += len(chunk)
            advance(len(chunk))
    if total is not None and received != total:  # read(n) does not report a cut connection
        raise OSError(f"connection closed after {received} of {total} bytes")
    return digest.hexdigest()


def _fetch_first(urls: Sequence[str], out: Path, expected: str | None, timeout: float) -> str:
    """Download from the first URL that works and matches `expected`; return the URL."""
    errors = []
    for url in urls:
        print(f"INFO: downloading {url}", file=sys.stderr)
        try:
            digest = _fetch(url, out, timeout)
        except (OSError, ValueError, http.client.HTTPException) as err:
            errors.append(f"{url}: {err}")
            continue
        if expected is None or digest == expected:
            return url
        errors.append(f"{url}: checksum mismatch (sha256 {digest}, expected {expected}); "
                      f"discarded")
    out.unlink(missing_ok=True)
    raise DataError("no URL worked: " + "; ".join(errors))


def _extract(archive: Path, url: str, source: Source, dest: Path) -> None:
    """Copy the dataset's members (matched by official base name) out of a zip into dest."""
    try:
        with zipfile.ZipFile(archive) as zf:
            members = {Path(m).name: m for m in zf.namelist()}
            for name in source.files:
                member = members.get(source.aliases.get(name, name))
                if member is None:
                    raise DataError(f"{url}: the archive has no {source.aliases.get(name, name)}")
                with zf.open(member) as src, open(dest / name, "wb") as out:
                    shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, EOFError) as err:
        raise DataError(f"{url}: not a valid zip archive ({err}); discarded") from None


def download_dataset(dataset: str, dest_dir: str | os.PathLike[str],
                     urls: Sequence[str] | None = None, *,
                     checksums: dict[str, str] | None = None, timeout: float = 30.0) -> Path:
    """Download, verify and install `dataset` into <dest_dir>/<folder>; return that folder.

    `urls` replaces the official list (the mirror is tried after the primary); `checksums`
    overrides expected sha256s by local file name, "archive" for the zip. Nothing is left
    behind on failure: work happens in a temporary folder inside dest_dir.
    """
    source = SOURCES.get(dataset)
    if source is None:
        raise unknown_dataset(dataset)
    expected = {**source.sha256, "archive": source.archive_sha256, **(checksums or {})}
    target = Path(dest_dir) / source.folder
    Path(dest_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{source.folder}-download-", dir=dest_dir))
    try:
        if source.archive_sha256 is None:
            url = _fetch_first(urls or source.urls, tmp / source.files[0],
                               expected.get(source.files[0]), timeout)
        else:
            url = _fetch_first(urls or source.urls, tmp / "archive", expected["archive"], timeout)
            _extract(tmp / "archive", url, source, tmp)
        for name in source.files:
            digest = _sha256((tmp / name).read_bytes())
            if expected.get(name) is None:
                (tmp / f"{name}.sha256").write_text(f"{digest}  {name}\n")
            elif digest != expected[name]:
                raise DataError(f"{url}: checksum mismatch for {name} (sha256 {digest}, "
                                f"expected {expected[name]}); discarded")
        target.mkdir(exist_ok=True)
        for path in sorted(tmp.iterdir()):
            if path.name != "archive":
                os.replace(path, target / path.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"INFO: {source.title} installed in {target}", file=sys.stderr)
    return target


# --------------------------------------------------------------------------- batching
# Only slicing and reshape on the token arrays, so NumPy and CuPy arrays both work unchanged.


def batchify(tokens: Any, batch_size: int) -> Any:
    """Split a 1-D token stream into `batch_size` contiguous rows (B, N), dropping the rest."""
    n = tokens.shape[0] // batch_size
    if n < 2:
        raise DataError(f"{tokens.shape[0]} tokens cannot fill {batch_size} streams of at "
                        f"least 2 tokens: use a smaller BATCH_SIZE or more text")
    return tokens[: n * batch_size].reshape(batch_size, n)


def num_batches(stream: Any, seq_len: int, partial: bool = False) -> int:
    """Windows per pass: full ones need seq_len + 1 tokens (inputs plus shifted targets).

    partial=True also counts a shorter last window, so evaluation covers every token.
    """
    usable = stream.shape[1] - 1
    return -(-usable // seq_len) if partial else usable // seq_len


def get_batch(stream: Any, i: int, seq_len: int, partial: bool = False) -> tuple[Any, Any]:
    """Window i as (x, y) views of shape (B, T): y is x shifted one token ahead."""
    if not 0 <= i < num_batches(stream, seq_len, partial):
        raise IndexError(f"batch {i} out of range: {num_batches(stream, seq_len, partial)} "
                         f"windows of {seq_len} tokens")
    start = i * seq_len
    end = min(start + seq_len, stream.shape[1] - 1)
    return stream[:, start:end], stream[:, start + 1: end + 1]


def layout_advice(tokens: int, batch_size: int, seq_len: int) -> str:
    """Concrete settings under which `tokens` fill one window per stream, for error messages."""
    fixes = []
    if tokens // (seq_len + 1) >= 1:
        fixes.append(f"BATCH_SIZE={tokens // (seq_len + 1)} or less (at SEQ_LEN={seq_len})")
    if tokens // batch_size - 1 >= 1:
        fixes.append(f"SEQ_LEN={tokens // batch_size - 1} or less (at BATCH_SIZE={batch_size})")
    if not fixes and tokens >= 2:
        fixes.append(f"BATCH_SIZE=1 with SEQ_LEN={tokens - 1} or less")
    return "use " + ", or ".join([*fixes, "more text"])


def check_layout(corpus: Corpus, batch_size: int, seq_len: int) -> None:
    """DataError unless every split fills one window of seq_len + 1 tokens per stream.

    Each split is cut into `batch_size` contiguous streams (batchify) and read in windows of
    seq_len + 1 tokens (inputs plus shifted targets). Checking all splits before the first
    step turns a validation split that is too short into an error now, not after an epoch.
    """
    need = batch_size * (seq_len + 1)
    sizes = {split: int(getattr(corpus, split).shape[0]) for split in SPLITS
             if not (split == "test" and corpus.test_is_valid)}
    short = [f"the {split} split has {n} tokens" for split, n in sizes.items() if n < need]
    if short:
        raise DataError(
            f"{corpus.name}: {' and '.join(short)}, too few for BATCH_SIZE={batch_size} streams "
            f"of SEQ_LEN+1={seq_len + 1} tokens (at least {need} tokens per split); "
            f"{layout_advice(min(sizes.values()), batch_size, seq_len)}")
