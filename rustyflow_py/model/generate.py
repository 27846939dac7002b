"""Text generation from a trained GPT: a KV-cached decoder, device sampling, and the chat loop.

A prompt (or a chunk of chat) is encoded by the model's own forward (gpt.py) under no_grad()
with a KV cache; each further token is one DecodeStep (decode.py): the same weights and
kernels without autograd, writing its keys and values into the cache in place, and on the GPU
replayed as a CUDA graph (graph_decode.py). B sequences decode at once (`--num-samples`).

Positional embeddings are absolute, so once the context is longer than SEQ_LEN every cached
key and value would change with the window's start. On overflow the decoder therefore drops
the oldest tokens and re-encodes the last SEQ_LEN (one prefill) instead of shifting the
cache: its logits are then exactly those of the uncached model on the same window, at the
price of one full-window forward per token beyond SEQ_LEN.

The next tokens are chosen on the device (sampling.py); the one host read per token is the
chosen ids, which the text needs, copied asynchronously while the step that feeds them back is
already queued (Decoder.feed_chosen), so the device never waits for Python between tokens. On
the GPU with graphs a token is one replay of a graph that draws it and decodes it, and the ids
come back a batch at a time (graph_decode.GraphDraws).
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TextIO

import numpy as np

from ..data import EOS, UNK, Vocab, tokenize
from ..engine.tensor import Tensor, no_grad
from .decode import decode_step
from .gpt import GPT
from .graph_decode import GraphDecode, GraphDraws
from .sampling import Sampler, Sampling

__all__ = ["Decoder", "Sampling", "Session", "Timing", "chat_loop", "generate_text"]

QUIT_WORDS = ("exit", "quit")
CHAT_PROMPT = "> "


# --------------------------------------------------------------------------- decoder


class Decoder:
    """Generation's bookkeeping around the KV cache, for `batch` sequences of equal length.

    `contexts` are the token windows the cache holds (at most SEQ_LEN tokens each); `feed`
    appends tokens and returns the device logits (B, V) of the tokens after them, as
    `model(context)[:, -1]` would. One new token per sequence is a DecodeStep (replayed as a
    CUDA graph on the GPU unless `graphs` is False); several, or a window that slides, go
    through the model's forward.
    """

    def __init__(self, model: GPT, batch: int = 1, graphs: bool = True,
                 warn: Any = None) -> None:
        self.model = model
        self.backend = model.buffer.backend
        self.cache = model.new_cache(batch)
        self.step = decode_step(model, self.cache)
        self.run_step: Any = self.step
        if graphs and self.backend.kind == "gpu":
            self.run_step = GraphDecode(self.step, warn or (lambda msg: None))
        self.contexts: list[list[int]] = [[] for _ in range(batch)]
        self.logits: Any = None  # (B, V) on the device: of the tokens after the contexts

    @property
    def context(self) -> list[int]:
        """The first sequence's window."""
        return self.contexts[0]

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to every sequence; host logits (V,) of the first one's next token."""
        return self.backend.to_host(self.feed_rows([list(ids)] * len(self.contexts))[0])

    def feed_rows(self, rows: Sequence[Sequence[int]]) -> Any:
        """Append rows[b] to sequence b (all of one length); device logits (B, V) after them."""
        if not rows[0]:
            raise ValueError("feed() needs at least one token")
        contexts = [[*c, *r] for c, r in zip(self.contexts, rows, strict=True)]
        n, seq_len = len(contexts[0]), self.model.cfg.seq_len
        if len(rows[0]) == 1 and n <= seq_len:
            self._step(n, self.backend.from_host(np.asarray(rows, np.int64)[:, 0]))
        else:
            new = [list(r) for r in rows]
            if n > seq_len:  # slide: re-prefill the new window
                contexts = new = [c[-seq_len:] for c in contexts]
                self.cache.length = 0
            idx = Tensor(np.asarray(new, dtype=np.int64), device=self.backend)  # (B, T)
            with no_grad():
                self.logits = self.model(idx, cache=self.cache).data[:, -1]  # (B, V)
        self.contexts = contexts
        return self.logits

    def feed_chosen(self, chosen: Any, wait: Callable[[], np.ndarray]) -> tuple[np.ndarray, Any]:
        """Append the sampler's ids (B,), on the device, to every sequence: the host ids
        (from `wait`, which waits for their copy) and the device logits (B, V) after them.

        Inside the window the step is queued before the ids reach the host, so the device
        decodes while the host handles them and queues the next token's work; sliding the
        window needs the ids first (feed_rows).
        """
        n = len(self.contexts[0]) + 1
        if n > self.model.cfg.seq_len:
            host = wait()
            return host, self.feed_rows(host[:, None].tolist())
        self._step(n, chosen)
        host = wait()
        for context, token in zip(self.contexts, host.tolist(), strict=True):
            context.append(token)
        return host, self.logits

    def _step(self, n: int, tokens: Any) -> None:
        """Queue the decode step of `tokens` (B,) on the device at position n - 1."""
        step = self.step
        step.tokens[...] = tokens
        step.pos.fill(n - 1)
        self.run_step(n)
        self.cache.length, self.logits = n, step.logits


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


