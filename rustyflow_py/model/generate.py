"""Text generation from a trained GPT: a KV-cached decoder, sampling, and the chat loop.

The decoder runs the model's own forward (gpt.py) under no_grad() with a KV cache: layer
norms, matmuls, GELU and residuals are the training code, and only attention differs (it
attends the new positions over the cached keys and values), so a new token costs one position.

Positional embeddings are absolute, so once the context is longer than SEQ_LEN every cached
key and value would change with the window's start. On overflow the decoder therefore drops
the oldest tokens and re-encodes the last SEQ_LEN (one prefill) instead of shifting the
cache: its logits are then exactly those of the uncached model on the same window, at the
price of one full-window forward per token beyond SEQ_LEN.

Sampling happens on the host from the last position's logits (one (V,) copy per token) with
a seeded numpy Generator, so a seed gives the same text on either device.
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TextIO

import numpy as np

from ..data import EOS, UNK, Vocab, tokenize
from ..engine.tensor import Tensor, no_grad
from .gpt import GPT

QUIT_WORDS = ("exit", "quit")
CHAT_PROMPT = "> "


# --------------------------------------------------------------------------- sampling


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is drawn: temperature 0 is greedy, top_k 0 and top_p 1 are off."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0


def next_token_probs(logits: np.ndarray, temperature: float, top_k: int,
                     top_p: float) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T), cut to top-k, then to top-p.

    Top-p keeps the smallest set of most likely tokens whose mass reaches p; the kept
    probabilities are renormalised. Computed in float64 so tiny probabilities survive.
    """
    z = logits.astype(np.float64) / temperature  # (V,)
    if 0 < top_k < z.size:
        cut = np.full_like(z, -np.inf)
        keep = np.argpartition(-z, top_k - 1)[:top_k]
        cut[keep] = z[keep]
        z = cut
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs)  # most likely first
        kept = order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]
        nucleus = np.zeros_like(probs)
        nucleus[kept] = probs[kept]
        probs = nucleus / nucleus.sum()
    return probs


def sample_next(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                rng: np.random.Generator) -> int:
    """One token id from host logits (V,); temperature 0 is the argmax (no division by 0)."""
    if temperature == 0:
        return int(np.argmax(logits))
    cdf = np.cumsum(next_token_probs(logits, temperature, top_k, top_p))
    # side="right": a token of zero probability (a flat step of the CDF) is never drawn
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), cdf.size - 1)


# --------------------------------------------------------------------------- decoder


class Decoder:
    """Generation's bookkeeping around the model's forward with a KV cache, for one sequence.

    `context` is the token window the cache holds (at most SEQ_LEN tokens); `feed` appends
    tokens and returns the logits of the token after them, as `model(context)[-1]` would.
    """

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.cache = model.new_cache()
        self.context: list[int] = []
        self.logits: np.ndarray | None = None  # of the token after the context

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the context; host logits (V,) for the token that follows."""
        if not ids:
            raise ValueError("feed() needs at least one token")
        context = [*self.context, *ids]
        new = list(ids)
        if len(context) > self.model.cfg.seq_len:  # slide: re-prefill the new window
            context = new = context[-self.model.cfg.seq_len:]
            self.cache.length = 0
        idx = Tensor(np.asarray([new], dtype=np.int64), device=self.model.device)  # (1, T)
        with no_grad():
            logits = self.model(idx, cache=self.cache)  # (1, 1, V)
        self.context = context
        self.logits = self.model.buffer.backend.to_host(logits.data)[0, -1]  # (V,)
        return self.logits


# --------------------------------------------------------------------------- text


def encode_prompt(text: str, vocab: Vocab) -> tuple[list[int], list[str]]:
    """Ids of a prompt's words, and the words the vocabulary lacks.

    A prompt is text to continue, so its last line gets no <eos> unless the text ends with a
    newline (inner newlines are <eos>, as in training). Unknown words become <unk>, or are
    dropped when the vocabulary has none.
    """
    words = tokenize(text)
    if not text.endswith("\n"):
        words = words[:-1]  # tokenize() ends the unfinished last line with <eos>
    unknown = [w for w in words if w not in vocab.stoi]
    unk = vocab.unk_id
    ids = [vocab.stoi.get(w, unk) for w in words if w in vocab.stoi or unk is not None]
    return ids, unknown  # type: ignore[return-value]


def unknown_note(unknown: Sequence[str], vocab: Vocab) -> str:
    """The stderr note for prompt words outside the vocabulary."""
    fate = f"replaced by {UNK}" if vocab.unk_id is not None else f"dropped (no {UNK} in it)"
    words = ", ".join(repr(w) for w in dict.fromkeys(unknown))
    return f"note: not in the model's vocabulary, {fate}: {words}"


class Text(Protocol):
    """How generation turns a prompt into ids and sampled ids into text: WordText here, a
    subword tokenizer's SubwordText (training.subword.text)."""

    eos_id: int | None  # the id that ends a line (and starts an empty context)

    def ends_line(self, token: int) -> bool: ...
    def encode(self, text: str) -> tuple[list[int], str | None]: ...  # ids, a note or None
    def piece(self, token: int) -> Any: ...  # what `stream(...).write` takes
    def stream(self, out: TextIO, line_start: bool) -> Any: ...


