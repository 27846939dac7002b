"""A dataset by name or path: found (or downloaded), verified, and tokenized word by word."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from . import download as downloader  # the module; `download` is a flag here
from .checksums import read_verified
from .corpus import Corpus, corpus_from_splits, corpus_from_text, read_text
from .lookup import default_download_dir, find, missing_error, search_dirs
from .registry import SOURCES, SPLITS, unknown_dataset


def _download(dataset: str, data_dir: str | None, download: bool) -> Path:
    """Download `dataset` into default_download_dir, or the not-found error saying why not."""
    source, dirs = SOURCES[dataset], search_dirs(data_dir)
    if not download:
        raise missing_error(dataset, source, dirs, "Downloading was not requested.")
    try:
        dest = default_download_dir(data_dir)
    except DataError as err:
        raise missing_error(dataset, source, dirs, f"Not downloaded: {err}") from None
    try:
        return downloader.download_dataset(dataset, dest)
    except DataError as err:
        raise missing_error(dataset, source, dirs, f"Download failed: {err}") from None


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
    paths = find(source, dirs)
    if paths is None:
        folder = _download(dataset, data_dir, download)
        paths = {name: folder / name for name in source.files}
    texts = {name: read_verified(source, name, p) for name, p in paths.items()}
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
