"""Data-parallel scaling on one machine: tokens/s on 1 and N GPUs, loss equivalence, ZeRO-1
memory, and the NCCL all-reduce time that projections to more GPUs start from.

Every measurement runs the real trainer (`training.run.loop.Trainer`) in MPI processes started by
`mpiexec`, one per GPU, exactly as `rustyflow train --gpus N` does:
- throughput: after warm-up and CUDA-graph capture, K replayed steps are timed, at the same
  per-GPU batch on 1 and on N GPUs (weak scaling), so the speed-up is N x (1-GPU step time /
  N-GPU step time);
- the all-reduce: the whole flat gradient buffer, timed with CUDA events on its own;
- equivalence (fp32): N GPUs x batch B, 1 GPU x batch N*B and 1 GPU x B with
  GRAD_ACCUM_STEPS=N, same initial weights and global batches, per-step losses compared;
- ZeRO-1: the same losses as plain data parallel, and each rank's optimizer-state bytes.

    python benchmarks/scaling.py --gpus 2 --out benchmarks/results/scaling-h200x2.md
    python benchmarks/scaling.py --gpus 2,4 --out benchmarks/results/scaling-h100x4.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # time the working tree's package, installed or not

from rustyflow_py.distributed.group import process_group  # noqa: E402
from rustyflow_py.distributed.launcher import launch  # noqa: E402
from rustyflow_py.distributed.world import World  # noqa: E402
from rustyflow_py.training.config.config import Config  # noqa: E402
from rustyflow_py.training.outputs.checkpoint import Checkpoint  # noqa: E402
from rustyflow_py.training.run.loop import Trainer  # noqa: E402

SHAPES = {  # layers, heads, embed, seq_len, per-GPU batch: vs_pytorch.py's
    "small": (6, 6, 384, 256, 32),
    "medium": (12, 12, 768, 512, 16),
}


def shape_config(shape: str, precision: str, **extra: Any) -> dict[str, Any]:
    layers, heads, embed, seq_len, batch = SHAPES[shape]
    return {"NUM_LAYERS": layers, "NUM_HEADS": heads, "EMBED_DIM": embed, "SEQ_LEN": seq_len,
            "BATCH_SIZE": batch, "PRECISION": precision, "DEVICE": "gpu", "PROFILE": False,
            "LOG_INTERVAL": 50, **extra}


# ---- the worker: one process of a measurement -----------------------------------------------
def worker(spec: dict[str, Any]) -> None:
    """Time spec["steps"] replayed steps after spec["warmup"]; rank 0 writes the result."""
    world = World.from_env()
    tmp = Path(spec["out"]).parent
    cfg = Config.from_dict({**spec["config"], "LOG_FILE": f"{tmp}/log.txt",
                            "MODEL_PATH": f"{tmp}/m.npz"})
    with process_group(world, cfg.comm_timeout) as group:
        trainer = Trainer(cfg, lambda _m: None, group=group, world=world)
        runner, backend = trainer.runner, trainer.backend
        for step in range(spec["warmup"]):
            runner.run(step)
        times = []
        for _ in range(spec["repeats"]):
            _agree(trainer)
            start = time.perf_counter()
            for step in range(spec["warmup"], spec["warmup"] + spec["steps"]):
                runner.run(step)
            backend.synchronize()
            times.append((time.perf_counter() - start) / spec["steps"])
        result = {"step_s": min(times), "tokens_per_step": trainer.parts.tokens_per_step,
                  "graph": runner.captured is not None,
                  "params": trainer.model.num_params(),
                  "optimizer_state_bytes": _state_bytes(trainer.optimizer),
                  "memory": runner.memory(),
                  "allreduce_s": (_allreduce_time(trainer) if trainer.comm is not None
                                  and backend.kind == "gpu" else None)}
        if world.main:
            Path(spec["out"]).write_text(json.dumps(result))
        if trainer.comm is not None:
            runner.release_graph()
            trainer.comm.close(clean=True)


def _agree(trainer: Trainer) -> None:
    """Start the timed window together (a tiny all-reduce, then a sync)."""
    if trainer.comm is not None:
        flag = trainer.backend.xp.zeros((), dtype="float32")
        trainer.comm.all_reduce(flag)
    trainer.backend.synchronize()


def _state_bytes(optimizer: Any) -> int:
    inner = getattr(optimizer, "inner", optimizer)
    return sum(int(getattr(inner, n).nbytes) for n in inner.state_names)


def _allreduce_time(trainer: Trainer, reps: int = 20) -> float:
    """One all-reduce of the whole flat gradient buffer, timed with CUDA events."""
    backend, grad = trainer.backend, trainer.model.buffer.grad
    for _ in range(3):
        trainer.comm.all_reduce(grad)
    start, end = backend.new_event(), backend.new_event()
    backend.record(start)
    for _ in range(reps):
        trainer.comm.all_reduce(grad)
    backend.record(end)
    end.synchronize()
    return backend.elapsed(start, end) / reps


# ---- the driver ------------------------------------------------------------------------------
def measure(gpus: int, config: dict[str, Any], warmup: int, steps: int, repeats: int,
            tmp: Path) -> dict[str, Any]:
    out = tmp / f"r{time.monotonic_ns()}.json"
    spec = {"config": config, "warmup": warmup, "steps": steps, "repeats": repeats,
            "out": str(out)}
    code = launch([sys.executable, __file__, "--worker", json.dumps(spec)], gpus, print)
    if code != 0:
        raise SystemExit(f"measurement failed (exit {code}): {config}")
    return json.loads(out.read_text())


def losses(gpus: int, config: dict[str, Any], steps: int, tmp: Path, name: str) -> list[float]:
    """Per-step losses of a real `rustyflow train` run of `steps` steps."""
    flags = [f"--{k.lower().replace('_', '-')}" + ("" if v is True else f"={v}")
             for k, v in config.items() if k not in ("DEVICE", "PROFILE")]
    model = tmp / f"{name}.npz"
    cmd = [sys.executable, "-m", "rustyflow_py", "train", "--device", "gpu", "--no-profile",
           f"--max-steps={steps}", "--log-interval=1", f"--log-file={tmp / 'log.txt'}",
           f"--model-path={model}", *flags]
    code = launch(cmd, gpus, print)
    if code != 0:
        raise SystemExit(f"run failed (exit {code}): {shlex.join(cmd)}")
    return Checkpoint(str(model).replace(".npz", "-gpu.npz")).meta["train"]["losses"]


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def throughput(shapes: list[str], counts: list[int], precision: str, steps: int, repeats: int,
               tmp: Path, results: dict[str, Any]) -> list[str]:
    """Rows of step time and speed-up: each shape on 1 GPU, then on each count in `counts`."""
    lines = ["## Throughput (same per-GPU batch; best of the repeats, graph replay)", "",
             "| shape | precision | GPUs | step ms | tokens/s | speed-up | efficiency "
             "| all-reduce of the gradient (ms) | peak GPU memory (GiB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape in shapes:
        cfg = shape_config(shape, precision)
        one = measure(1, cfg, 3, steps, repeats, tmp)
        results[shape] = {"1": one}
        for gpus in (1, *counts):
            r = one if gpus == 1 else measure(gpus, cfg, 3, steps, repeats, tmp)
            results[shape][str(gpus)] = r
            tps = r["tokens_per_step"] / r["step_s"]
            speed = tps / (one["tokens_per_step"] / one["step_s"])
            ar = f"{r['allreduce_s'] * 1e3:.2f}" if r["allreduce_s"] else "-"
            lines.append(f"| {shape} | {precision} | {gpus} | {r['step_s'] * 1e3:.2f} | "
                         f"{tps:,.0f} | {speed:.2f}x | {speed / gpus:.1%} | {ar} | "
                         f"{r['memory']['peak_bytes'] / 2**30:.2f} |")
            print(lines[-1], flush=True)  # a cut-short run still shows what it measured
    return lines


def equivalence(n: int, curve_steps: int, tmp: Path, results: dict[str, Any]) -> list[str]:
    """Per-step losses of n GPUs against one GPU with n times the batch (and accumulation)."""
    base = {"NUM_LAYERS": 2, "NUM_HEADS": 4, "EMBED_DIM": 128, "SEQ_LEN": 64,
            "PRECISION": "fp32", "DEVICE": "gpu", "PROFILE": False}
    b = 8
    ref_name = f"1 GPU x BATCH_SIZE {n * b}"
    runs = {
        f"{n} GPUs x BATCH_SIZE {b}": losses(n, {**base, "BATCH_SIZE": b}, curve_steps, tmp,
                                             f"dp{n}"),
        ref_name: losses(1, {**base, "BATCH_SIZE": n * b}, curve_steps, tmp, f"one{n}"),
        f"1 GPU x BATCH_SIZE {b} x GRAD_ACCUM_STEPS {n}": losses(
            1, {**base, "BATCH_SIZE": b, "GRAD_ACCUM_STEPS": n}, curve_steps, tmp, f"accum{n}"),
        f"{n} GPUs x BATCH_SIZE {b}, SHARD_OPTIMIZER": losses(
            n, {**base, "BATCH_SIZE": b, "SHARD_OPTIMIZER": True}, curve_steps, tmp,
            f"zero{n}"),
    }
    results[f"curves-{n}"] = runs
    lines = ["", f"## Loss equivalence on {n} GPUs (fp32, {curve_steps} steps, seed shape x "
             "small batch: same initial weights, same global batches)", "",
             "| run | loss at step 1 | loss at last step | max relative difference "
             f"from `{ref_name}` |", "|---|---:|---:|---:|"]
    for name, curve in runs.items():
        lines.append(f"| {name} | {curve[0]:.6f} | {curve[-1]:.6f} | "
                     f"{max_rel(curve, runs[ref_name]):.2e} |")
    print("\n".join(lines), flush=True)
    return lines


def zero_state(n: int, precision: str, tmp: Path, results: dict[str, Any]) -> list[str]:
    """ZeRO-1's optimizer state per GPU against plain data parallel, small shape."""
    zero = measure(n, {**shape_config("small", precision), "SHARD_OPTIMIZER": "true"},
                   3, 5, 1, tmp)
    plain = results.get("small", {}).get(str(n)) or measure(
        n, shape_config("small", precision), 3, 5, 1, tmp)
    results[f"zero-{n}"] = zero
    return ["", f"## ZeRO-1 optimizer state per GPU on {n} GPUs (small shape, AdamW m and v)",
            "",
            f"- plain data parallel: {plain['optimizer_state_bytes'] / 2**20:.1f} MiB per GPU",
            f"- SHARD_OPTIMIZER=true: {zero['optimizer_state_bytes'] / 2**20:.1f} MiB per GPU "
            f"({zero['optimizer_state_bytes'] / plain['optimizer_state_bytes']:.3f} of it; "
            f"1/{n} = {1 / n:.3f}), step {zero['step_s'] * 1e3:.2f} ms vs "
            f"{plain['step_s'] * 1e3:.2f} ms"]


def gpu_counts(text: str) -> list[int]:
    counts = sorted({int(c) for c in text.split(",") if c.strip()})
    if not counts or counts[0] < 2:
        raise SystemExit(f"--gpus takes GPU counts of 2 or more, like 2 or 2,4 (got {text!r})")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", default="2", help="GPU counts to compare with one, like 2 or 2,4")
    ap.add_argument("--shapes", default="small,medium")
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--curve-steps", type=int, default=50)
    ap.add_argument("--out", default="scaling.md")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    counts = gpu_counts(args.gpus)
    results: dict[str, Any] = {}
    lines = [f"# Data-parallel scaling: 1 vs {args.gpus} GPUs", "",
             f"Command: `python benchmarks/scaling.py --gpus {args.gpus} --shapes {args.shapes} "
             f"--precision {args.precision} --steps {args.steps} --repeats {args.repeats} "
             f"--curve-steps {args.curve_steps}`", ""]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        lines += throughput(list(filter(None, args.shapes.split(","))), counts, args.precision,
                            args.steps, args.repeats, tmp, results)
        for n in counts:
            lines += equivalence(n, args.curve_steps, tmp, results)
            lines += zero_state(n, args.precision, tmp, results)
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