@dataclasses.dataclass
class Timing:
    """Where a session's time went, kept apart the way `train` keeps its start-up out of the
    epoch times: the start-up (the first prompt's prefill and the first token, which compile
    the kernels and capture the decode step's graph), later prompts, and decoding."""

    prompt: int = 0  # tokens of the first prefill
    prompt_s: float = 0.0
    first_token_s: float = 0.0  # 0: no token decoded yet
    capture_s: float = 0.0
    cache: str = ""  # the GPU's kernel cache at start-up: "cold" (it grew) or "warm"
    prefilled: int = 0  # tokens of later prompts (chat turns)
    prefill_s: float = 0.0
    decoded: int = 0  # tokens decoded after the first (all sequences counted)
    decode_s: float = 0.0


class IdsToHost:
    """Copies the chosen ids (B,) to the host without waiting for them: on the GPU into
    pinned memory, queued on the backend's stream behind the sampler, with an event to wait
    for when the ids are needed."""

    def __init__(self, backend: Any, batch: int) -> None:
        self.backend = backend
        if backend.kind == "gpu":
            self.memory = backend.xp.cuda.alloc_pinned_memory(8 * batch)
            self.pinned = np.frombuffer(self.memory, np.int64, batch)
            self.event = backend.xp.cuda.Event(disable_timing=True)

    def start(self, ids: Any) -> Callable[[], np.ndarray]:
        """Queue the copy of `ids`; the returned function waits for it and gives the ids."""
        if self.backend.kind != "gpu":
            return lambda: ids
        runtime, stream = self.backend.xp.cuda.runtime, self.backend.stream
        runtime.memcpyAsync(self.memory.ptr, ids.data.ptr, self.pinned.nbytes,
                            runtime.memcpyDeviceToHost, stream.ptr)
        self.event.record(stream)
        return self._wait

    def _wait(self) -> np.ndarray:
        self.event.synchronize()
        return self.pinned.copy()


