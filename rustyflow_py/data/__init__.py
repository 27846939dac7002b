"""Datasets: the registry of built-in ones, finding or downloading them, checksums, word-level
tokens and the vocabulary, and the language-model batch layout.

One module per job: `registry` (what exists and its sha256s), `lookup` (where it is on disk),
`checksums`, `download` (pooch), `vocab` (tokens), `corpus` (tokenized splits), `load` (all of
it for a name or a path), `info` (`rustyflow data info`), `batching` and `trainable` (can a
corpus train a run at all). This package's namespace is their public API, so callers write
`data.load_corpus(...)`.
"""

from __future__ import annotations

from ..errors import DataError
from .batching import batchify, check_layout, get_batch, layout_advice, num_batches
from .corpus import (
    VALID_FRACTION,
    Corpus,
    corpus_from_splits,
    corpus_from_text,
    read_text,
    split_text,
    word_count,
)
from .download import download_dataset
from .info import dataset_info, format_info, info_problem
from .load import Texts, load_corpus, load_texts
from .lookup import LOOKUP, default_download_dir, search_dirs, where_found
from .registry import SOURCES, SPLITS, Source, unknown_dataset
from .trainable import check_trainable
from .vocab import EOS, UNK, Vocab, tokenize

__all__ = ["EOS", "LOOKUP", "SOURCES", "SPLITS", "UNK", "VALID_FRACTION", "Corpus", "DataError",
           "Source", "Texts", "Vocab", "batchify", "check_layout", "check_trainable",
           "corpus_from_splits", "corpus_from_text", "dataset_info", "default_download_dir",
           "download_dataset", "format_info", "get_batch", "info_problem", "layout_advice",
           "load_corpus", "load_texts", "num_batches", "read_text", "search_dirs", "split_text",
           "tokenize", "unknown_dataset", "where_found", "word_count"]
