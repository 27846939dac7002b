"""Does NCCL's zero-copy (registered) all-reduce disturb overlapped compute less?
mpirun -n 2 python3 regbench.py MODE   MODE: cuda (cudaMalloc) | ncclmem (ncclMemAlloc)
Times, in one CUDA graph each: compute alone, the bucketed all-reduce alone, both overlapped."""
import ctypes
import re
import sys

import cupy as cp
import numpy as np
from cupy.cuda import nccl
from mpi4py import MPI

mode = sys.argv[1]
world = MPI.COMM_WORLD
rank = world.rank
cp.cuda.Device(rank).use()
uid = world.bcast(nccl.get_unique_id() if rank == 0 else None)
nc = nccl.NcclCommunicator(world.size, uid, rank)
libpath = next(m.group(1) for line in open("/proc/self/maps")
               if (m := re.search(r"(/\S*libnccl\.so\S*)", line)))
lib = ctypes.CDLL(libpath)
if rank == 0:
    print("libnccl", libpath, "version", nccl.get_version(), flush=True)

N = 124_000_000  # GPT-2's gradient, fp32
keep = []
def buffer(n, dtype):
    nbytes = n * np.dtype(dtype).itemsize
    if mode == "cuda":
        return cp.zeros(n, dtype)
    p = ctypes.c_void_p()
    rc = lib.ncclMemAlloc(ctypes.byref(p), ctypes.c_size_t(nbytes))
    assert rc == 0, rc
    mem = cp.cuda.UnownedMemory(p.value, nbytes, None)
    keep.append(p)
    a = cp.ndarray((n,), dtype, cp.cuda.MemoryPointer(mem, 0))
    a.fill(0)
    return a

grad = buffer(N, np.float32)
grad.fill(1.0)
bucket = 25 * 2**20 // 4
spans = [(a, min(a + bucket, N)) for a in range(0, N, bucket)]
# compute: bf16 GEMMs and a memory-bound pass, as backward has
fma = cp.RawKernel(r"""extern "C" __global__ void burn(float* x, int n, int it) {
  int i = blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;
  float a = x[i], b = 1.0001f;
  for (int k = 0; k < it; ++k) { a = a * b + 0.5f; b = b * a - 0.25f; }
  x[i] = a + b; }""", "burn")
Z = cp.ones(132 * 2048 * 4, cp.float32)
X = cp.random.rand(64 * 2**20).astype(cp.float32)
Y = cp.empty_like(X)

main = cp.cuda.Stream(non_blocking=True)
side = cp.cuda.Stream(non_blocking=True)
fork, join = cp.cuda.Event(disable_timing=True), cp.cuda.Event(disable_timing=True)

def compute():
    for _ in range(12):
        fma(((Z.size + 255) // 256,), (256,), (Z, np.int32(Z.size), np.int32(4000)))
        cp.multiply(X, 1.0001, out=Y)

def reduce():
    for a, b in spans:
        nc.allReduce(grad[a:b].data.ptr, grad[a:b].data.ptr, b - a, nccl.NCCL_FLOAT32,
                     nccl.NCCL_SUM, side.ptr)

def capture(what):
    with main:
        main.begin_capture()
        fork.record(main)
        side.wait_event(fork)
        if "c" in what:
            compute()
        if "r" in what:
            reduce()
        join.record(side)
        main.wait_event(join)
        return main.end_capture()

with main:
    compute()
reduce()
cp.cuda.Device().synchronize()
graphs = {w: capture(w) for w in ("c", "r", "cr")}
world.Barrier()
res = {}
for w, g in graphs.items():
    for _ in range(3):
        g.launch(main)
    main.synchronize()
    t = []
    for _ in range(20):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record(main)
        g.launch(main)
        e.record(main)
        e.synchronize()
        t.append(cp.cuda.get_elapsed_time(s, e))
    res[w] = float(np.median(t))
world.Barrier()
if rank == 0:
    c, r, cr = res["c"], res["r"], res["cr"]
    print(f"{mode}: compute {c:.3f} ms, all-reduce {r:.3f} ms ({N*4/r/1e6:.0f} GB/s algbw), "
          f"overlapped {cr:.3f} ms = compute + {cr - c:.3f} ms", flush=True)
