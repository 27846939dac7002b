"""CPU all-reduce of the flat gradient buffer: MPI's Allreduce against a gather to rank 0.

Before MPI, a CPU data-parallel run summed its gradient with a star of TCP sockets: every
rank sent its whole buffer to rank 0, rank 0 added them in rank order and sent the sum back
to each. That pattern is kept here, and only here, so the two can be compared on the same
buffers in one run: rank 0's link carries 2 x (ranks - 1) buffers per all-reduce, where MPI's
ring / recursive-halving algorithms move about 2 x (ranks - 1) / ranks of one buffer per rank.

The buffers are the flat fp32 gradients of the benchmark shapes (small, medium) at
WikiText-2's vocabulary. Each size is timed `--repeats` times after a warm-up, ranks lined
up by a barrier before each; the table keeps the best (the least disturbed by other work).

    python benchmarks/cpu_collectives.py --ranks 2,4 \
        --out benchmarks/results/cpu-collectives-<machine>.md
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rustyflow_py.distributed.launcher import find_mpiexec  # noqa: E402
from rustyflow_py.model.gpt import GPTConfig, init_weights  # noqa: E402

SHAPES = {"small": (6, 6, 384, 256), "medium": (12, 12, 768, 512)}  # layers, heads, embed, T
VOCAB = 33278  # WikiText-2's
_LENGTH = struct.Struct("!Q")


def buffer_sizes() -> dict[str, int]:
    """Parameters (= gradient elements) of each shape."""
    sizes = {}
    for name, (layers, heads, embed, seq_len) in SHAPES.items():
        weights = init_weights(GPTConfig(VOCAB, seq_len, layers, heads, embed), 0)
        sizes[name] = sum(w.size for w in weights.values())
    return sizes


# ---- the gather-to-rank-0 star (the removed socket transport's algorithm) --------------------
class Star:
    """TCP connections from every rank to rank 0; rank 0's port travels over MPI."""

    def __init__(self, comm: Any) -> None:
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.peers: list[socket.socket] = []
        if self.rank == 0:
            listener = socket.create_server(("127.0.0.1", 0), backlog=self.size)
            comm.bcast(listener.getsockname()[1], root=0)
            by_rank = {}
            for _ in range(self.size - 1):
                sock, _ = listener.accept()
                by_rank[struct.unpack("!I", _recv(sock, 4))[0]] = sock
            self.peers = [by_rank[r] for r in sorted(by_rank)]
            listener.close()
        else:
            port = comm.bcast(None, root=0)
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(struct.pack("!I", self.rank))
            self.peers = [sock]
        for sock in self.peers:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def all_reduce(self, x: np.ndarray, scratch: np.ndarray) -> None:
        """x <- the sum over ranks: gather at rank 0, add in rank order, send back."""
        view = memoryview(x).cast("B")
        if self.rank == 0:
            for sock in self.peers:
                _recv_frame(sock, memoryview(scratch).cast("B"))
                x += scratch
            for sock in self.peers:
                sock.sendall(_LENGTH.pack(x.nbytes))
                sock.sendall(view)
        else:
            self.peers[0].sendall(_LENGTH.pack(x.nbytes))
            self.peers[0].sendall(view)
            _recv_frame(self.peers[0], view)

    def close(self) -> None:
        for sock in self.peers:
            sock.close()


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("peer closed")
        data += chunk
    return data


def _recv_frame(sock: socket.socket, into: memoryview) -> None:
    (length,) = _LENGTH.unpack(_recv(sock, _LENGTH.size))
    assert length == len(into), (length, len(into))
    done = 0
    while done < length:
        got = sock.recv_into(into[done:])
        if not got:
            raise EOFError("peer closed")
        done += got


# ---- one rank --------------------------------------------------------------------------------
def worker(out: str, warmup: int, repeats: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    star = Star(comm)
    rows = []
    for name, n in buffer_sizes().items():
        x = np.empty(n, np.float32)
        scratch = np.empty_like(x)
        want = sum(range(1, size + 1))
        for method in ("mpi", "star"):
            times = []
            for i in range(warmup + repeats):
                x.fill(rank + 1)
                comm.Barrier()
                start = time.perf_counter()
                if method == "mpi":
                    comm.Allreduce(MPI.IN_PLACE, x)
                else:
                    star.all_reduce(x, scratch)
                took = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                assert x[0] == want and x[-1] == want, (method, x[0], want)
                if i >= warmup:
                    times.append(took)
            rows.append({"shape": name, "params": n, "bytes": x.nbytes, "method": method,
                         "best_s": min(times), "median_s": float(np.median(times))})
    star.close()
    if rank == 0:
        Path(out).write_text(json.dumps({"ranks": size, "rows": rows,
                                         "mpi": " ".join(MPI.Get_library_version().split()[:3])}))


# ---- the driver ------------------------------------------------------------------------------
def run_ranks(ranks: int, warmup: int, repeats: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"ranks{ranks}.json"
    cmd = [find_mpiexec(), "-n", str(ranks), sys.executable, __file__, "--worker", str(out),
           "--warmup", str(warmup), "--repeats", str(repeats)]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = ["| ranks | shape | buffer (MiB) | MPI Allreduce best (ms) | gather to rank 0 best "
             "(ms) | speed-up | MPI median (ms) | gather median (ms) | MPI bus bandwidth "
             "(GB/s) |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        n = res["ranks"]
        by = {(r["shape"], r["method"]): r for r in res["rows"]}
        for shape in SHAPES:
            mpi, star = by[(shape, "mpi")], by[(shape, "star")]
            # bus bandwidth as NCCL's tests define it: 2 (n - 1) / n of the buffer per time
            bus = 2 * (n - 1) / n * mpi["bytes"] / mpi["best_s"] / 1e9
            lines.append(f"| {n} | {shape} | {mpi['bytes'] / 2**20:.1f} | "
                         f"{mpi['best_s'] * 1e3:.1f} | {star['best_s'] * 1e3:.1f} | "
                         f"{star['best_s'] / mpi['best_s']:.2f}x | {mpi['median_s'] * 1e3:.1f} | "
                         f"{star['median_s'] * 1e3:.1f} | {bus:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="cpu-collectives.md")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.warmup, args.repeats)
        return
    with tempfile.TemporaryDirectory() as tmp:
        results = [run_ranks(int(n), args.warmup, args.repeats, Path(tmp))
                   for n in args.ranks.split(",")]
    command = (f"python benchmarks/cpu_collectives.py --ranks {args.ranks} --warmup "
               f"{args.warmup} --repeats {args.repeats} --out {args.out}")
    text = "\n".join([
        "# CPU all-reduce of the flat gradient buffer: MPI vs gather to rank 0", "",
        f"Command: `{command}`", "",
        f"Machine: {platform.machine()}, {_cpus()} cores, Python {platform.python_version()}, "
        f"{results[0]['mpi']}, numpy {np.__version__}; ranks are processes on this one "
        "machine (MPI moves the bytes through shared memory, the star through loopback TCP).",
        "", *table(results), ""]) + "\n"
    Path(args.out).write_text(text)
    print(text)


def _cpus() -> str:
    import os

    return str(len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
