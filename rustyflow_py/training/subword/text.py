"""Generation's text through a subword tokenizer: prompts to ids, sampled ids to text.

Sampled tokens are byte strings; a character can span two tokens, so the output is decoded
incrementally and a character is written once all its bytes have come. A line ends at any
token holding a newline byte (chat stops its reply there); an empty context starts from the
newline token, as a word-level one starts from <eos>.
"""

from __future__ import annotations

import codecs
from typing import TextIO

from ...errors import DataError
from .tokenizer import SubwordTokenizer


class ByteStream:
    """Writes tokens' bytes to `out` as UTF-8 text as they come (see TextStream for words)."""

    def __init__(self, out: TextIO, line_start: bool = True) -> None:
        self.out, self.line_start = out, line_start
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, piece: bytes) -> None:
        text = self.decoder.decode(piece)
        if text:
            self.out.write(text)
            self.out.flush()  # stream token by token
            self.line_start = text.endswith("\n")

    def end_line(self) -> None:
        """Flush a cut character and end the line unless it is ended."""
        tail = self.decoder.decode(b"", final=True)
        if tail:
            self.out.write(tail)
            self.line_start = tail.endswith("\n")
        if not self.line_start:
            self.write(b"\n")


class SubwordText:
    """A subword tokenizer as generation's text (the word-level one is generate.WordText)."""

    def __init__(self, tokenizer: SubwordTokenizer) -> None:
        self.tokenizer = tokenizer
        newline = tokenizer.encode("\n").tolist()
        if len(newline) != 1:
            raise DataError(f"{tokenizer.origin}: the tokenizer has no single token for a "
                            f"newline, so it is no byte-level BPE")
        self.eos_id: int = newline[0]
        self.line_ends = {i for i in range(len(tokenizer)) if b"\n" in tokenizer.token_bytes(i)}

    def ends_line(self, token: int) -> bool:
        return token in self.line_ends

    def encode(self, text: str) -> tuple[list[int], str | None]:
        """A prompt's ids (every text has some: the BPE is byte level), and no note."""
        return self.tokenizer.encode(text).tolist(), None

    def piece(self, token: int) -> bytes:
        return self.tokenizer.token_bytes(token)

    def stream(self, out: TextIO, line_start: bool) -> ByteStream:
        return ByteStream(out, line_start)
