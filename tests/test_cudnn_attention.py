"""cuDNN's fused attention (ops/attention/cudnn.py, ATTENTION=cudnn and auto's first choice):
against materialised float64 attention, the flash kernels' lse convention both ways, strided
views written in place, CUDA-graph capture, and a training run. The GPU tests skip without
CUDA or without cuDNN (saying which); the config's refusals and the missing-frontend error
run on the CPU."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
import pytest
from helpers import make_cfg
from test_flash_attention import (
    LSE_TOL,
    TOL,
    _heads,
    _inputs,
    _packed,
    _reference,
    _rel_err,
    assert_matches,
    needs_gpu,
)

from rustyflow_py.engine.ops.attention import cudnn
from rustyflow_py.engine.ops.attention import flash as fa
from rustyflow_py.errors import ConfigError


def _cudnn_reason() -> str | None:
    try:
        cudnn.load()
    except cudnn.CudnnUnavailable as exc:
        return str(exc)
    return None


_CUDNN_REASON = _cudnn_reason()
needs_cudnn = pytest.mark.skipif(_CUDNN_REASON is not None, reason=str(_CUDNN_REASON))
DTYPES = ("float16", "bfloat16")


@pytest.fixture(scope="module")
def cp() -> Any:
    return pytest.importorskip("cupy")


# ---- on the CPU -------------------------------------------------------------------------------
def test_without_the_frontend_attention_cudnn_names_the_extra(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` raises ImportError
    cudnn.load.cache_clear()
    cudnn.available.cache_clear()
    try:
        with pytest.raises(cudnn.CudnnUnavailable, match=r"install -e .*\[cudnn\].*ATTENTION=own"):
            cudnn.load()
        assert not cudnn.available()
    finally:
        cudnn.load.cache_clear()
        cudnn.available.cache_clear()


@pytest.mark.parametrize(("changes", "message"), [
    ({"PRECISION": "fp32"}, r"16-bit inputs, but PRECISION=fp32 .*set PRECISION=bf16"),
    ({"PRECISION": "bf16", "DROPOUT": 0.1}, r"attention dropout is 0.1 .*ATTN_DROPOUT=0"),
    ({"PRECISION": "bf16", "EMBED_DIM": 36, "NUM_HEADS": 3},
     r"multiples of 8 up to 128, but EMBED_DIM/NUM_HEADS = 12"),
])
@pytest.mark.usefixtures("tiny_dir")
def test_the_config_refuses_runs_cudnn_cannot_serve(changes: dict[str, Any], message: str
                                                    ) -> None:
    with pytest.raises(ConfigError, match=message):
        make_cfg(ATTENTION="cudnn", **changes)


@pytest.mark.usefixtures("tiny_dir")
def test_the_config_takes_a_run_cudnn_serves() -> None:
    cfg = make_cfg(ATTENTION="cudnn", PRECISION="bf16", DROPOUT=0.1, ATTN_DROPOUT=0.0)
    assert cfg.attention == "cudnn"


def test_supports_16_bit_head_dims_in_eights() -> None:
    assert cudnn.supports(np.float16, 64) and cudnn.supports(np.float16, 128)
    assert not cudnn.supports(np.float32, 64) and not cudnn.supports(np.float16, 12)
    assert not cudnn.supports(np.float16, 136)


# ---- on the GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_gpu
@needs_cudnn
@pytest.mark.parametrize(("t", "d"), [(64, 64), (256, 64), (100, 32), (130, 128)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_materialised_attention(cp: Any, dtype: str, t: int, d: int) -> None:
    b, h = 2, 3
    (q, k, v, do), ref_in = _inputs(cp, dtype, (b, h, t, d), seed=t * 1000 + d)
    scale = 1.0 / math.sqrt(d)
    o, lse = cudnn.cudnn_attention_forward(q, k, v, scale)
    dq, dk, dv = cudnn.cudnn_attention_backward(q, k, v, o, do, lse, scale)
    assert_matches(dtype, q, (o, lse, dq, dk, dv), _reference(cp, *ref_in, scale, None))


@pytest.mark.gpu
@needs_gpu
@needs_cudnn
@pytest.mark.parametrize("dtype", DTYPES)
def test_views_in_place_and_the_lse_is_flashs(cp: Any, dtype: str) -> None:
    """Packed q, k, v and (B, T, E) views are read and written in place; the lse equals the
    flash kernel's, and each backward takes the other's forward."""
    b, h, t, d = 2, 3, 128, 64
    q, k, v, do = _packed(cp, dtype, (b, h, t, d), seed=3)
    o_view = cp.empty((b, t, h, d), dtype=q.dtype).transpose(0, 2, 1, 3)
    views = _heads(cp.empty((b, t, 3, h, d), dtype=q.dtype))
    o, lse = cudnn.cudnn_attention_forward(q, k, v, 0.125, out=o_view)
    grads = cudnn.cudnn_attention_backward(q, k, v, o, do, lse, 0.125, out=tuple(views))
    for got, view in zip((o, *grads), (o_view, *views), strict=True):
        assert got.data.ptr == view.data.ptr and got.strides == view.strides
    fo, flse = fa.flash_attention_forward(q, k, v, 0.125)
    assert float(cp.abs(lse - flse).max()) < LSE_TOL[dtype]
    mixed = cudnn.cudnn_attention_backward(q, k, v, fo, do, flse, 0.125)
    own = fa.flash_attention_backward(q, k, v, o, do, lse, 0.125)
    for name, a, b_, c in zip("qkv", grads, mixed, own, strict=True):
        assert _rel_err(b_, a) < TOL[dtype] and _rel_err(c, a) < TOL[dtype], name


@pytest.mark.gpu
@needs_gpu
@needs_cudnn
def test_a_captured_graph_replays_on_new_inputs(cp: Any) -> None:
    """Planned eagerly, then captured: a replay reads the buffers' new values and writes what
    an eager call gives; an unplanned shape inside a capture is a clear error."""
    from rustyflow_py.engine.graph import CapturedStep, GraphCaptureError
    from rustyflow_py.engine.library import get_backend

    backend = get_backend("gpu")
    backend.make_current()
    (q, k, v, do), _ = _inputs(cp, "bfloat16", (2, 3, 128, 64), seed=9)
    out: dict[str, Any] = {}

    def step() -> None:
        out["o"], out["lse"] = cudnn.cudnn_attention_forward(q, k, v, 0.125)
        out["grads"] = cudnn.cudnn_attention_backward(q, k, v, out["o"], do, out["lse"], 0.125)

    step()  # plans both passes
    graph = CapturedStep(backend, step)
    graph.capture()
    for x in (q, k, v, do):
        x[...] = cp.asarray(np.random.default_rng(1).standard_normal(x.shape), x.dtype)
    graph.replay()
    backend.synchronize()
    o, lse = cudnn.cudnn_attention_forward(q, k, v, 0.125)
    assert cp.array_equal(out["o"], o) and cp.array_equal(out["lse"], lse)
    grads = cudnn.cudnn_attention_backward(q, k, v, o, do, lse, 0.125)
    for got, want in zip(out["grads"], grads, strict=True):  # dq: atomics, so not bit-exact
        assert _rel_err(got, want) < 1e-2
    (q2, k2, v2, _), _ = _inputs(cp, "bfloat16", (2, 3, 96, 64), seed=2)
    with pytest.raises(GraphCaptureError, match="run this shape once eagerly first"):
        CapturedStep(backend, lambda: cudnn.cudnn_attention_forward(q2, k2, v2, 0.125)).capture()


@pytest.mark.gpu
@needs_gpu
@needs_cudnn
@pytest.mark.usefixtures("tiny_dir")
def test_training_with_cudnn_follows_the_own_kernel() -> None:
    """ATTENTION=cudnn, own and auto train the same bf16 model to losses within bf16's
    noise; auto takes cuDNN where it is installed and the step is a replayed graph, and the
    own kernel under GRAPH=off."""
    from helpers import quiet

    from rustyflow_py.training.run.loop import Trainer

    losses = {}
    for mode, graph, on_cudnn in (("own", "auto", False), ("cudnn", "auto", True),
                                  ("auto", "auto", True), ("auto", "off", False)):
        trainer = Trainer(make_cfg(DEVICE="gpu", PRECISION="bf16", NUM_HEADS=2, EMBED_DIM=64,
                                   MAX_STEPS=20, ATTENTION=mode, GRAPH=graph,
                                   MODEL_PATH=f"models/{mode}-{graph}.npz"), quiet)
        record = trainer.run()
        losses[mode, graph] = np.array(trainer.losses)
        path = trainer.backend.kernels.attention_path(np.float16, 32, 16, False)
        assert path == ("cudnn" if on_cudnn else "flash"), (mode, graph)
        assert record is not None and record["attention"] == path  # the record says which
    assert all(np.isfinite(run).all() for run in losses.values())
    for run in losses:
        np.testing.assert_allclose(losses[run], losses["own", "auto"], rtol=2e-2, err_msg=run)
