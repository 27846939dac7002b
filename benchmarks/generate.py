"""Generation speed through the CLI's own path, next to transformers' `generate`, same weights.

For each model shape, batch and sampling mode, rustyflow runs what `rustyflow generate` and
`rustyflow chat` run after loading a checkpoint: a fresh `Session` (decode step, device
sampling, a CUDA graph on the GPU) driven by `generate_text` (an 8-word prompt, then the new
tokens) and by `chat_loop` (two turns, half the tokens each, the second turn's prompt
prefilled into the cache the first left). Each reports the decode rate the command prints
(`Session.speed`: start-up, prompts and the first token kept out), with the start-up beside
it. transformers (when it and torch are installed) gets the same random weights as a
GPT2LMHeadModel and runs `generate` with its dynamic cache and, on the GPU, its static one,
each timed on a second run of the same length. Prints a Markdown table of tokens per second
(all sequences of the batch counted).

Every rustyflow row runs before torch is imported: once transformers' `generate` has run in a
process, rustyflow decodes slower in it, and `rustyflow generate` or `chat` is a process of
its own. transformers' rows follow in the same run, on the same weights, for the ratio.

    python benchmarks/generate.py --device gpu --out benchmarks/results/generate-h100.md
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rustyflow_py.data import EOS, Vocab  # noqa: E402
from rustyflow_py.engine.library import get_backend  # noqa: E402
from rustyflow_py.engine.policy import RunPolicy  # noqa: E402
from rustyflow_py.interop.hf_export import hf_name  # noqa: E402
from rustyflow_py.model.generate import Session, chat_loop, generate_text  # noqa: E402
from rustyflow_py.model.gpt import GPT, GPTConfig  # noqa: E402
from rustyflow_py.model.sampling import Sampling  # noqa: E402

SHAPES = {  # vocabulary, positions, layers, heads, width
    "small (L6 H6 E384)": GPTConfig(33278, 512, 6, 6, 384),  # WikiText-2's word vocabulary
    "GPT-2 124M": GPTConfig(50257, 1024, 12, 12, 768),
}
MODES = {  # the config's defaults are TEMPERATURE 0.8, TOP_K 0, TOP_P 0.9
    "greedy": Sampling(0.0),
    "temperature": Sampling(0.8),
    "top-k 50": Sampling(0.8, top_k=50),
    "top-p 0.9 (defaults)": Sampling(0.8, top_p=0.9),
    "top-k 50 + top-p 0.95": Sampling(0.8, top_k=50, top_p=0.95),
}
PROMPT = " ".join(str(i) for i in range(1, 9))  # 8 words
TURNS = ("1 2 3 4 5 6 7 8\n", "9 10 11\n")  # chat: the second turn continues the first's cache


def session_of(model: GPT, batch: int, sampling: Sampling) -> Session:
    """What `open_session` builds from a checkpoint, for a model already on its device."""
    vocab = Vocab([EOS, *(str(i) for i in range(1, model.cfg.vocab_size))])
    return Session(model, vocab, sampling, seed=0, batch=batch, warn=print)


def generate_rate(model: GPT, batch: int, sampling: Sampling, tokens: int) -> Session:
    """`rustyflow generate --prompt PROMPT --max-tokens tokens`, output discarded."""
    session = session_of(model, batch, sampling)
    generate_text(session, PROMPT, tokens, io.StringIO(), io.StringIO())
    return session


def chat_rate(model: GPT, sampling: Sampling, tokens: int) -> Session:
    """`rustyflow chat --max-tokens tokens/2`, two turns (a reply also ends at <eos>)."""
    session = session_of(model, 1, sampling)
    chat_loop(session, io.StringIO("".join(TURNS)), io.StringIO(), io.StringIO(), tokens // 2)
    return session


def transformers_model(model: GPT, device: str) -> Any:
    """Our weights in a GPT2LMHeadModel (Conv1D stores (in, out), as we do; the head is
    tied), or None without transformers."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    c = model.cfg
    cfg = transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.seq_len,
                                  n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
                                  activation_function="gelu_new", resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                  eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    state = {hf_name(n): torch.from_numpy(np.ascontiguousarray(w))
             for n, w in model.buffer.state_dict().items()}
    hf.load_state_dict(state, strict=False)
    return hf.to("cuda" if device.startswith("gpu") else "cpu")


