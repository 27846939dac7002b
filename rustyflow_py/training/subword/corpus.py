"""The corpus of a run, tokenized as its config (or its checkpoint) says, and the tokenizer a
checkpoint was trained with.

TOKENIZER=word is `data.load_corpus`, unchanged. A subword run encodes each split through the
token cache; its corpus also holds the word count of each split's text, so its perplexity can
be given per word too. A resumed or evaluated run takes the tokenizer its checkpoint names
(the file beside it, checked against the hash the checkpoint records), never a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import data
from ...errors import CheckpointError, DataError, TrainingError
from ..config.config import Config
from ..outputs.ownership import checkpoint_meta
from . import cache
from .tokenizer import KINDS, SubwordTokenizer, load_file, load_gpt2, train_bpe

Warn = Callable[[str], None]


def load_corpus(cfg: Config, data_dir: str | None, warn: Warn,
                tokenizer: SubwordTokenizer | None = None) -> data.Corpus:
    """`cfg`'s dataset tokenized by `tokenizer` (None: the one cfg asks for)."""
    if cfg.tokenizer == "word":
        return data.load_corpus(cfg.dataset, data_dir)
    texts = data.load_texts(cfg.dataset, data_dir)
    return subword_corpus(texts, tokenizer or new_tokenizer(cfg, texts, warn), warn)


def corpus_for_run(cfg: Config, warn: Warn, resume: str | None) -> data.Corpus:
    """A training run's corpus: a resumed run's in the tokenizer of its checkpoint."""
    saved = resumed_tokenizer(cfg, resume) if resume else None
    return load_corpus(cfg, cfg.data_dir or None, warn, saved)


def subword_corpus(texts: data.Texts, tokenizer: SubwordTokenizer, warn: Warn) -> data.Corpus:
    """Every split encoded (through the cache), with its word count. A dataset without
    official splits is cut where the word-level corpus cuts it."""
    if texts.splits is None:
        (train, n_train), (valid, n_valid) = data.split_text(texts.text or "")
        parts, words = {"train": train, "valid": valid}, {"train": n_train, "valid": n_valid}
        words["test"] = n_valid
    else:
        parts = texts.splits
        words = {split: data.word_count(text) for split, text in parts.items()}
    folder = cache.cache_dir()
    ids = {split: cache.cached_tokens(
        cache.token_file(folder, split, cache.text_key(text), tokenizer.sha256),
        lambda text=text: tokenizer.encode(text), len(tokenizer), warn)
        for split, text in parts.items()}
    return data.Corpus(texts.name, tokenizer, ids["train"], ids["valid"],  # type: ignore[arg-type]
                       ids.get("test", ids["valid"]), texts.source,
                       test_is_valid=texts.splits is None, words=words, tokenizer=tokenizer)


def new_tokenizer(cfg: Config, texts: data.Texts, warn: Warn) -> SubwordTokenizer:
    """GPT-2's from TOKENIZER_PATH, or a BPE of BPE_VOCAB tokens trained on the training text
    (trained once per text and size: the result is cached)."""
    if cfg.tokenizer == "gpt2":
        return load_gpt2(cfg.tokenizer_path)
    train = texts.splits["train"] if texts.splits else data.split_text(texts.text or "")[0][0]
    path = (cache.cache_dir() / "tokenizers"
            / f"bpe-{cfg.bpe_vocab}-{cache.text_key(train)[:16]}.json")
    if path.is_file():
        try:
            return load_file(path, "bpe")
        except DataError as exc:
            warn(f"WARN: {exc}: training the BPE again")
    tokenizer = train_bpe(train, cfg.bpe_vocab)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(path)
    except OSError as exc:
        warn(f"WARN: cannot cache the trained BPE in {path.parent} ({exc.strerror}); set "
             f"RUSTYFLOW_CACHE_DIR to a writable folder")
    return tokenizer


def checkpoint_tokenizer(meta: dict[str, Any], path: str, flag: str) -> SubwordTokenizer | None:
    """The tokenizer a checkpoint's meta names (None: a word-level checkpoint), loaded from
    beside it and checked against the recorded hash; a CheckpointError when it cannot be."""
    info = meta.get("tokenizer")
    if info is None:
        return None
    if not (isinstance(info, dict) and info.get("kind") in KINDS
            and isinstance(info.get("sha256"), str) and isinstance(info.get("file"), str)):
        raise CheckpointError(f"{flag} {path}: its tokenizer record is damaged; pass another "
                              f"checkpoint")
    file = Path(path).with_name(Path(info["file"]).name)
    if not file.is_file():
        raise CheckpointError(
            f"{flag} {path}: it was trained with the {info['kind']} tokenizer {file.name}, "
            f"which is not beside it: copy that file (written next to the checkpoint by "
            f"`rustyflow train`) into {file.parent}")
    try:
        return load_file(file, info["kind"], info["sha256"])
    except DataError as exc:
        raise CheckpointError(f"{flag} {path}: {exc}") from None


def resumed_tokenizer(cfg: Config, path: str) -> SubwordTokenizer | None:
    """The tokenizer of the checkpoint a run resumes, which must be the one `cfg` asks for
    (a TrainingError says which setting differs). None for words, and for a file that is no
    checkpoint (the resume itself then says what is wrong with it)."""
    meta = checkpoint_meta(path)
    if meta is None:
        return None
    info = meta.get("tokenizer")
    kind = info.get("kind") if isinstance(info, dict) else "word"
    if kind != cfg.tokenizer:
        raise TrainingError(f"--resume {path}: the checkpoint was trained with TOKENIZER={kind}, "
                            f"this run asks for TOKENIZER={cfg.tokenizer}: resume with "
                            f"TOKENIZER={kind}")
    saved = checkpoint_tokenizer(meta, path, "--resume")
    if saved is None:
        return None
    config = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    if kind == "bpe" and config.get("BPE_VOCAB", cfg.bpe_vocab) != cfg.bpe_vocab:
        raise TrainingError(f"--resume {path}: the checkpoint's BPE has BPE_VOCAB="
                            f"{config['BPE_VOCAB']}, this run asks for {cfg.bpe_vocab}: resume "
                            f"with BPE_VOCAB={config['BPE_VOCAB']}")
    if kind == "gpt2" and cfg.tokenizer_path and load_gpt2(cfg.tokenizer_path).sha256 != \
            saved.sha256:
        raise TrainingError(f"--resume {path}: TOKENIZER_PATH={cfg.tokenizer_path} holds "
                            f"another tokenizer than the one the checkpoint was trained with "
                            f"({saved.file_name}): point it at the same vocab.json/merges.txt")
    return saved
