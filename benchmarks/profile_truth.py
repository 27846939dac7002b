"""Does the profile tell the truth? The report's matmul share against an independent measure.

For each shape, in one process on one GPU:
1. rustyflow trains the shape's real step (the trainer's own StepRunner on WikiText-2: warm-up,
   capture, replays) and makes its graph profile as a training run does (CUPTI kernel records
   of sampled replays, each kernel attributed to its op at capture). Its matmul share is the
   time of the ops of category `matmul` over the replayed step's device time.
2. torch.profiler (Kineto, its own CUPTI session) then records more replays of the same
   captured graph. The independent share classifies kernels by name alone: GEMM kernels
   (cuBLAS/cuBLASLt/CUTLASS: names with gemm, xmma, cutlass, nvjet or cublas) over the
   device time of the replays (first kernel start to last kernel end of each burst).
The two measures share nothing but the GPU: one attributes kernels to ops through the graph's
nodes, the other reads kernel names. The package never imports torch; this script does.

    python benchmarks/profile_truth.py --out benchmarks/results/profile-truth-h100.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rustyflow_py.training.config.config import load_config  # noqa: E402
from rustyflow_py.training.run.loop import Trainer  # noqa: E402

SHAPES = {  # name -> config file, overrides
    "seed": ("configs/seed.env", {}),
    "small": ("configs/small.env", {}),
    "medium": ("configs/medium.env", {}),
    "gpt2": ("configs/medium.env", {"SEQ_LEN": 1024}),  # GPT-2 124M at T=1024, B=16
}
GEMM = re.compile(r"gemm|xmma|cutlass|nvjet|cublas", re.I)


def trainer_for(shape: str, precision: str, samples: int) -> Trainer:
    path, overrides = SHAPES[shape]
    scratch = tempfile.mkdtemp(prefix="profile-truth-")  # nothing is written there
    cfg, _ = load_config(ROOT / path, {**overrides, "PRECISION": precision, "DEVICE": "gpu",
                                       "PROFILE": True, "PROFILE_MODE": "graph",
                                       "PROFILE_STEPS": samples,
                                       "LOG_FILE": f"{scratch}/log.txt",
                                       "MODEL_PATH": f"{scratch}/m.npz"},
                         environ={})
    return Trainer(cfg, say=lambda _m: None)


def ours(trainer: Trainer, samples: int) -> dict[str, Any]:
    """Warm-up, capture and a first replay, as training runs them; then `samples` sampled
    replays, each queued behind ordinary ones still in flight, as a sampled replay is in a
    training run (the device never idles between training steps; two ahead, so that it is
    still busy when recording starts)."""
    runner, sync = trainer.runner, trainer.backend.synchronize
    assert runner.sampler is not None, "no graph profile: is cupti-python installed?"
    for step in range(3):
        runner.run(step)
    for _ in range(samples):
        runner.captured.replay()
        runner.captured.replay()
        runner.sampler.sample(runner.captured.replay, sync)
    prof = trainer.profiler
    totals = prof.graph.totals()
    matmul = prof.total("matmul")
    return {"share": matmul / totals["span_s"], "step_ms": 1e3 * totals["span_s"] / samples,
            "busy_ms": 1e3 * totals["busy_s"] / samples,
            "ops_sum_ms": 1e3 * prof.total() / samples,
            "cost_ms": 1e3 * runner.sampler.cost_s / samples}


def independent(trainer: Trainer, replays: int) -> dict[str, Any]:
    """torch.profiler over `replays` back-to-back replays of the same captured graph."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    captured = trainer.runner.captured
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            captured.replay()
        trainer.backend.synchronize()
    kernels = [(e.name(), e.start_ns(), e.start_ns() + e.duration_ns())
               for e in prof.profiler.kineto_results.events()
               if e.device_type() == torch.autograd.DeviceType.CUDA]
    start, end = min(k[1] for k in kernels), max(k[2] for k in kernels)
    gemm = sum(k[2] - k[1] for k in kernels if GEMM.search(k[0]))
    total = sum(k[2] - k[1] for k in kernels)
    return {"share": gemm / (end - start), "step_ms": (end - start) / 1e6 / replays,
            "kernel_ms": total / 1e6 / replays, "kernels_per_step": len(kernels) / replays}


def measure_one(item: str, samples: int) -> dict[str, Any]:
    """One shape, ours then torch.profiler's (CUPTI takes one subscriber per process, and
    Kineto keeps it: so each shape runs in a process of its own, see main)."""
    shape, precision = item.split(":")
    trainer = trainer_for(shape, precision, samples)
    a = ours(trainer, samples)
    b = independent(trainer, samples)
    return {"shape": shape, "precision": precision, "ours": a, "torch": b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="seed:fp32,small:bf16,medium:bf16,gpt2:bf16")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a worker's shape
    args = parser.parse_args()
    os.environ.setdefault("RUSTYFLOW_DATA_DIR", str(ROOT / "data"))
    if args.one:
        print(json.dumps(measure_one(args.one, args.samples)))
        return
    rows = []
    for item in args.shapes.split(","):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--one", item, "--samples",
                               str(args.samples)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{item}: the worker failed:\n{done.stderr[-3000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        a, b = row["ours"], row["torch"]
        print(f"{item}: ours {100 * a['share']:.1f}% of {a['step_ms']:.3f} ms, torch.profiler "
              f"{100 * b['share']:.1f}% of {b['step_ms']:.3f} ms "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)
    text = render(rows, args)
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    lines = [
        f"# Profile truth on {name}: the report's matmul share against torch.profiler",
        "",
        f"`python benchmarks/profile_truth.py --shapes {args.shapes} --samples {args.samples}`",
        "",
        "| shape | precision | report: matmul share | report: step on device ms | report: per-op "
        "sum vs busy | torch.profiler: GEMM-kernel share | torch.profiler: step ms | "
        "difference (points) | sampling cost per sample ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        shape, precision, a, b = row["shape"], row["precision"], row["ours"], row["torch"]
        drift = 100 * (a["ops_sum_ms"] - a["busy_ms"]) / a["busy_ms"]
        lines.append(
            f"| {shape} | {precision} | {100 * a['share']:.1f}% | {a['step_ms']:.3f} | "
            f"{drift:+.2f}% | {100 * b['share']:.1f}% | {b['step_ms']:.3f} | "
            f"{100 * (a['share'] - b['share']):+.1f} | {a['cost_ms']:.2f} |")
    lines += [
        "",
        "Report: `matmul`-category ops (every GEMM entry, its cuBLASLt epilogue passes included) "
        "over the replayed step's device time (first kernel start to last kernel end), from "
        f"{args.samples} sampled replays. torch.profiler: kernels whose names match "
        f"`{GEMM.pattern}` over the device time of {args.samples} back-to-back replays of the "
        "same graph. Per-op sum vs busy: the report's per-op times summed, against the union "
        "of the kernel intervals of the same replays.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
