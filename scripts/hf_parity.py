"""Logits of rustyflow and transformers on the same GPT-2 weights, both directions.

    .venv/bin/python scripts/hf_parity.py [--size tiny|gpt2] [--device cpu|gpu]

Builds a random GPT2LMHeadModel (every parameter perturbed, so biases and LayerNorm are not
trivial), saves it with save_pretrained, imports it with `rustyflow import hf`, compares the
logits of both on the same tokens; then exports the imported checkpoint with `rustyflow
export --format hf`, loads that with transformers and compares again. Prints the largest
absolute difference, relative to the largest logit. Needs transformers and (CPU) torch: the
comparison side, never rustyflow's.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

from rustyflow_py.engine.tensor import Tensor, no_grad
from rustyflow_py.interop.hf_export import export_hf
from rustyflow_py.interop.hf_import import import_hf
from rustyflow_py.training.evaluation.evaluate import load_model

SIZES = {"tiny": dict(vocab_size=101, n_positions=24, n_embd=32, n_layer=2, n_head=4),
         "gpt2": dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)}


def ours(path: str, tokens: np.ndarray, device: str) -> np.ndarray:
    model, _, _ = load_model(path, device)
    with no_grad():
        out = model(Tensor(model.buffer.backend.from_host(tokens.astype(np.int32))))
    return np.asarray(model.buffer.backend.to_host(out.data), dtype=np.float32)


def theirs(model: transformers.GPT2LMHeadModel, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()


def relative(a: np.ndarray, b: np.ndarray) -> str:
    scale = float(np.abs(b).max())
    return f"max |diff| {np.abs(a - b).max():.3g}, relative to max |logit| {scale:.3g}: " \
           f"{np.abs(a - b).max() / scale:.2e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=SIZES, default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = SIZES[args.size]
    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    t = min(args.tokens, shape["n_positions"])
    tokens = np.random.default_rng(1).integers(0, shape["vocab_size"], size=(2, t))
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(Path(tmp, "hf"), safe_serialization=True)
        ckpt = str(Path(tmp, "imported.npz"))
        import_hf(str(Path(tmp, "hf")), ckpt, False, print)
        print(f"import ({args.size}, {args.device}): "
              f"{relative(ours(ckpt, tokens, args.device), theirs(ref, tokens))}")
        export_hf(ckpt, str(Path(tmp, "out")), lambda _: None)
        back = transformers.GPT2LMHeadModel.from_pretrained(Path(tmp, "out")).eval()
        print(f"export ({args.size}, {args.device}): "
              f"{relative(ours(ckpt, tokens, args.device), theirs(back, tokens))}")


if __name__ == "__main__":
    main()
