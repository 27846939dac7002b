"""The tokenizer files of `rustyflow export --format hf`, so that AutoTokenizer loads them.

What a checkpoint's tokens are decides what is written:
- a subword checkpoint (TOKENIZER=gpt2 or bpe): its tokenizer, read from beside it and checked
  against the hash the checkpoint records, as `tokenizer.json` (the `tokenizers` library's
  own file), and the same BPE as GPT-2's `vocab.json` + `merges.txt` (what transformers'
  Python GPT-2 tokenizer reads, and what `TOKENIZER=gpt2 TOKENIZER_PATH=<the folder>` reads,
  so the export trains on in rustyflow too); `tokenizer_config.json` names GPT-2's tokenizer
  class with `<|endoftext|>` as its special token, as GPT-2's own folder does;
- a word-level checkpoint (TOKENIZER=word): its words as a WordLevel `tokenizer.json` that
  tokenizes text as rustyflow does (each newline becomes `<eos>`, whitespace splits words, an
  unknown word becomes `<unk>`); decoding joins words with spaces, `<eos>` left as the word;
- an imported checkpoint whose folder lacked vocab.json or merges.txt: nothing, since it has
  no tokenizer to write.
"""

from __future__ import annotations

import json
from typing import Any

from ..data import EOS, UNK
from ..data.checksums import sha256_of
from ..errors import CheckpointError
from ..training.outputs.checkpoint import Checkpoint
from ..training.subword.corpus import checkpoint_tokenizer
from ..training.subword.tokenizer import END_OF_TEXT, SubwordTokenizer
from .extra import require

# every file name an export may write here: one left from an earlier export of another kind
# is removed (when it is still the one rustyflow wrote)
NAMES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")


def tokenizer_files(ckpt: Checkpoint, seq_len: int) -> tuple[dict[str, bytes], str]:
    """File name -> bytes for the export folder, and one line saying what they are."""
    sub = checkpoint_tokenizer(ckpt.meta, str(ckpt.path), "export")
    if sub is not None:
        return subword_files(sub, seq_len), (f"tokenizer: {sub.describe()} as tokenizer.json, "
                                             "vocab.json and merges.txt")
    if isinstance(ckpt.meta.get("imported"), dict):
        return {}, ("tokenizer: none written (the checkpoint was imported from a folder "
                    "without GPT-2's vocab.json and merges.txt, so it has no tokenizer)")
    vocab = [str(t) for t in ckpt.vocab]
    if len(set(vocab)) != len(vocab):
        raise CheckpointError(f"{ckpt.path}: its vocabulary holds a word twice: the "
                              "checkpoint is damaged")
    return word_files(vocab, seq_len), (f"tokenizer: {len(vocab):,} words as a word-level "
                                        "tokenizer.json")


def _json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


def subword_files(sub: SubwordTokenizer, seq_len: int) -> dict[str, bytes]:
    """tokenizer.json, GPT-2's vocab.json and merges.txt, and tokenizer_config.json."""
    model = json.loads(sub.json)["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    vocab = dict(sorted(model["vocab"].items(), key=lambda item: item[1]))
    special = END_OF_TEXT if END_OF_TEXT in sub.itos else None
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": seq_len,
              "add_prefix_space": False, "errors": "replace", "add_bos_token": False,
              "bos_token": special, "eos_token": special, "unk_token": special}
    return {"tokenizer.json": sub.json.encode(),
            "vocab.json": _json(vocab),
            "merges.txt": ("#version: 0.2\n" + "".join(f"{m}\n" for m in merges)).encode(),
            "tokenizer_config.json": _json({k: v for k, v in config.items() if v is not None})}


def word_files(vocab: list[str], seq_len: int) -> dict[str, bytes]:
    """A WordLevel tokenizer.json over the checkpoint's words, and tokenizer_config.json."""
    tokenizers = require("tokenizers", "rustyflow export --format hf (the tokenizer files)")
    ids = {word: i for i, word in enumerate(vocab)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(ids, unk_token=UNK))
    tok.normalizer = tokenizers.normalizers.Replace("\n", f" {EOS} ")  # as data.tokenize
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": seq_len,
              "eos_token": EOS if EOS in ids else None, "unk_token": UNK if UNK in ids else None}
    return {"tokenizer.json": tok.to_str(pretty=True).encode(),
            "tokenizer_config.json": _json({k: v for k, v in config.items() if v is not None})}


def sha256s(files: dict[str, bytes]) -> dict[str, str]:
    """What config.json's mark records of the files, so a later export knows them as its own."""
    return {name: sha256_of(data) for name, data in sorted(files.items())}

