"""Every cuDNN plan of GPT-2's attention backward (B16 H12 T1024 D64 bf16, causal, in the
layout rustyflow passes: q, k, v views of the packed (B, T, 3, H, D) qkv; o, dO (B, T, H, D)
seen as (B, H, T, D)): each plan's time and its kernels (CUPTI), to see whether any plan
avoids compute_dot_do_o and convert_dq (issue #44, item 4)."""
import cupy as cp
import numpy as np

from rustyflow_py.engine.cupti_trace import CuptiTracer
from rustyflow_py.engine.ops.attention import cudnn as rc
from rustyflow_py.engine.precision import bfloat16

cudnn = rc.load()
bf = bfloat16()
B, H, T, D = 16, 12, 1024, 64
rng = np.random.default_rng(0)


def dev(shape):
    return cp.asarray((rng.standard_normal(shape) * 0.5).astype(bf))


qkv = dev((B, T, 3, H, D))
q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
o, do = (dev((B, T, H, D)).transpose(0, 2, 1, 3) for _ in range(2))
lse = cp.asarray(rng.standard_normal((B, H, T)).astype(np.float32) + 5)
dqkv = cp.empty_like(qkv)
dq, dk, dv = (dqkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
scale = D ** -0.5
handle = cudnn.create_handle()
cudnn.set_stream(handle, cp.cuda.get_current_stream().ptr)
tracer = CuptiTracer()
for modes in (["A"], ["B"], ["FALLBACK"]):
    g = cudnn.pygraph(handle=handle, io_data_type=cudnn.data_type.BFLOAT16,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT)
    ts = rc._tensors(g, {"q": (rc.UID_Q, q), "k": (rc.UID_K, k), "v": (rc.UID_V, v),
                         "o": (rc.UID_O, o), "dO": (rc.UID_DO, do)})
    outs = g.sdpa_backward(name="b", q=ts[0], k=ts[1], v=ts[2], o=ts[3], dO=ts[4],
                           stats=rc._stats(g, cudnn, lse), attn_scale=scale,
                           use_causal_mask=True)
    for t, uid, a in zip(outs, (rc.UID_DQ, rc.UID_DK, rc.UID_DV), (dq, dk, dv), strict=True):
        rc._output(t, uid, a)
    try:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in modes])
        g.check_support()
        g.build_plans(cudnn.build_plan_policy.ALL)
    except Exception as exc:  # noqa: BLE001
        print(modes, "no plans:", str(exc)[:200])
        continue
    n = g.get_execution_plan_count()
    print(f"heur {modes}: {n} plans")
    ptrs = {rc.UID_Q: q.data.ptr, rc.UID_K: k.data.ptr, rc.UID_V: v.data.ptr,
            rc.UID_O: o.data.ptr, rc.UID_DO: do.data.ptr, rc.UID_DQ: dq.data.ptr,
            rc.UID_DK: dk.data.ptr, rc.UID_DV: dv.data.ptr, rc.UID_STATS: lse.data.ptr}
    for i in range(n):
        try:
            ws_size = int(g.get_workspace_size_plan_at_index(i))
            ws = cp.empty(max(ws_size, 1), cp.uint8)
            name = g.get_plan_name_at_index(i)

            def run(i=i, ws=ws, g=g, ptrs=ptrs):
                g.execute_plan_at_index(ptrs, ws.data.ptr, index=i, handle=handle)

            run()
            cp.cuda.Device().synchronize()
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(20):
                run()
            stop.record()
            stop.synchronize()
            ms = cp.cuda.get_elapsed_time(start, stop) / 20
            recs = tracer.records(run, cp.cuda.Device().synchronize)
            kern = ", ".join(f"{r.name[:60]} {(r.end_ns - r.start_ns) / 1e3:.0f}us" for r in recs)
            print(f"  plan {i} {name}: {ms:.3f} ms, workspace {ws_size} B; {kern}")
        except Exception as exc:  # noqa: BLE001
            print(f"  plan {i}: failed {str(exc)[:150]}")
