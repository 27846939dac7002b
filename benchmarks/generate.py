"""Generation speed: rustyflow's decoding next to transformers' `generate`, same weights.

For each model shape, batch and sampling mode it times new tokens after an 8-token prompt
and prints a Markdown table of tokens per second (all sequences of the batch counted).
rustyflow runs through `Session` (the path `rustyflow generate` takes: decode step, device
sampling, a CUDA graph on the GPU); transformers (when it and torch are installed) gets the
same random weights as a GPT2LMHeadModel and runs `generate` with its dynamic cache and, on
the GPU, also its static one. Each timed run follows a warm-up (rustyflow: the same session's
prompt and first tokens, so compilation and graph capture are not timed; transformers: a
whole run of the same length), and is the steady state.

    python benchmarks/generate.py --device cpu --tokens 100 --out benchmarks/results/x.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rustyflow_py.data import Vocab  # noqa: E402
from rustyflow_py.engine.backend import get_backend  # noqa: E402
from rustyflow_py.engine.policy import RunPolicy  # noqa: E402
from rustyflow_py.interop.hf_export import hf_name  # noqa: E402
from rustyflow_py.model.generate import Session  # noqa: E402
from rustyflow_py.model.gpt import GPT, GPTConfig  # noqa: E402
from rustyflow_py.model.sampling import Sampling  # noqa: E402
from rustyflow_py.training.outputs import write_atomically  # noqa: E402

SHAPES = {  # vocabulary, positions, layers, heads, width
    "small (L6 H6 E384)": GPTConfig(33278, 512, 6, 6, 384),  # WikiText-2's word vocabulary
    "GPT-2 124M": GPTConfig(50257, 1024, 12, 12, 768),
}
MODES = {"greedy": Sampling(0.0), "sampled": Sampling(1.0, top_k=50, top_p=0.95)}
PROMPT, WARM = 8, 8


def rustyflow_rate(model: GPT, batch: int, sampling: Sampling, tokens: int) -> float:
    vocab = Vocab(str(i) for i in range(model.cfg.vocab_size))
    session = Session(model, vocab, sampling, seed=0, batch=batch, warn=print)
    prompt = list(range(1, PROMPT + 1))
    for _ in session.tokens(prompt, WARM):  # prefill, capture
        pass
    start = time.perf_counter()
    for _ in session.tokens([], tokens):  # continues the context
        pass
    return batch * tokens / (time.perf_counter() - start)


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
    prompt = torch.arange(1, PROMPT + 1, device=dev).repeat(batch, 1)  # (B, PROMPT)
    options: dict[str, Any] = {"do_sample": sampling.temperature > 0, "pad_token_id": 0}
    if sampling.temperature > 0:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, gpu or gpu:N")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens timed per run")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads of rustyflow's kernel pool (THREADS; 0 = every core)")
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    backend = get_backend(args.device, RunPolicy(threads=args.threads))
    lines = [f"Generation speed on {backend.describe()} ({os.cpu_count()} cores visible, "
             f"python {platform.python_version()}): {args.tokens} new tokens after "
             f"{PROMPT}, tokens/s over all sequences of the batch; random weights; fp32.", "",
             "| model | batch | mode | rustyflow | transformers (dynamic cache) | "
             "transformers (static cache) |", "|---|---:|---|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for name in args.shapes.split(","):
        model = GPT(SHAPES[name], backend, seed=0)
        model.training = False
        hf = transformers_model(model, args.device)
        for batch in (int(b) for b in args.batches.split(",")):
            for mode, sampling in MODES.items():
                ours = rustyflow_rate(model, batch, sampling, args.tokens)
                theirs = ["not installed"] * 2 if hf is None else [
                    f"{transformers_rate(hf, batch, sampling, args.tokens, cache):,.0f}"
                    if cache != "static" or backend.kind == "gpu" else "(GPU only)"
                    for cache in (None, "static")]
                lines.append(f"| {name} | {batch} | {mode} | {ours:,.0f} | {theirs[0]} | "
                             f"{theirs[1]} |")
                print(lines[-1], flush=True)
    if args.out:
        text = "\n".join(lines) + "\n"
        write_atomically(args.out, lambda f: f.write(text.encode()))


if __name__ == "__main__":
    main()
