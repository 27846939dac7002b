"""A byte-level BPE through the `tokenizers` library: GPT-2's from its vocab.json/merges.txt,
or one trained on a dataset's training split. The library is the `hf` extra, imported only here.

A tokenizer is identified by the sha256 of its vocabulary, merges and added tokens: the hash
keys the token caches and is stored in every checkpoint trained with it, so a run, its
evaluation and its generation provably use the same one. Next to a checkpoint it is the file
`tokenizer-<hash12>.json` (the name carries the hash, so two runs never fight over one file).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError, install_command
from ..outputs.writing import write_atomically

EXTRA = "hf"
KINDS = ("gpt2", "bpe")  # the subword kinds; TOKENIZER=word is data/vocab.py's
END_OF_TEXT = "<|endoftext|>"  # GPT-2's one special token; a trained BPE has it too
GPT2_FILES = ("vocab.json", "merges.txt")


def library() -> Any:
    """The `tokenizers` module, or a DataError naming the extra that installs it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"TOKENIZER=gpt2 or bpe needs the `tokenizers` library: "
                        f"{install_command(EXTRA)}, or use TOKENIZER=word") from None
    return tokenizers


class SubwordTokenizer:
    """A loaded byte-level BPE: encode text to ids, decode ids to bytes, and its identity.

    It doubles as the corpus vocabulary (`len`, `itos`, `to_array`), so the checkpoint stores
    its token strings where a word-level run stores its words.
    """

    def __init__(self, kind: str, tokenizer: Any, origin: str) -> None:
        self.kind, self.tok, self.origin = kind, tokenizer, origin
        self.json: str = tokenizer.to_str()
        self.sha256 = identity(self.json, origin)
        vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise DataError(f"{origin}: the token ids are not 0..{len(vocab) - 1} without "
                            f"gaps: the tokenizer file is damaged")
        self.itos: list[str] = sorted(vocab, key=vocab.__getitem__)
        self.byte_of = _unicode_to_byte()
        specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        odd = next((t for t in self.itos if t not in specials and t != END_OF_TEXT
                    and not set(t) <= self.byte_of.keys()), None)
        if odd is not None:
            raise DataError(f"{origin}: token {odd!r} is not made of byte-level characters: "
                            f"the tokenizer is no byte-level BPE, or its file is damaged")

    # ---- identity ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.itos)

    @property
    def file_name(self) -> str:
        """Its file's name beside a checkpoint."""
        return f"tokenizer-{self.sha256[:12]}.json"

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records about it (meta["tokenizer"])."""
        return {"kind": self.kind, "sha256": self.sha256, "vocab": len(self),
                "file": self.file_name}

    def describe(self) -> str:
        """`bpe (8,192 tokens, sha256 1a2b3c4d5e6f)` for banners and the log block."""
        return f"{self.kind} ({len(self):,} tokens, sha256 {self.sha256[:12]})"

    def to_array(self) -> np.ndarray:
        """The token strings in id order, as a checkpoint's `vocab` member."""
        return np.array(self.itos, dtype=np.str_)

    # ---- text ----------------------------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` (1-D uint32). Encoded line by line, batched (the library runs
        the batch on every core); the bytes come back exactly by `decode`."""
        lines = text.splitlines(keepends=True)
        ids = [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]
        return np.fromiter(itertools.chain.from_iterable(ids), np.uint32,
                           count=sum(map(len, ids)))

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (a special token: its text)."""
        piece = self.itos[token]
        if not set(piece) <= self.byte_of.keys():  # a special token: its text
            return piece.encode()
        return bytes(self.byte_of[c] for c in piece)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a sequence of ids (invalid UTF-8 where a sequence splits a character
        is replaced, as `bytes.decode(errors="replace")` does)."""
        return b"".join(map(self.token_bytes, ids)).decode("utf-8", errors="replace")

    def save_beside(self, checkpoint: str | os.PathLike[str]) -> Path:
        """Write this tokenizer next to `checkpoint` (temp file + rename) unless that file is
        already there with this content; its path."""
        path = Path(checkpoint).with_name(self.file_name)
        with contextlib.suppress(OSError, ValueError, DataError):
            text = path.read_text(encoding="utf-8")
            # the text this tokenizer writes (every save after the first) needs no parsing
            if text == self.json or identity(text, str(path)) == self.sha256:
                return path
        return self.save(path)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this tokenizer's JSON to `path` (temp file + rename)."""
        data = self.json.encode()
        return write_atomically(path, lambda f: f.write(data))