class WordText:
    """The word-level vocabulary as generation's Text: words in, words out."""

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.eos_id = vocab.eos_id

    def ends_line(self, token: int) -> bool:
        return token == self.eos_id

    def encode(self, text: str) -> tuple[list[int], str | None]:
        """A prompt's ids, and the note about its unknown words (None when there are none)."""
        ids, unknown = encode_prompt(text, self.vocab)
        return ids, unknown_note(unknown, self.vocab) if unknown else None

    def piece(self, token: int) -> str:
        return self.vocab.itos[token]

    def stream(self, out: TextIO, line_start: bool) -> TextStream:
        return TextStream(out, line_start)


class TextStream:
    """Writes words as text as they come: spaces between words, <eos> as a line end."""

    def __init__(self, out: TextIO, line_start: bool = True) -> None:
        self.out, self.line_start = out, line_start

    def write(self, word: str) -> None:
        self.out.write("\n" if word == EOS else word if self.line_start else f" {word}")
        self.out.flush()  # stream token by token
        self.line_start = word == EOS

    def end_line(self) -> None:
        if not self.line_start:
            self.write(EOS)


def render(words: Iterable[str]) -> str:
    """Words as text, <eos> as a newline."""
    buf = io.StringIO()
    stream = TextStream(buf)
    for word in words:
        stream.write(word)
    return buf.getvalue()


# --------------------------------------------------------------------------- sessions


class Session:
    """A model, its vocabulary (or Text) and the sampling settings: text in, sampled text out.

    The context persists across `generate` calls (chat turns share it); the counters give
    the generation speed.
    """

    def __init__(self, model: GPT, vocab: Vocab | Text, sampling: Sampling, seed: int) -> None:
        self.model, self.vocab, self.sampling = model, vocab, sampling
        self.text: Text = WordText(vocab) if isinstance(vocab, Vocab) else vocab
        self.decoder = Decoder(model)
        self.rng = np.random.default_rng(seed)
        self.generated, self.seconds = 0, 0.0
        self.path = ""  # where the model was loaded from, for messages

    @property
    def at_line_start(self) -> bool:
        """Whether the context is empty or ends a line."""
        return not self.decoder.context or self.text.ends_line(self.decoder.context[-1])

    def generate(self, ids: Sequence[int], max_tokens: int,
                 stop_at_eos: bool = False) -> Iterator[Any]:
        """Tokens sampled after `ids` (appended to the context), up to max_tokens of them, as
        their text's pieces (words, or a subword token's bytes).

        Every sampled token is fed back, the last one too, so the context is complete for
        the next call. No ids continue the context, or start from <eos> (a line's beginning)
        when it is empty.
        """
        s, eos = self.sampling, self.text.eos_id
        if not ids and not self.decoder.context:
            ids = [eos]  # type: ignore[list-item]
        start = time.perf_counter()
        try:
            logits = self.decoder.feed(ids) if ids else self.decoder.logits
            for _ in range(max_tokens):
                token = sample_next(logits, s.temperature, s.top_k, s.top_p, self.rng)
                logits = self.decoder.feed([token])
                self.generated += 1
                yield self.text.piece(token)
                if stop_at_eos and self.text.ends_line(token):
                    return
        finally:
            self.seconds += time.perf_counter() - start

    def speed(self) -> str:
        """The tokens/s line shown at the end."""
        rate = self.generated / self.seconds if self.seconds else 0.0
        return (f"{self.generated} tokens in {self.seconds:.2f}s ({rate:.1f} tokens/s, "
                f"{self.model.device})")


def generate_text(session: Session, prompt: str, max_tokens: int, out: TextIO,
                  err: TextIO) -> None:
    """`rustyflow generate`: echo the prompt, then stream its continuation to `out`."""
    ids, note = session.text.encode(prompt)
    if note:
        print(note, file=err)
    shown = prompt.rstrip(" \t")
    out.write(shown)
    stream = session.text.stream(out, line_start=not shown or shown.endswith("\n"))
    for word in session.generate(ids, max_tokens):
        stream.write(word)
    stream.end_line()


def chat_loop(session: Session, inp: TextIO, out: TextIO, err: TextIO,
              max_tokens: int) -> None:
    """`rustyflow chat`: read a line, stream the model's continuation until <eos>, repeat.

    `exit`, `quit` or end of input stop; blank lines are skipped. A reply cut at max_tokens
    is ended with <eos> before the next prompt, so every turn starts a line.
    """
    while True:
        out.write(CHAT_PROMPT)
        out.flush()
        line = inp.readline()
        if not line:  # Ctrl-D / end of input
            out.write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text in QUIT_WORDS:
            return
        ids, note = session.text.encode(text)
        if note:
            print(note, file=err)
        if not session.at_line_start:
            ids.insert(0, session.text.eos_id)  # type: ignore[arg-type]
        stream = session.text.stream(out, True)
        for word in session.generate(ids, max_tokens, stop_at_eos=True):
            stream.write(word)
        stream.end_line()