class Session:
    """A model, its vocabulary (or Text) and the sampling settings: text in, sampled text out,
    for `batch` samples at once, each with its own random stream.

    The context and its KV cache persist across `generate` calls (chat turns share them: a
    turn prefills only its own tokens); `timing` says where the time went.
    """

    def __init__(self, model: GPT, vocab: Vocab | Text, sampling: Sampling, seed: int,
                 batch: int = 1, graphs: bool = True, warn: Any = None) -> None:
        self.model, self.vocab, self.sampling, self.batch = model, vocab, sampling, batch
        self.text: Text = WordText(vocab) if isinstance(vocab, Vocab) else vocab
        self.backend = model.buffer.backend
        self.decoder = Decoder(model, batch, graphs, warn)
        self.sampler = Sampler(self.backend, sampling, seed, batch)
        self.to_host = IdsToHost(self.backend, batch)
        # on the GPU with graphs a token is one replay that draws it and decodes it
        self.draws = (GraphDraws(self.decoder, self.sampler, warn or (lambda msg: None))
                      if isinstance(self.decoder.run_step, GraphDecode) else None)
        self.generated = 0  # tokens sampled, all sequences counted
        self.timing = Timing()
        self.path = ""  # where the model was loaded from, for messages

    @property
    def at_line_start(self) -> bool:
        """Whether the context is empty or ends a line."""
        return not self.decoder.context or self.text.ends_line(self.decoder.context[-1])

    def tokens(self, ids: Sequence[int], max_tokens: int,
               stop_at_eos: bool = False) -> Iterator[np.ndarray]:
        """The ids (B,) sampled after `ids` (appended to every context), up to max_tokens
        times; stop_at_eos ends after the first sequence ends a line.

        Every sampled token is fed back, the last one too, so the context is complete for
        the next call. No ids continue the context, or start from <eos> (a line's beginning)
        when it is empty.
        """
        if not ids and not self.decoder.context:
            ids = [self.text.eos_id]  # type: ignore[list-item]
        t, started = self.timing, self.timing.first_token_s > 0
        cache_files = self._kernel_cache() if not started else 0
        logits = self._prefill(ids, started) if ids else self.decoder.logits
        chosen = (self.draws.tokens(logits, max_tokens, not started) if self.draws else
                  self._queued(logits, max_tokens))
        tick, decoded = time.perf_counter(), 0
        try:
            for host in chosen:
                self.generated += self.batch
                if started:
                    decoded += self.batch
                else:  # the first token compiled the kernels and captured the graph
                    self.backend.synchronize()
                    t.first_token_s, tick = time.perf_counter() - tick, time.perf_counter()
                    t.capture_s = getattr(self.draws or self.decoder.run_step, "capture_s",
                                          0.0)
                    if self.backend.kind == "gpu":
                        t.cache = "cold" if self._kernel_cache() != cache_files else "warm"
                    started = True
                yield host
                if stop_at_eos and self.text.ends_line(int(host[0])):
                    return
        finally:
            chosen.close()  # a series run past the last token kept gives it back
            self.backend.synchronize()  # the last token's step too
            t.decoded += decoded
            t.decode_s += time.perf_counter() - tick if decoded else 0.0

    def _queued(self, logits: Any, max_tokens: int) -> Iterator[np.ndarray]:
        """The host ids (B,) of max_tokens tokens, each sampled and its step queued before
        its ids are read (the CPU, or the GPU without graphs)."""
        for _ in range(max_tokens):
            chosen = self.sampler(logits)  # (B,) on the device
            host, logits = self.decoder.feed_chosen(chosen, self.to_host.start(chosen))
            yield host

    def _prefill(self, ids: Sequence[int], started: bool) -> Any:
        """Feed a prompt (every sequence the same), timed to its logits on the device."""
        start = time.perf_counter()
        logits = self.decoder.feed_rows([list(ids)] * self.batch)
        self.backend.synchronize()
        seconds, t = time.perf_counter() - start, self.timing
        if started:
            t.prefilled, t.prefill_s = t.prefilled + len(ids), t.prefill_s + seconds
        else:
            t.prompt, t.prompt_s = len(ids), seconds
        return logits

    def _kernel_cache(self) -> int:
        """How many kernels CuPy's on-disk cache holds (GPU only: 0 on the CPU)."""
        if self.backend.kind != "gpu":
            return 0
        from ..engine.ops.cuda_build import kernel_cache_files

        return kernel_cache_files()

    def generate(self, ids: Sequence[int], max_tokens: int,
                 stop_at_eos: bool = False) -> Iterator[Any]:
        """The first sample's tokens after `ids` as their text's pieces (words, or a subword
        token's bytes), as they come: see `tokens`."""
        for host in self.tokens(ids, max_tokens, stop_at_eos):
            yield self.text.piece(int(host[0]))

    def decode_rate(self) -> float:
        """Tokens per second of decoding (start-up and prompts kept out); 0 before any."""
        t = self.timing
        return t.decoded / t.decode_s if t.decode_s else 0.0

    def speed(self) -> str:
        """The lines shown at the end: the start-up, then the decode rate."""
        t, gpu = self.timing, self.backend.kind == "gpu"
        up = [f"prefill of {t.prompt} prompt tokens {t.prompt_s:.3f}s"] if t.prompt else []
        if t.first_token_s:
            why = f" (kernel compilation; kernel cache {t.cache})" if gpu else ""
            up.append(f"first token {t.first_token_s:.3f}s{why}")
        capture = f", graph capture {t.capture_s:.3f}s" if t.capture_s else ""
        lines = [f"Start-up: {', '.join(up)}{capture}; kept out of the tokens/s"] if up else []
        later = (f"; later prompts: {t.prefilled} tokens prefilled in {t.prefill_s:.3f}s"
                 if t.prefilled else "")
        lines.append(f"Decoding: {t.decoded} tokens in {t.decode_s:.3f}s "
                     f"({self.decode_rate():,.1f} tokens/s, {self.model.device}, "
                     f"batch {self.batch}){later}")
        return "\n".join(lines)


def generate_text(session: Session, prompt: str, max_tokens: int, out: TextIO,
                  err: TextIO) -> None:
    """`rustyflow generate`: echo the prompt, then stream its continuation to `out`; with
    several samples, each is written whole after all are done, under a header line."""
    ids, note = session.text.encode(prompt)
    if note:
        print(note, file=err)
    shown = prompt.rstrip(" \t")
    line_start = not shown or shown.endswith("\n")
    if session.batch == 1:
        out.write(shown)
        stream = session.text.stream(out, line_start)
        for word in session.generate(ids, max_tokens):
            stream.write(word)
        stream.end_line()
        return
    steps = list(session.tokens(ids, max_tokens))  # max_tokens x (B,)
    for b in range(session.batch):
        if b:
            out.write("\n")
        out.write(f"=== sample {b + 1} of {session.batch} ===\n")
        out.write(shown)
        stream = session.text.stream(out, line_start)
        for host in steps:
            stream.write(session.text.piece(int(host[b])))
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
        if not session.at_line_start and session.text.eos_id is not None:
            ids.insert(0, session.text.eos_id)  # a vocabulary without <eos> just runs on
        stream = session.text.stream(out, True)
        for word in session.generate(ids, max_tokens, stop_at_eos=True):
            stream.write(word)
        stream.end_line()