def identity(text: str, origin: str) -> str:
    """The sha256 of what makes a BPE tokenizer: its vocabulary in id order, its merges in
    rank order and its added tokens, from the library's JSON. The JSON itself is not hashed:
    its layout changes between library versions (merges as "a b" or as pairs, new fields),
    which would make one tokenizer two."""
    try:
        doc = json.loads(text)
        model = doc["model"]
        vocab = sorted(model["vocab"].items(), key=lambda item: item[1])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        added = sorted((t["id"], t["content"]) for t in doc.get("added_tokens") or [])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DataError(f"{origin}: not a BPE tokenizer's JSON: the file is damaged") from None
    canonical = json.dumps([vocab, merges, added], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: each of the 256 printable stand-in characters
    to the byte it encodes (the same table the library's ByteLevel pre-tokenizer uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _byte_level(tokenizers: Any, model: Any) -> Any:
    """A GPT-2 style pipeline around a BPE model: byte-level pre-tokenizer and decoder."""
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    return tok


def load_gpt2(folder: str | os.PathLike[str]) -> SubwordTokenizer:
    """GPT-2's tokenizer from a folder holding its vocab.json and merges.txt (as a Hugging
    Face model folder does); DataError for a missing or damaged file."""
    tokenizers = library()
    root = Path(folder)
    if not root.is_dir():
        raise DataError(f"TOKENIZER_PATH={folder} is no folder: point it at a folder holding "
                        f"GPT-2's {' and '.join(GPT2_FILES)}")
    missing = [name for name in GPT2_FILES if not (root / name).is_file()]
    if missing:
        raise DataError(f"TOKENIZER_PATH={folder} lacks {' and '.join(missing)}: TOKENIZER=gpt2 "
                        f"reads GPT-2's {' and '.join(GPT2_FILES)} from that folder")
    try:
        model = tokenizers.models.BPE.from_file(str(root / "vocab.json"),
                                                str(root / "merges.txt"))
        tok = _byte_level(tokenizers, model)
    except Exception as exc:  # the library raises bare Exceptions for bad files
        raise DataError(f"{root}: vocab.json/merges.txt are not a valid GPT-2 tokenizer "
                        f"({_first_line(exc)}): the files are damaged; copy them again") from None
    return SubwordTokenizer("gpt2", tok, str(root))


def train_bpe(text: str, vocab_size: int) -> SubwordTokenizer:
    """A byte-level BPE of at most `vocab_size` tokens (256 bytes, <|endoftext|>, merges)
    trained on `text`; fewer when the text has no more pairs worth merging."""
    tokenizers = library()
    tok = _byte_level(tokenizers, tokenizers.models.BPE())
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[END_OF_TEXT], show_progress=False,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return SubwordTokenizer("bpe", tok, f"BPE trained on {len(text):,} characters")


def load_file(path: str | os.PathLike[str], kind: str,
              sha256: str | None = None) -> SubwordTokenizer:
    """A tokenizer saved by `save_beside` (or cached); DataError when it is missing, damaged,
    or (given `sha256`) not the one expected."""
    tokenizers = library()
    p = Path(path)
    if not p.is_file():
        raise DataError(f"tokenizer file {p} not found")
    try:
        tok = SubwordTokenizer(kind, tokenizers.Tokenizer.from_file(str(p)), str(p))
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"tokenizer file {p} is damaged ({_first_line(exc)})") from None
    if sha256 is not None and tok.sha256 != sha256:
        raise DataError(f"tokenizer file {p} has sha256 {tok.sha256[:12]}..., the checkpoint "
                        f"was trained with {sha256[:12]}...: it is another tokenizer")
    return tok


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