def transformers_rate(hf: Any, batch: int, sampling: Sampling, tokens: int,
                      cache: str | None) -> float:
    import torch

    dev = next(hf.parameters()).device
    prompt = torch.arange(1, 9, device=dev).repeat(batch, 1)  # (B, 8)
    options: dict[str, Any] = {"do_sample": sampling.temperature > 0, "pad_token_id": 0}
    if sampling.temperature > 0:  # top_k 0 and top_p 1 switch transformers' own defaults off
        options.update(temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p)
    if cache:
        options["cache_implementation"] = cache

    def run(n: int) -> float:
        torch.manual_seed(0)
        start = time.perf_counter()
        with torch.no_grad():
            hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                        min_new_tokens=n, **options)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    run(tokens)  # warm-up at full length: its cache and allocator reach their final size
    return batch * tokens / run(tokens)


def startup_text(session: Session) -> str:
    t = session.timing
    return f"{t.prompt_s + t.first_token_s:.2f}s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, gpu or gpu:N")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per run")
    ap.add_argument("--batches", default="1", help="comma-separated (chat runs at batch 1)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated names")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads of rustyflow's kernel pool (THREADS; 0 = every core)")
    ap.add_argument("--no-transformers", action="store_true", help="rustyflow's rows only")
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    backend = get_backend(args.device, RunPolicy(threads=args.threads))
    lines = [f"Generation speed on {backend.describe()} ({os.cpu_count()} cores visible, "
             f"python {platform.python_version()}): {args.tokens} new tokens after an 8-word "
             "prompt (chat: two turns of half as many), decode tokens/s over all sequences "
             "of the batch as the command prints it (start-up: the first prompt's prefill "
             "and first token, kept out); random weights; fp32.", "",
             "| model | batch | mode | generate | chat | start-up | transformers (dynamic "
             "cache) | transformers (static cache) | generate / static |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    models = {name: GPT(SHAPES[name], backend, seed=0) for name in args.shapes.split(",")}
    rows = [(name, int(batch), mode) for name in models for batch in args.batches.split(",")
            for mode in args.modes.split(",")]
    for model in models.values():
        model.training = False
    ours: dict[tuple[str, int, str], tuple[Session, str]] = {}
    for name, batch, mode in rows:  # all of them before torch comes into the process
        session = generate_rate(models[name], batch, MODES[mode], args.tokens)
        ours[name, batch, mode] = session, (
            f"{chat_rate(models[name], MODES[mode], args.tokens).decode_rate():,.0f}"
            if batch == 1 else "(batch 1)")
    hfs = {name: None if args.no_transformers else transformers_model(model, args.device)
           for name, model in models.items()}
    for name, batch, mode in rows:
        hf, (session, chat) = hfs[name], ours[name, batch, mode]
        theirs: list[float | str] = ["not run"] * 2 if hf is None else [
            transformers_rate(hf, batch, MODES[mode], args.tokens, cache)
            if cache != "static" or backend.kind == "gpu" else "(GPU only)"
            for cache in (None, "static")]
        ratio = (f"{session.decode_rate() / theirs[1]:.2f}x"
                 if isinstance(theirs[1], float) else "")
        cells = [f"{x:,.0f}" if isinstance(x, float) else x for x in theirs]
        lines.append(f"| {name} | {batch} | {mode} | {session.decode_rate():,.0f} | {chat} | "
                     f"{startup_text(session)} | {cells[0]} | {cells[1]} | {ratio} |")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
