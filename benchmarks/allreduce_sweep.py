"""NCCL all-reduce bus bandwidth against message size, on the GPUs of this machine.

The scaling model (`benchmarks/scaling_model.py`) needs what an all-reduce of each bucket
costs; this measures it the way the trainer runs it: MPI ranks started by `mpiexec` (through
the trainer's own launcher), one per GPU, NCCL through CuPy, the communicator built by the
trainer's `NcclCommunicator` (its NCCL-id broadcast over MPI). Sizes run from 1 KiB to 1 GiB
in powers of 4, in bf16 and fp32. Each size is timed with CUDA events over `--iters`
back-to-back all-reduces after a warm-up, ranks lined up by a barrier first; the slowest
rank's time counts (a collective ends when its last rank does).

Bus bandwidth is nccl-tests' convention: algbw = bytes / time, busbw = algbw x 2 (n - 1) / n,
the rate each GPU's links carry in a ring, comparable across GPU counts.

    python benchmarks/allreduce_sweep.py --gpus 4 --out benchmarks/results/allreduce-h100x4.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's package, installed or not

from rustyflow_py.distributed.launcher import launch  # noqa: E402

DTYPE_BYTES = {"bf16": 2, "fp32": 4}
KIB, GIB = 2**10, 2**30


def sizes(lo: int = KIB, hi: int = GIB, factor: int = 4) -> list[int]:
    """Message sizes in bytes from lo to hi, each `factor` times the last."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all-reduce of `nbytes` per rank taking `seconds`."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def point(dtype: str, nbytes: int, seconds: float, ranks: int) -> dict[str, Any]:
    """One row of the sweep's JSON."""
    algbw, busbw = bus_bandwidth(nbytes, seconds, ranks)
    return {"dtype": dtype, "bytes": nbytes, "ms": seconds * 1e3, "algbw_gbs": algbw,
            "busbw_gbs": busbw}


def sweep_json(points: list[dict[str, Any]], ranks: int, machine: str,
               versions: dict[str, str]) -> dict[str, Any]:
    """The file scaling_model.py reads: the measured points and where they were taken."""
    return {"kind": "allreduce_sweep", "gpus": ranks, "machine": machine,
            "versions": versions, "timing": "CUDA events, slowest rank, mean of the iters",
            "points": points}


# ---- the worker: one rank -------------------------------------------------------------------
def worker(spec: dict[str, Any]) -> None:
    import cupy
    from cupy.cuda import nccl

    from rustyflow_py.distributed.comm import NcclCommunicator
    from rustyflow_py.distributed.mpi import load_mpi
    from rustyflow_py.distributed.world import World
    from rustyflow_py.engine.backend import device_name
    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.precision import bfloat16

    world = World.from_env()
    mpi = load_mpi()
    backend = get_backend(device_name("gpu", world.local_rank))
    comm = NcclCommunicator(backend, mpi.COMM_WORLD)
    dtypes = {"bf16": bfloat16(), "fp32": cupy.dtype("float32")}
    points = []
    for name in spec["dtypes"]:
        for nbytes in spec["sizes"]:
            x = cupy.zeros(nbytes // DTYPE_BYTES[name], dtype=dtypes[name])
            for _ in range(spec["warmup"]):
                comm.all_reduce(x)
            comm.barrier()
            start, end = backend.new_event(), backend.new_event()
            backend.record(start)
            for _ in range(spec["iters"]):
                comm.all_reduce(x)
            backend.record(end)
            end.synchronize()
            mine = backend.elapsed(start, end) / spec["iters"]
            slowest = mpi.COMM_WORLD.allreduce(mine, op=mpi.MAX)
            points.append(point(name, nbytes, slowest, world.size))
            del x
    if world.main:
        versions = {"cupy": cupy.__version__, "nccl": str(nccl.get_version()),
                    "mpi": mpi.Get_library_version().splitlines()[0].strip()}
        machine = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        Path(spec["out"]).write_text(json.dumps(sweep_json(points, world.size, machine,
                                                           versions), indent=1))
    comm.close(clean=True)


def table(data: dict[str, Any]) -> str:
    """The sweep as a markdown table (what the run prints last)."""
    lines = [f"All-reduce on {data['gpus']} x {data['machine']}", "",
             "| dtype | bytes | ms | algbw GB/s | busbw GB/s |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {p['dtype']} | {p['bytes']:,} | {p['ms']:.4f} | {p['algbw_gbs']:.1f} | "
              f"{p['busbw_gbs']:.1f} |" for p in data["points"]]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, default=2, help="ranks, one per GPU (2 or more)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--max-bytes", type=int, default=GIB)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="allreduce-sweep.json")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPE_BYTES]
    if args.gpus < 2 or unknown:
        raise SystemExit(f"Error: --gpus takes 2 or more (got {args.gpus}) and --dtypes "
                         f"bf16 and/or fp32 (got {args.dtypes}): pass e.g. --gpus 4 "
                         f"--dtypes bf16,fp32")
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp, "sweep.json")
        spec = {"dtypes": dtypes, "sizes": sizes(hi=args.max_bytes), "warmup": args.warmup,
                "iters": args.iters, "out": str(part)}
        started = time.perf_counter()
        code = launch([sys.executable, __file__, "--worker", json.dumps(spec)], args.gpus, print)
        if code != 0 or not part.is_file():
            raise SystemExit(f"Error: the sweep on {args.gpus} GPUs failed (exit {code}); "
                             "its ranks' lines are above")
        data = json.loads(part.read_text())
    data["wall_s"] = time.perf_counter() - started
    Path(args.out).write_text(json.dumps(data, indent=1))
    print(table(data))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
