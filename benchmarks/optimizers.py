"""Sample efficiency: AdamW against Muon, each with a short learning-rate sweep.

Every run trains the same GPT (same seed, same batches, in order) for --steps optimizer steps
through the real trainer (config validation, CUDA-graph replay on the GPU), on a warm-up +
cosine schedule that ends exactly at --steps (the same shape for every run), then measures the
validation loss (mean per-token NLL over the whole validation split). AdamW sweeps
LEARNING_RATE; Muon sweeps MUON_LR, with its AdamW part (embeddings, biases, LayerNorm) at the
best AdamW learning rate of the same sweep (or --muon-adamw-lr). Everything else is
config.env's default (betas 0.9/0.95, weight decay 0.1, grad clip 1.0, Muon momentum 0.95
Nesterov, 5 Newton-Schulz steps). Writes a markdown table to --out.

    python benchmarks/optimizers.py --device gpu --out benchmarks/results/optimizers-h100.md
    python benchmarks/optimizers.py --device cpu --shape seed --steps 20 --out /tmp/opt.md
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's package, installed or not

from rustyflow_py import data  # noqa: E402
from rustyflow_py.errors import TrainingError  # noqa: E402
from rustyflow_py.model.optim import Schedule  # noqa: E402
from rustyflow_py.training.config.config import Config  # noqa: E402
from rustyflow_py.training.run.loop import Trainer  # noqa: E402

SHAPES = {  # layers, heads, embed, seq_len, batch (benchmarks/vs_pytorch.py's)
    "seed": (2, 4, 128, 64, 16),
    "small": (6, 6, 384, 256, 32),
    "medium": (12, 12, 768, 512, 16),
}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="gpu", help="cpu, gpu or gpu:N (default gpu)")
    ap.add_argument("--shape", choices=SHAPES, default="small")
    for name in ("layers", "heads", "embed", "seq-len", "batch"):
        ap.add_argument(f"--{name}", type=int, default=None, help=f"override the shape's {name}")
    ap.add_argument("--dataset", default="wikitext-2")
    ap.add_argument("--data-dir", default="", help="as DATA_DIR (default: $RUSTYFLOW_DATA_DIR)")
    ap.add_argument("--steps", type=int, default=500, help="optimizer steps per run")
    ap.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor")
    ap.add_argument("--adamw-lrs", type=_floats, default=_floats("3e-4,1e-3,3e-3"))
    ap.add_argument("--muon-lrs", type=_floats, default=_floats("0.01,0.02,0.04"))
    ap.add_argument("--muon-adamw-lr", type=float, default=None,
                    help="LEARNING_RATE of Muon's AdamW part (default: the best AdamW LR)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32"))
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--out", type=Path, required=True, help="markdown file to write")
    return ap.parse_args(argv)


def run_one(args: argparse.Namespace, shape: tuple[int, ...], per_epoch: int, work: Path,
            optimizer: str, lr: float, muon_lr: float | None) -> dict[str, Any]:
    """Train one configuration for args.steps steps; its validation loss and timings (NaN
    losses for a run that diverged)."""
    layers, heads, embed, seq_len, batch = shape
    tag = f"{optimizer}-{lr:g}-{muon_lr or 0:g}"
    values: dict[str, Any] = dict(
        dataset=args.dataset, data_dir=args.data_dir, seq_len=seq_len, batch_size=batch,
        embed_dim=embed, num_heads=heads, num_layers=layers, device=args.device,
        precision=args.precision, seed=args.seed, optimizer=optimizer, learning_rate=lr,
        warmup_steps=args.warmup, min_lr_ratio=args.min_lr_ratio, max_steps=args.steps,
        num_epochs=math.ceil(args.steps / per_epoch), profile=False, strict_device=True,
        log_interval=min(50, args.steps), log_file=str(work / f"{tag}.log"),
        model_path=str(work / f"{tag}.npz"))
    if muon_lr is not None:
        values["muon_lr"] = muon_lr
    cfg = Config(**values)
    trainer = Trainer(cfg, say=lambda _: None)
    opt = trainer.optimizer  # the cosine ends at --steps, not at the end of the last epoch
    opt.schedule = Schedule(lr, args.warmup, args.steps, args.min_lr_ratio)
    if muon_lr is not None:
        opt.muon_schedule = Schedule(muon_lr, args.warmup, args.steps,  # type: ignore[attr-defined]
                                     args.min_lr_ratio)
    start = time.perf_counter()
    nan = float("nan")
    row = {"optimizer": optimizer, "lr": lr, "muon_lr": muon_lr, "val_loss": nan,
           "val_ppl": nan, "train_loss": nan, "tokens_per_s": None, "device": trainer.device,
           "hardware": trainer.backend.hardware(), "graph": False}
    try:
        record = trainer.run()
    except TrainingError as exc:  # diverged: the row says so
        print(f"{tag}: {exc}", flush=True)
        return {**row, "seconds": time.perf_counter() - start}
    assert record is not None
    val_ppl = record["val_ppl"]
    return {**row, "val_loss": math.log(val_ppl) if val_ppl else nan, "val_ppl": val_ppl,
            "train_loss": trainer.losses[-1], "seconds": time.perf_counter() - start,
            "tokens_per_s": record["tokens_per_s"], "graph": record["graph"]}


def table(rows: list[dict[str, Any]], args: argparse.Namespace,
          shape: tuple[int, ...], muon_adamw_lr: float) -> str:
    layers, heads, embed, seq_len, batch = shape
    finite = [r for r in rows if math.isfinite(r["val_loss"])]
    best = {opt: min((r for r in finite if r["optimizer"] == opt), key=lambda r: r["val_loss"])
            for opt in ("adamw", "muon") if any(r["optimizer"] == opt for r in finite)}
    hw = rows[0]["hardware"] if rows else "?"
    lines = [
        "# Sample efficiency: AdamW vs Muon",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, `python benchmarks/optimizers.py "
        f"{' '.join(sys.argv[1:])}`",
        "",
        f"- device: {rows[0]['device'] if rows else '?'} ({hw}), {args.precision}, "
        f"CUDA graph: {'yes' if rows and rows[0]['graph'] else 'no'}",
        f"- data: {args.dataset}; shape L{layers} H{heads} E{embed}, seq {seq_len}, batch "
        f"{batch} ({seq_len * batch} tokens a step)",
        f"- schedule: {args.steps} steps, {args.warmup} warm-up, cosine to "
        f"{args.min_lr_ratio:g}x at step {args.steps}; grad clip 1.0, weight decay 0.1",
        f"- muon: MUON_LR swept on the 2-D hidden weights; embeddings, biases and LayerNorm "
        f"take AdamW at LEARNING_RATE {muon_adamw_lr:g}",
        "- validation loss: mean per-token NLL over the whole validation split after the "
        "last step (lower is better)",
        "",
        "| optimizer | LEARNING_RATE | MUON_LR | train loss (last step) | validation loss | "
        "validation ppl | time (s) | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = " **(best)**" if best.get(r["optimizer"]) is r else ""
        tps = f"{r['tokens_per_s']:,.0f}" if r["tokens_per_s"] else "n/a"
        lines.append(
            f"| {r['optimizer']}{mark} | {r['lr']:g} | "
            f"{'' if r['muon_lr'] is None else format(r['muon_lr'], 'g')} | "
            f"{r['train_loss']:.4f} | {r['val_loss']:.4f} | {r['val_ppl']:.2f} | "
            f"{r['seconds']:.1f} | {tps} |")
    if len(best) == 2:
        a, m = best["adamw"], best["muon"]
        lines += ["", f"Best validation loss: AdamW {a['val_loss']:.4f} (LR {a['lr']:g}), Muon "
                      f"{m['val_loss']:.4f} (MUON_LR {m['muon_lr']:g}): Muon "
                      f"{m['val_loss'] - a['val_loss']:+.4f} "
                      f"({'better' if m['val_loss'] < a['val_loss'] else 'not better'}) after "
                      f"{args.steps} steps."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    base = SHAPES[args.shape]
    shape = tuple(v if v is not None else d for v, d in zip(
        (args.layers, args.heads, args.embed, args.seq_len, args.batch), base, strict=True))
    corpus = data.load_corpus(args.dataset, args.data_dir or None)
    per_epoch = data.num_batches(data.batchify(corpus.train, shape[4]), shape[3])
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rf-optimizers-") as tmp:
        work = Path(tmp)
        for lr in args.adamw_lrs:
            rows.append(run_one(args, shape, per_epoch, work, "adamw", lr, None))
            print(f"adamw LR {lr:g}: validation loss {rows[-1]['val_loss']:.4f}", flush=True)
        adamw = [r for r in rows if math.isfinite(r["val_loss"])]
        muon_adamw_lr = args.muon_adamw_lr or (
            min(adamw, key=lambda r: r["val_loss"])["lr"] if adamw else 1e-3)
        for muon_lr in args.muon_lrs:
            rows.append(run_one(args, shape, per_epoch, work, "muon", muon_adamw_lr, muon_lr))
            print(f"muon MUON_LR {muon_lr:g}: validation loss {rows[-1]['val_loss']:.4f}",
                  flush=True)
    text = table(rows, args, shape, muon_adamw_lr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
