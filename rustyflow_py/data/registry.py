"""The built-in datasets: where each lives locally, where it is downloaded from, its sha256s.

The hashes are the official files' own: perplexities are only comparable across runs and with
the literature when the text is byte-for-byte the official one.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from ..errors import DataError

SPLITS = ("train", "valid", "test")


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


def unknown_dataset(dataset: str) -> DataError:
    """A name that is neither a built-in dataset nor a file: a did-you-mean, no download."""
    hint = difflib.get_close_matches(dataset, SOURCES, n=1)
    return DataError(f"unknown dataset '{dataset}': expected {' or '.join(SOURCES)}, or the "
                     f"path of a UTF-8 text file{f' (did you mean {hint[0]}?)' if hint else ''}")
