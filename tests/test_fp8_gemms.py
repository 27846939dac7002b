"""PRECISION=fp8: the policy and its refusals (CPU), and on a GPU with FP8 tensor cores the
transposing cast bit for bit against the NumPy recipe, the FP8 GEMMs of gemm/fp8.py against
a float64 product of the same quantised operands in every layout a step uses, and the ops
(Linear, MLP, the tied LM head) running their GEMMs in FP8 inside a training step."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine import peaks
from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.ops.fp8.formats import E4M3, E5M2, FORMATS, decode, quantize
from rustyflow_py.engine.precision import Precision, check_fp8_gemms, has_fp8_gemms
from rustyflow_py.errors import ConfigError

F32 = np.dtype(np.float32)


def bf16() -> np.dtype:
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)


# ---- the policy (CPU) -------------------------------------------------------------------------
def test_fp8_is_bf16_with_fp8_gemms() -> None:
    p = Precision.of("fp8")
    assert (p.storage, p.compute, p.accumulate, p.matmul_compute) == (F32, bf16(), F32, "fp8")
    assert p.mixed and not p.loss_scaling


@pytest.mark.parametrize("gpu, capability", [("NVIDIA A100-SXM4-80GB", (8, 0)),
                                             ("Tesla V100-SXM2-16GB", (7, 0)),
                                             ("NVIDIA GeForce RTX 3090", (8, 6))])
def test_fp8_is_refused_before_fp8_tensor_cores(gpu: str, capability: tuple[int, int]) -> None:
    major, minor = capability
    with pytest.raises(ConfigError, match=f"PRECISION=fp8 needs FP8 tensor cores.*{gpu}, is "
                                          f"{major}.{minor}: train with PRECISION=bf16"):
        check_fp8_gemms(gpu, capability)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0)])
def test_fp8_is_taken_from_ada_on(capability: tuple[int, int]) -> None:
    check_fp8_gemms("a GPU", capability)  # no error


@pytest.mark.usefixtures("tiny_dir")
@pytest.mark.parametrize("device, capability, runs", [
    ("gpu", (8, 0), "bf16"), ("gpu:1", (8, 6), "bf16"), ("gpu", (8, 9), "fp8"),
    ("gpu", (9, 0), "fp8"), ("cpu", None, "fp8")])
def test_an_fp8_checkpoint_evaluates_in_bf16_where_fp8_is_missing(
        monkeypatch: pytest.MonkeyPatch, device: str, capability: tuple[int, int] | None,
        runs: str) -> None:
    """Evaluation and generation load a checkpoint with its PRECISION: a model trained in
    fp8 still loads on a GPU without FP8 tensor cores, its GEMMs in bf16 (the CPU runs
    float32 whatever the policy says)."""
    bf16()
    from helpers import make_cfg

    from rustyflow_py.training.evaluation import evaluate

    asked: list[int | None] = []

    def gpu_capability(index: int | None = None) -> tuple[int, int]:
        asked.append(index)
        assert capability is not None, "the CPU has no GPU capability to read"
        return capability

    monkeypatch.setattr(evaluate, "gpu_capability", gpu_capability)
    policy = evaluate.load_policy(make_cfg(PRECISION="fp8"), 0, device)
    assert policy.precision.name == runs
    assert asked == ([] if device == "cpu" else [int(device.partition(":")[2] or 0)])
    bf16_policy = evaluate.load_policy(make_cfg(PRECISION="bf16"), 0, device)
    assert bf16_policy.precision.name == "bf16" and len(asked) <= 1  # only fp8 asks


def test_fp8_gemms_are_held_to_the_fp8_peak() -> None:
    assert peaks.compute_type("bfloat16", "fp8") == "fp8"
    assert peaks.compute_type("bfloat16", "bf16") == "bf16"
    assert peaks.compute_type("float32", "fp8") == "fp32"  # the optimizer's float32 GEMMs
    h100 = peaks.lookup("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert h100["tflops"]["fp8"] == pytest.approx(2 * h100["tflops"]["bf16"], rel=1e-3)


CAST = ("linear x", E4M3, (16, 32))  # a cast's tensor, format and shape


class FakeStream:
    capturing = False

    def is_capturing(self) -> bool:
        return self.capturing


def test_delayed_scaling_sites_follow_the_warm_up_steps_casts() -> None:
    """FP8_SCALING=delayed: before the first capture each eager cast measures its amax into
    the site row of its number; the capture's casts take the rows from 0 again, in the same
    order, so each is seeded by the warm-up step's amax of the same cast; eager casts after
    it are current; a later capture takes the rows after the first's. Each capture counts
    its replays in a count of its own, adding 1 as its first kernel."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    stream = FakeStream()
    lt = SimpleNamespace(stream=stream, xp=np)
    gemms = Fp8Gemms(lambda: lt, delayed=True)
    eager = [gemms.sites.scaling(*CAST) for _ in range(3)]  # the warm-up step's casts
    assert all(s.site is None for s in eager)
    for i, s in enumerate(eager):
        s.amax[0] = 10.0 + i  # what each measured
        assert np.shares_memory(s.amax, gemms.sites.rows[i])
    stream.capturing = True
    captured = [gemms.sites.scaling(*CAST) for _ in range(3)]
    # seeded, in order, in the slot the first replay reads (slot 0: its count becomes 1)
    assert [float(s.site[0]) for s in captured] == [10.0, 11.0, 12.0]
    assert all(np.shares_memory(s.replay, gemms.sites.replays[0:1]) for s in captured)
    assert list(gemms.sites.replays[:2]) == [1, 0]  # the capture's first kernel added 1
    stream.capturing = False
    assert gemms.sites.scaling(*CAST) is cuda.CURRENT  # eager after the capture
    stream.capturing = True
    later = gemms.sites.scaling(*CAST)
    assert np.shares_memory(later.site, gemms.sites.rows[3])  # after the first's
    assert np.shares_memory(later.replay, gemms.sites.replays[1:2]) and gemms.sites.replays[1] == 1
    gemms.sites._counts = len(gemms.sites.replays)  # every count taken: the next capture is current
    stream.capturing = False
    gemms.sites.scaling(*CAST)
    stream.capturing = True
    assert gemms.sites.scaling(*CAST).site is None and gemms.sites._capture == -1
    current = Fp8Gemms(lambda: lt)  # FP8_SCALING=current: sites inside a capture only
    stream.capturing = False
    assert current.sites.scaling(*CAST) is cuda.CURRENT
    stream.capturing = True
    assert np.shares_memory(current.sites.scaling(*CAST).amax, current.sites.rows[0])


@pytest.mark.parametrize("delayed", [False, True], ids=["current", "delayed"])
def test_the_run_record_gets_each_captured_casts_amax_and_scale(delayed: bool) -> None:
    """Fp8Sites.tensors(): each cast of the captured step, in order, with what it is, its
    format and shape, the amax its site row kept from the last replay (current scaling:
    measured there; delayed: the slot the last replay filled, by its capture's count) and
    the scale that amax gives; nothing before a capture."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8.formats import scale_of
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    stream = FakeStream()
    gemms = Fp8Gemms(lambda: SimpleNamespace(stream=stream, xp=np), delayed=delayed)
    gemms.sites.scaling(*CAST)  # a warm-up cast
    assert gemms.sites.tensors() is None
    stream.capturing = True
    made = [gemms.sites.scaling("linear w", E4M3, (32, 48)),
            gemms.sites.scaling("gradient", E5M2, (16, 48))]
    stream.capturing = False
    for s, amax in zip(made, (0.5, 3000.0), strict=True):
        if delayed:  # the capture's count says 4 replays: the last filled slot 4 % 3
            s.site[:3] = [7.0, amax, 9.0]
            s.replay[0] = 4
        else:
            s.amax[0] = amax
    assert gemms.sites.tensors() == [
        {"tensor": "linear w", "format": "e4m3", "shape": [32, 48], "amax": 0.5,
         "scale": float(scale_of(0.5, E4M3))},
        {"tensor": "gradient", "format": "e5m2", "shape": [16, 48], "amax": 3000.0,
         "scale": float(scale_of(3000.0, E5M2))}]


def test_an_fp8_operand_holds_either_layout_or_both() -> None:
    """An Fp8Operand stands for a (R, C) array by its codes, its transpose's, or both: T swaps
    them, rows() gives the (R, C) codes in the format asked or refuses (so the GEMM runs in
    bf16), and dense() gives the same values whichever layout it reads."""
    from rustyflow_py.engine.ops.fp8.formats import Fp8Tensor
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLtUnsupported
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Operand

    values = np.random.default_rng(3).standard_normal((32, 48)).astype(np.float32)
    codes, scale_inv = quantize(values, E5M2)
    q = Fp8Tensor(codes, np.array([scale_inv]), E5M2)
    q_t = Fp8Tensor(np.ascontiguousarray(codes.T), q.scale_inv, E5M2)
    pair, rows_only, cols_only = (Fp8Operand(q, q_t, F32), Fp8Operand(q, None, F32),
                                  Fp8Operand(None, q_t, F32))
    want = decode(codes, E5M2) * float(scale_inv)
    for op in (pair, rows_only, cols_only):
        assert op.shape == (32, 48) and op.T.shape == (48, 32) and op.nbytes == 32 * 48
        np.testing.assert_array_equal(op.dense(np), want.astype(np.float32))
        np.testing.assert_array_equal(op.T.dense(np), want.T.astype(np.float32))
    assert pair.rows(E5M2) is q and pair.T.rows(E5M2) is q_t
    assert rows_only.rows(E5M2) is q and cols_only.T.rows(E5M2) is q_t
    with pytest.raises(CublasLtUnsupported, match=r"kept as e5m2 transposed, not e5m2 rows"):
        cols_only.rows(E5M2)
    with pytest.raises(CublasLtUnsupported, match=r"kept as e5m2, not e4m3 rows"):
        pair.rows(E4M3)
    # a block of rows (the head's logits a block at a time): its row codes, not a copy
    block = pair.block(slice(8, 24))
    assert block.shape == (16, 48) and block.q_t is None and block.q.scale_inv is q.scale_inv
    assert np.shares_memory(block.q.codes, codes)
    np.testing.assert_array_equal(block.dense(np), want[8:24].astype(np.float32))
    with pytest.raises(ValueError, match="row codes"):
        cols_only.block(slice(0, 8))


def test_the_gelu_backward_writes_codes_only_from_a_delayed_site(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fp8Gemms.gelu_backward: the GELU backward's own pass writes dpre's e5m2 codes only with
    FP8_SCALING=delayed, inside a capture, for a float32 bias-gradient buffer and bfloat16
    arrays the kernel takes; it then takes the site the separate cast of dpre takes in the
    eager warm-up step (the next in order), adds the pass's partial sums into the buffer,
    and gives both layouts as one Fp8Operand. Otherwise None, taking no site."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms, Fp8Operand

    made: list[Any] = []

    def fake_codes(g: Any, x: Any, bias: Any, scaling: Any) -> Any:
        made.append(scaling.site)
        q = SimpleNamespace(codes=np.zeros(g.shape, np.uint8))
        q_t = SimpleNamespace(codes=np.zeros(g.shape[::-1], np.uint8))
        return q, q_t, np.ones((3, g.shape[1]), np.float32)

    monkeypatch.setattr(cuda, "gelu_backward_codes", fake_codes)
    monkeypatch.setattr(cuda, "gelu_codes_fit", lambda g, x, bias: g.shape[0] % 16 == 0)
    stream = FakeStream()
    gemms = Fp8Gemms(lambda: SimpleNamespace(stream=stream, xp=np), delayed=True)
    dh = np.zeros((2, 16, 64), bf16())
    sums = np.zeros(64, np.float32)

    def add_rows(part: Any, into: Any) -> None:
        into += part.sum(axis=0)

    def backward(dh: Any = dh, sums: Any = sums) -> Any:
        return gemms.gelu_backward(dh, dh, None, sums, add_rows)

    for _ in range(2):
        gemms.sites.scaling(*CAST)  # the warm-up step's casts before dpre's
    assert backward() is None and gemms.sites.next_row == 2  # eager: no site taken
    stream.capturing = True
    gemms.sites.scaling(*CAST), gemms.sites.scaling(*CAST)  # the captured casts before dpre's
    out = backward()
    assert isinstance(out, Fp8Operand) and out.shape == (32, 64)
    assert len(made) == 1 and np.shares_memory(made[0], gemms.sites.rows[2])  # dpre's site
    np.testing.assert_array_equal(sums, np.full(64, 3.0))  # the partial sums, added
    for refused in (backward(sums=None), backward(sums=sums.astype(np.float64)),
                    backward(dh=np.zeros((2, 16, 64), np.float32)),
                    backward(dh=np.zeros((2, 4, 64), bf16())),
                    Fp8Gemms(gemms._lt).gelu_backward(dh, dh, None, sums, add_rows)):
        assert refused is None
    assert len(made) == 1 and gemms.sites.next_row == 3


def fake_casts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Host stand-ins for the FP8 casts, on NumPy arrays: each records its source shape
    (returned list) and gives codes named by their shape; _key reads NumPy's address."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm import fp8

    made: list[tuple[int, ...]] = []

    def both(x: Any, fmt: Any, scaling: Any) -> Any:
        made.append(x.shape)
        return SimpleNamespace(codes=x.shape), SimpleNamespace(codes=x.shape[::-1])

    def one(x: Any, fmt: Any, scaling: Any) -> Any:
        made.append(x.shape)
        return SimpleNamespace(codes=x.shape)

    for name, fake in (("quantize_both", both), ("quantize", one), ("quantize_t", one)):
        monkeypatch.setattr(cuda, name, fake)
    monkeypatch.setattr(fp8, "_key", lambda x: (x.__array_interface__["data"][0], x.shape,
                                                x.dtype.str))
    return made


def test_a_layernorm_before_a_linear_writes_the_codes_the_linear_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fp8Gemms.layernorm_forward: with FP8_SCALING=delayed, inside a capture, for bfloat16
    rows its kernel takes, the LayerNorm's pass writes y's e4m3 codes in both layouts, taking
    the site the linear's cast of y takes in the eager warm-up step (the next in order). The
    linear right after takes those codes and casts only its weight; any other GEMM first, or
    a linear of another x, drops them. Otherwise None, taking no site."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    ln_sites: list[Any] = []
    casts = fake_casts(monkeypatch)

    def fake_ln(x: Any, w: Any, b: Any, eps: float, scaling: Any) -> Any:
        ln_sites.append(scaling.site)
        stats = np.zeros((x.shape[0], 1), np.float32)
        return (x.copy(), stats, stats, SimpleNamespace(codes="y", fmt=E4M3),
                SimpleNamespace(codes="y^T", fmt=E4M3))

    monkeypatch.setattr(cuda, "layernorm_forward_codes", fake_ln)
    monkeypatch.setattr(cuda, "layernorm_codes_fit", lambda x, w, b: x.shape[0] % 32 == 0)
    taken: list[tuple[Any, Any]] = []
    stream = FakeStream()
    lt = SimpleNamespace(stream=stream, xp=np,
                         matmul_fp8=lambda qx, qw, y, **_: taken.append((qx.codes, qw.codes)))
    gemms = Fp8Gemms(lambda: lt, delayed=True)
    x, w, b = np.ones((2, 16, 64), bf16()), np.ones((64, 96), bf16()), np.zeros(96, bf16())
    lnw = np.ones(64, bf16())

    def layernorm(x: Any = x, gemms: Any = gemms) -> Any:
        return gemms.layernorm_forward(x, lnw, lnw, 1e-5)

    gemms.sites.scaling(*CAST)  # the warm-up step's cast before y's
    assert layernorm() is None and gemms.sites.next_row == 1  # eager: no site taken
    stream.capturing = True
    gemms.sites.scaling(*CAST)  # the captured cast before y's
    y, mean, rstd = layernorm()
    assert y.shape == x.shape and mean.shape == rstd.shape == (2, 16, 1)
    assert len(ln_sites) == 1 and np.shares_memory(ln_sites[0], gemms.sites.rows[1])
    gemms.linear(y, w, b)
    assert taken == [("y", (96, 64))] and casts == [(64, 96)]  # y's codes; only w cast
    assert gemms.sites.next_row == 3  # y's site, then w's: the eager step's order
    for other in ("matmul", "linear"):
        y, _, _ = layernorm()
        gemms.matmul(y, w) if other == "matmul" else gemms.linear(x, w, b)
        casts.clear()
        gemms.linear(y, w, b)  # the codes were dropped: y is cast
        assert casts == [(32, 64), (64, 96)]
    for refused in (layernorm(x=x.astype(np.float32)), layernorm(x=np.ones((2, 8, 64), bf16())),
                    layernorm(gemms=Fp8Gemms(gemms._lt))):
        assert refused is None


def test_a_layernorm_backward_writes_the_gradient_codes_the_next_layer_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fp8Gemms.layernorm_backward: with FP8_SCALING=delayed, inside a capture, LayerNorm's
    backward writes dx's e5m2 codes in both layouts, taking the site that the shared(dx)
    block of the layer before takes for dx's cast in the eager warm-up step. That block's
    GEMMs read them and cast nothing of dx; a GEMM in between drops them, and a linear of dx
    casts it (its x is e4m3). Otherwise None."""
    from types import SimpleNamespace

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    sites: list[Any] = []
    casts = fake_casts(monkeypatch)

    def fake_ln(g: Any, x: Any, w: Any, mean: Any, rstd: Any, res: Any, scaling: Any) -> Any:
        sites.append(scaling.site)
        part = np.zeros((x.shape[0] // 32, x.shape[1]), np.float32)
        return (g.copy(), part, part, SimpleNamespace(codes="dx", fmt=E5M2),
                SimpleNamespace(codes="dx^T", fmt=E5M2))

    monkeypatch.setattr(cuda, "layernorm_backward_codes", fake_ln)
    monkeypatch.setattr(cuda, "layernorm_codes_fit", lambda x, *_: x.shape[0] % 32 == 0)
    stream = FakeStream()
    lt = SimpleNamespace(stream=stream, xp=np, matmul_fp8=lambda *_, **__: None)
    gemms = Fp8Gemms(lambda: lt, delayed=True)
    x = np.ones((2, 16, 64), bf16())
    stats = np.ones((2, 16, 1), np.float32)

    def backward(x: Any = x, gemms: Any = gemms) -> Any:
        return gemms.layernorm_backward(x, x, x[0, 0], stats, stats, x)

    gemms.sites.scaling(*CAST)  # the warm-up step's cast of dx, in its shared() block
    assert backward() is None and gemms.sites.next_row == 1  # eager: no site taken
    stream.capturing = True
    dx, pdw, pdb = backward()
    assert dx.shape == x.shape and pdw.shape == (1, 64)
    assert len(sites) == 1 and np.shares_memory(sites[0], gemms.sites.rows[0])
    with gemms.shared(dx):
        assert gemms._codes(dx.reshape(32, 64), E5M2).codes == "dx"
        assert gemms._codes(dx.reshape(32, 64).T, E5M2).codes == "dx^T"
    assert casts == [] and gemms.sites.next_row == 1
    dx, _, _ = backward()
    gemms.matmul(dx, np.ones((64, 32), bf16()))  # a GEMM in between
    casts.clear()
    with gemms.shared(dx):
        gemms._codes(dx.reshape(32, 64), E5M2)
    assert casts == [(32, 64)]  # cast again
    dx, _, _ = backward()
    casts.clear()
    gemms.linear(dx, np.ones((64, 96), bf16()), np.zeros(96, bf16()))
    assert casts == [(32, 64), (64, 96)]  # a linear of dx takes e4m3, not dx's e5m2 codes
    for refused in (backward(x=x.astype(np.float32)), backward(x=np.ones((2, 8, 64), bf16())),
                    backward(gemms=Fp8Gemms(gemms._lt))):
        assert refused is None


def test_the_launchers_tiles_are_the_kernels() -> None:
    """The tile sizes fp8/cuda.py launches with are the ones fp8.cuh and layernorm_fp8.cu
    define (a grid or shared memory off by one would read or write out of bounds)."""
    import re

    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.layernorm.cuda import MAX_CPL

    def defines(path: Path) -> dict[str, str]:
        return dict(re.findall(r"^#define (\w+) (.+?)\s*$", path.read_text(), re.MULTILINE))

    here = Path(cuda.__file__).parent
    tile = defines(here.parent / "cuda_include" / "fp8.cuh")
    assert (int(tile["TQ_ROWS"]), int(tile["TQ_COLS"]), int(tile["TQ_THREADS"])) == (
        cuda.TQ_ROWS, cuda.TQ_COLS, cuda.TQ_THREADS)
    ln = defines(here / "layernorm_fp8.cu")
    warps = int(ln["LQ_WARPS"])
    assert (ln["LQ_ROWS"], ln["LQ_WORDS"]) == ("(4 * LQ_WARPS)", "(LQ_WARPS + 1)")
    assert (cuda.LN_WARPS, cuda.LN_ROWS, cuda.LN_WORDS) == (warps, 4 * warps, warps + 1)
    assert cuda.LN_MAX_WIDTH * cuda.LN_WORDS * 4 <= 48 * 1024  # without opting in to more
    assert cuda.LN_MAX_WIDTH == 32 * MAX_CPL  # the LayerNorm kernels' one-pass rows
    assert int(defines(here / "fp8_cast.cu")["TV"]) == cuda.CODES_TILE


def test_the_log_block_sums_up_the_fp8_casts() -> None:
    """The block's FP8 line: how many casts a step makes, its scaling, and per format the
    range of the last amax and scale; nothing without the record's tensors."""
    from rustyflow_py.reporting.run_text import fp8_lines

    tensors = [{"tensor": "linear x", "format": "e4m3", "shape": [64, 32], "amax": 2.0,
                "scale": 224.0},
               {"tensor": "linear w", "format": "e4m3", "shape": [32, 32], "amax": 0.5,
                "scale": 896.0},
               {"tensor": "gradient", "format": "e5m2", "shape": [64, 32], "amax": 0.25,
                "scale": 229376.0}]
    assert fp8_lines({"fp8_tensors": tensors, "fp8_scaling": "delayed"}) == [
        "FP8 casts per step: 3 (delayed scaling) | e4m3 2: amax 0.5 to 2, scale 224 to 896 "
        "| e5m2 1: amax 0.25 to 0.25, scale 2.29e+05 to 2.29e+05 (the record lists each "
        "tensor)"]
    assert fp8_lines({"fp8_tensors": None}) == [] and fp8_lines({}) == []


@pytest.mark.usefixtures("tiny_dir")
def test_fp8_scaling_is_delayed_unless_an_fp8_run_says_otherwise() -> None:
    """FP8_SCALING's default, delayed, is what every run carries; current is a choice only
    an fp8 run can make (elsewhere an error that names both keys and the fix)."""
    from helpers import make_cfg

    from rustyflow_py.training.config.policy import run_policy

    assert run_policy(make_cfg(PRECISION="fp8", DEVICE="gpu")).fp8_scaling == "delayed"
    assert make_cfg(PRECISION="bf16").fp8_scaling == "delayed"  # no error: the default
    with pytest.raises(ConfigError, match="FP8_SCALING=current .* scales FP8 casts, but "
                                          "PRECISION=bf16 .* set PRECISION=fp8, or leave "
                                          "FP8_SCALING=delayed"):
        make_cfg(PRECISION="bf16", FP8_SCALING="current")
    cfg = make_cfg(PRECISION="fp8", FP8_SCALING="current", DEVICE="gpu")
    assert run_policy(cfg).fp8_scaling == "current"


@pytest.mark.usefixtures("tiny_dir")
def test_a_stored_or_filed_fp8_scaling_of_a_run_without_fp8_is_let_be(tmp_path: Any) -> None:
    """current was the default once: a checkpoint of a bf16 run stored it, and config.env
    copies of that time say so. Neither is refused (it changes nothing without fp8); only
    the command line and the environment are, where it is this run's own request."""
    from helpers import make_cfg

    from rustyflow_py.training.config.config import Config, load_config

    stored = {**make_cfg(PRECISION="bf16").to_dict(), "FP8_SCALING": "current"}
    assert Config.from_dict(stored).fp8_scaling == "current"
    env = tmp_path / "old.env"
    env.write_text("PRECISION=bf16\nFP8_SCALING=current\n")
    cfg, _ = load_config(str(env), {}, environ={})
    assert cfg.precision == "bf16" and cfg.fp8_scaling == "current"
    with pytest.raises(ConfigError, match=r"FP8_SCALING=current \(environment"):
        load_config(str(env), {}, environ={"FP8_SCALING": "current"})


# ---- on a GPU with FP8 tensor cores -----------------------------------------------------------
@pytest.fixture(scope="module")
def fp8_backend() -> Any:
    """The GPU backend of a PRECISION=fp8 run (skips without a GPU of compute capability
    8.9 or later)."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from rustyflow_py.engine.devices import gpu_capability

    if not has_fp8_gemms(gpu_capability()):
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    from rustyflow_py.engine.library import get_backend
    from rustyflow_py.engine.policy import RunPolicy

    backend = get_backend("gpu", RunPolicy(Precision.of("fp8")))
    backend.stream.use()
    return backend


def fp8_of(host: np.ndarray, fmt: Any) -> np.ndarray:
    """The float64 values a GEMM reads for `host` cast to `fmt` under current scaling."""
    codes, scale_inv = quantize(host.astype(np.float32), fmt)
    return decode(codes, fmt) * float(scale_inv)


def rel_max(got: Any, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.gpu
# by value (333 x 517, 1 x 40), and by vector (256 x 96; 272 x 200 with partial tiles)
@pytest.mark.parametrize("shape", [(333, 517), (272, 200), (256, 96), (1, 40)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=sorted(FORMATS))
@pytest.mark.parametrize("kind", ["quantize_t", "quantize_both"])
def test_the_transposing_casts_match_the_recipe_bit_for_bit(
        fp8_backend: Any, shape: tuple[int, int], dtype: str, fmt: Any, kind: str) -> None:
    """quantize_t: the codes of x^T; quantize_both: of x and x^T from one kernel, with one
    amax and scale."""
    from rustyflow_py.engine.ops.fp8 import cuda

    rng = np.random.default_rng(5)
    host = rng.standard_normal(shape).astype(bf16() if dtype == "bfloat16" else np.float32)
    host[0, -1] = 900.0  # the amax, in the last column of the first row
    got = getattr(cuda, kind)(fp8_backend.xp.asarray(host), fmt)
    made = got if isinstance(got, tuple) else (got,)
    codes, scale_inv = quantize(host.astype(np.float32), fmt)
    want = [codes.T] if kind == "quantize_t" else [codes, codes.T]
    for q, ref in zip(made, want, strict=True):
        assert q.scale_inv is made[0].scale_inv and q.scale_inv.get()[0] == scale_inv
        assert q.codes.flags.c_contiguous
        np.testing.assert_array_equal(q.codes.get(), ref)


def direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The kernels' `gemm` runner, untimed."""
    return fn(*args, **kwargs)


def spy_casts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, tuple[int, ...]]]:
    """Record each cast the FP8 GEMMs make from here on: (kind, format, source shape)."""
    from rustyflow_py.engine.ops.fp8 import cuda

    made: list[tuple[str, Any, tuple[int, ...]]] = []
    for name in ("quantize", "quantize_t", "quantize_both"):
        real = getattr(cuda, name)

        def spy(x: Any, fmt: Any, *scaling: Any, _real: Any = real, _name: str = name) -> Any:
            made.append((_name, fmt, tuple(x.shape)))
            return _real(x, fmt, *scaling)

        monkeypatch.setattr(cuda, name, spy)
    return made


@pytest.mark.gpu
@pytest.mark.parametrize("gelu", [False, True], ids=["linear", "gelu"])
def test_a_linear_keeps_the_fp8_codes_its_backward_reads(fp8_backend: Any,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         gelu: bool) -> None:
    """After an FP8 linear(x, w), kept_for_backward gives x^T's and w's codes from the
    forward's casts: the backward GEMMs from them cast nothing of x or w again and equal,
    bit for bit, those from x and w; and their dense values are the quantised ones."""
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Operand

    xp, rng, kernels = fp8_backend.xp, np.random.default_rng(13), fp8_backend.kernels
    host_x = rng.standard_normal((2, 48, 160)).astype(bf16())
    host_w = (rng.standard_normal((160, 224)) * 0.05).astype(bf16())
    x, w = xp.asarray(host_x), xp.asarray(host_w)
    b = xp.zeros(224, bf16())
    g = xp.asarray((rng.standard_normal((2, 48, 224)) * 1e-3).astype(bf16()))

    def grads(x: Any, w: Any) -> list[np.ndarray]:
        dx = kernels.matmul(g, w, transpose_b=True, gradient="a")
        dw = xp.zeros((160, 224), np.float32)
        kernels.linear_grads(x, g, direct, (dw, None), bias=False)
        return [dx.get(), dw.get()]

    alone = grads(x, w)
    made = spy_casts(monkeypatch)
    kernels.linear(x, w, b, gelu, direct)
    kx, kw = kernels.kept_for_backward(x, w)
    assert isinstance(kx, Fp8Operand) and isinstance(kw, Fp8Operand)
    assert kx.shape == (96, 160) and kw.shape == (160, 224)
    forward = len(made)
    for got, want in zip(grads(kx, kw), alone, strict=True):
        np.testing.assert_array_equal(got, want)
    assert [fmt for _, fmt, _ in made[forward:]] == [E5M2, E5M2]  # only g, once a GEMM
    assert [kind for kind, _, _ in made[:forward]] == ["quantize_both"] * 2
    # the fallback's bf16 values: the quantised ones, rounded to bf16
    np.testing.assert_allclose(kx.dense(xp).get().astype(np.float64),
                               fp8_of(host_x.reshape(96, 160), E4M3), rtol=2.0**-8)
    np.testing.assert_allclose(kw.dense(xp).get().astype(np.float64), fp8_of(host_w, E4M3),
                               rtol=2.0**-8)
    # where the FP8 GEMM is refused, the kernel set's bf16 GEMM takes the kept values
    from rustyflow_py.engine.ops.gemm.cublaslt import CublasLtUnsupported
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Gemms

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise CublasLtUnsupported("refused by the test")

    monkeypatch.setattr(Fp8Gemms, "matmul", refuse)
    for got, want in zip(grads(kx, kw), alone, strict=True):
        assert rel_max(got, want.astype(np.float64)) < 0.1  # bf16 of other roundings
    # asked about arrays the last linear did not take, it gives them back as they are
    other = xp.asarray(host_x)
    assert kernels.kept_for_backward(other, w) == (other, w)


@pytest.mark.gpu
@pytest.mark.parametrize("gradient_shape", [(96, 224), (2, 48, 224)])
def test_a_shared_gradient_is_cast_once_for_both_of_its_gemms(
        fp8_backend: Any, monkeypatch: pytest.MonkeyPatch,
        gradient_shape: tuple[int, ...]) -> None:
    """A Linear's backward inside shared_gradient(g): the input gradient (g @ W^T) and the
    weight gradient (x^T @ g) read g from one two-layout cast, and equal, bit for bit, the
    same GEMMs with g cast once per GEMM."""
    xp, rng, kernels = fp8_backend.xp, np.random.default_rng(12), fp8_backend.kernels
    x = xp.asarray(rng.standard_normal((*gradient_shape[:-1], 160)).astype(bf16()))
    w = xp.asarray((rng.standard_normal((160, 224)) * 0.05).astype(bf16()))
    g = xp.asarray((rng.standard_normal(gradient_shape) * 1e-3).astype(bf16()))

    def grads() -> tuple[np.ndarray, np.ndarray]:
        dx = kernels.matmul(g, w, transpose_b=True, gradient="a")
        dw = xp.zeros((160, 224), np.float32)
        kernels.linear_grads(x, g, direct, (dw, None), bias=False)
        return dx.get(), dw.get()

    alone = grads()
    made = spy_casts(monkeypatch)
    with kernels.shared_gradient(g):
        shared = grads()
    for got, want in zip(shared, alone, strict=True):
        np.testing.assert_array_equal(got, want)
    of_g = [kind for kind, fmt, _ in made if fmt is E5M2]
    assert of_g == ["quantize_both"]  # g: one cast, both layouts
    assert sorted(kind for kind, fmt, _ in made if fmt is E4M3) == ["quantize", "quantize_t"]
    assert not gemms(fp8_backend)._shared  # dropped when the block ends


@pytest.mark.gpu
def test_gemms_read_a_gradient_given_as_codes_as_a_shared_one(fp8_backend: Any) -> None:
    """A gradient given as the codes of both its layouts (an Fp8Operand: the GELU backward's
    own output in a delayed-scaling step) goes into the input and weight gradients' GEMMs as
    the same gradient shared_gradient casts does, bit for bit; shared_gradient passes it."""
    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Operand

    xp, rng, kernels = fp8_backend.xp, np.random.default_rng(21), fp8_backend.kernels
    x = xp.asarray(rng.standard_normal((96, 160)).astype(bf16()))
    w = xp.asarray((rng.standard_normal((160, 224)) * 0.05).astype(bf16()))
    g = xp.asarray((rng.standard_normal((96, 224)) * 1e-3).astype(bf16()))

    def grads(g: Any) -> list[np.ndarray]:
        dw = xp.zeros((160, 224), np.float32)
        with kernels.shared_gradient(g):
            dx = kernels.matmul(g, w, transpose_b=True, gradient="a")
            kernels.linear_grads(x, g, direct, (dw, None), bias=False)
        return [dx.get(), dw.get()]

    pair = Fp8Operand(*cuda.quantize_both(g, E5M2), g.dtype)
    for got, want in zip(grads(pair), grads(g), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, with_bias", [((128, 192), False), ((128, 256), True),
                                              ((4096, 768), False), ((2048, 3072), True)])
def test_the_gelu_backward_writes_its_output_cast_at_the_delayed_scale(
        fp8_backend: Any, shape: tuple[int, int], with_bias: bool) -> None:
    """casts.gelu_backward_codes: the kernel set's bf16 GELU backward, dx = g * gelu'(x + b),
    cast at the site's last amax bit for bit as the NumPy recipe (values beyond it
    saturate), in both layouts with one read-back factor; its sums over each tile of rows
    add up to dx's column sums; the site keeps dx's amax for the next replay. A shape off
    its tile is not taken (the caller runs the GELU backward, then the cast)."""
    from rustyflow_py.engine.ops.fp8 import cuda

    xp, rng = fp8_backend.xp, np.random.default_rng(22)
    g = xp.asarray((rng.standard_normal(shape) * 1e-3).astype(bf16()))
    x = xp.asarray((rng.standard_normal(shape) * 2).astype(bf16()))
    b = xp.asarray((rng.standard_normal(shape[1]) * 0.1).astype(bf16())) if with_bias else None
    assert cuda.gelu_codes_fit(g, x, b)
    host = fp8_backend.kernels.gelu_backward(g, x, b).get().astype(np.float32)
    amax = float(np.abs(host).max())
    site = xp.zeros(4, np.float32)
    site[0] = last = amax / 2  # the last replay's: this one's top values saturate
    replay = xp.ones(1, np.uint32)  # replay 1: reads slot 0, fills slot 1, clears slot 2
    q, q_t, part = cuda.gelu_backward_codes(g, x, b, cuda.Scaling(site=site, replay=replay))
    want, want_inv = quantize(host, E5M2, amax=last)
    np.testing.assert_array_equal(q.codes.get(), want)
    np.testing.assert_array_equal(q_t.codes.get(), want.T)
    assert q.fmt is q_t.fmt is E5M2 and q_t.scale_inv is q.scale_inv
    assert q.scale_inv.get()[0] == want_inv
    sums = host.astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(part.get().sum(axis=0), sums, rtol=1e-3,
                               atol=1e-6 * np.abs(host).sum(axis=0).max())
    assert list(site.get()[:3]) == [last, amax, 0.0]  # read; taken; cleared for the next
    assert part.shape == (shape[0] // cuda.TQ_ROWS, shape[1])
    off = xp.ascontiguousarray(x[:, :-16])  # cols no multiple of the tile
    assert cuda.gelu_codes_fit(x, x, None) and not cuda.gelu_codes_fit(off, off, None)


@pytest.mark.gpu
# rows of 32 vectors a lane's whole number (768, 1024) or not (384, 128: lanes without some)
@pytest.mark.parametrize("shape", [(64, 768), (4096, 768), (128, 1024), (32, 384), (64, 128)])
def test_the_layernorm_writes_its_output_cast_at_the_delayed_scale(
        fp8_backend: Any, shape: tuple[int, int]) -> None:
    """casts.layernorm_forward_codes: the kernel set's bf16 LayerNorm forward, y, mean and
    rstd bit for bit, and y's codes cast at the site's last amax bit for bit as the NumPy
    recipe (values beyond it saturate) in both layouts with one read-back factor; the site
    keeps y's amax for the next replay. Shapes off its rows or widths are not taken."""
    from rustyflow_py.engine.ops.fp8 import cuda

    xp, rng = fp8_backend.xp, np.random.default_rng(23)
    x = xp.asarray((rng.standard_normal(shape) * 3 + 1).astype(bf16()))
    w = xp.asarray((rng.standard_normal(shape[1]) * 0.5 + 1).astype(bf16()))
    b = xp.asarray((rng.standard_normal(shape[1]) * 0.1).astype(bf16()))
    assert cuda.layernorm_codes_fit(x, w, b)
    want_y, want_mean, want_rstd = fp8_backend.kernels.layernorm_forward(x, w, b, 1e-5)
    host = want_y.get().astype(np.float32)
    amax = float(np.abs(host).max())
    site = xp.zeros(4, np.float32)
    site[2] = last = amax / 2  # the last replay's (replay 3 reads slot 2): the top saturates
    replay = xp.full(1, 3, np.uint32)  # slot 0 is this replay's, slot 1 cleared for the next
    site[1] = 7.0
    y, mean, rstd, q, q_t = cuda.layernorm_forward_codes(x, w, b, 1e-5,
                                                         cuda.Scaling(site=site, replay=replay))
    for got, want in ((y, want_y), (mean, want_mean), (rstd, want_rstd)):
        np.testing.assert_array_equal(got.get(), want.get())
    codes, scale_inv = quantize(host, E4M3, amax=last)
    np.testing.assert_array_equal(q.codes.get(), codes)
    np.testing.assert_array_equal(q_t.codes.get(), codes.T)
    assert q.fmt is q_t.fmt is E4M3 and q_t.scale_inv is q.scale_inv
    assert q.scale_inv.get()[0] == scale_inv
    assert list(site.get()[:3]) == [amax, 0.0, last]  # taken; cleared for the next; read
    wide = xp.ones((32, 1536), bf16())  # its tile past a block's shared memory
    for off in ((x[:16], w, b), (xp.ascontiguousarray(x[:, :-4]), w[:-4], b[:-4]),
                (x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)),
                (wide, wide[0], wide[0])):
        assert not cuda.layernorm_codes_fit(*off)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, joined", [((64, 768), True), ((4096, 768), True),
                                           ((128, 1024), False), ((32, 384), True),
                                           ((64, 128), True)])
def test_the_layernorm_backward_writes_its_gradient_cast_at_the_delayed_scale(
        fp8_backend: Any, shape: tuple[int, int], joined: bool) -> None:
    """casts.layernorm_backward_codes: the kernel set's bf16 LayerNorm backward's dx (the
    residual stream's gradient joined, or none) bit for bit, its partial sums adding up to
    dw and db, and dx's e5m2 codes at the site's last amax bit for bit as the NumPy recipe,
    in both layouts with one read-back factor; the site keeps dx's amax."""
    from rustyflow_py.engine.ops.fp8 import cuda

    xp, rng, kernels = fp8_backend.xp, np.random.default_rng(24), fp8_backend.kernels
    x = xp.asarray((rng.standard_normal(shape) * 3 + 1).astype(bf16()))
    w = xp.asarray((rng.standard_normal(shape[1]) * 0.5 + 1).astype(bf16()))
    g = xp.asarray((rng.standard_normal(shape) * 1e-3).astype(bf16()))
    res = xp.asarray((rng.standard_normal(shape) * 1e-3).astype(bf16())) if joined else None
    _, mean, rstd = kernels.layernorm_forward(x, w, w, 1e-5)
    assert cuda.layernorm_codes_fit(x, w, w, g, *([res] if joined else []))
    sums = [xp.zeros(shape[1], np.float32) for _ in range(2)]
    want_dx = kernels.layernorm_backward(g, x, w, mean, rstd, tuple(sums), res)[0]
    host = want_dx.get().astype(np.float32)
    amax = float(np.abs(host).max())
    site = xp.zeros(4, np.float32)
    site[0] = last = amax / 2  # replay 1 reads slot 0, takes slot 1, clears slot 2
    site[2] = 5.0
    dx, pdw, pdb, q, q_t = cuda.layernorm_backward_codes(
        g, x, w, mean, rstd, res, cuda.Scaling(site=site, replay=xp.ones(1, np.uint32)))
    np.testing.assert_array_equal(dx.get(), want_dx.get())
    for part, want in zip((pdw, pdb), sums, strict=True):
        assert part.shape == (shape[0] // cuda.LN_ROWS, shape[1])
        np.testing.assert_allclose(part.get().sum(axis=0), want.get(), rtol=1e-4,
                                   atol=1e-6 * float(xp.abs(want).max()))
    codes, scale_inv = quantize(host, E5M2, amax=last)
    np.testing.assert_array_equal(q.codes.get(), codes)
    np.testing.assert_array_equal(q_t.codes.get(), codes.T)
    assert q.fmt is q_t.fmt is E5M2 and q_t.scale_inv is q.scale_inv
    assert q.scale_inv.get()[0] == scale_inv
    assert list(site.get()[:3]) == [last, amax, 0.0]  # read; taken; cleared for the next


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 1024), (80, 208), (16, 16)])
def test_the_codes_transpose_is_exact(fp8_backend: Any, shape: tuple[int, int]) -> None:
    from rustyflow_py.engine.ops.fp8 import cuda
    from rustyflow_py.engine.ops.fp8.formats import Fp8Tensor

    host = np.random.default_rng(14).integers(0, 256, shape).astype(np.uint8)
    q = Fp8Tensor(fp8_backend.xp.asarray(host), fp8_backend.xp.ones(1, np.float32), E5M2)
    got = cuda.transpose_codes(q)
    assert got.scale_inv is q.scale_inv and got.fmt is E5M2
    np.testing.assert_array_equal(got.codes.get(), host.T)


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [1000, 1024], ids=["padded", "whole"])
@pytest.mark.parametrize("w_into", [False, True], ids=["fresh", "into"])
def test_the_head_writes_its_gradient_in_e5m2_scaled_by_its_bound(
        fp8_backend: Any, vocab: int, w_into: bool) -> None:
    """The tied head of a PRECISION=fp8 run: the cross-entropy kernel writes d(logits) as
    e5m2 codes of (softmax - onehot) * 57344, read back by 1 / (57344 N), the pad columns
    zero; the bf16 logits are not kept, and are made a block of rows at a time (HEAD_BLOCKS
    GEMMs from one cast of h and of W); dh and dW come from those codes in FP8, without a
    cast of the gradient."""
    from rustyflow_py.engine.ops.gemm.fp8 import Fp8Operand
    from rustyflow_py.engine.ops.softmax_xent.cuda import HEAD_BLOCKS

    xp, rng, kernels = fp8_backend.xp, np.random.default_rng(15), fp8_backend.kernels
    n, e = 64, 96
    h = rng.standard_normal((n, e)).astype(bf16())
    w = (rng.standard_normal((vocab, e)) * 0.3).astype(bf16())
    targets = rng.integers(0, vocab, n).astype(np.int32)
    products: list[tuple[int, ...]] = []

    def mm(a: Any, b: Any, **kwargs: Any) -> Any:
        products.append(a.shape)
        return kernels.matmul(a, b, **kwargs)

    loss, state = kernels.lm_head_xent(xp.asarray(h), xp.asarray(w), xp.asarray(targets),
                                       True, mm)
    assert products == [(n // HEAD_BLOCKS, e)] * HEAD_BLOCKS
    codes = state[3]
    assert isinstance(codes, Fp8Operand) and codes.shape == (n, -(-vocab // 64) * 64)
    # the logits the GEMM made, to bf16's rounding: the quantised product
    logits = (fp8_of(h, E4M3) @ fp8_of(w, E4M3).T).astype(bf16()).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    assert abs(float(loss) + np.log(p[np.arange(n), targets]).mean()) < 2e-2
    grad = p.copy()
    grad[np.arange(n), targets] -= 1
    got = decode(codes.q.codes.get(), E5M2)
    assert float(codes.q.scale_inv.get()[0]) == np.float32(1 / (57344 * n))
    assert (codes.q.codes.get()[:, vocab:] == 0).all()  # the pad
    np.testing.assert_allclose(got[:, :vocab], grad * 57344, rtol=0.13, atol=0.5)
    into = xp.zeros((vocab, e), np.float32) if w_into else None
    dh, dw = kernels.lm_head_xent_backward(state, xp.asarray(np.float32(1.0)), True, True,
                                           kernels.matmul, into)
    dlogits = got * float(codes.q.scale_inv.get()[0])  # the values the GEMMs read
    wp = np.zeros((codes.shape[1], e), np.float64)
    wp[:vocab] = w.astype(np.float64)
    assert rel_max(dh.get(), dlogits @ fp8_of(wp.astype(bf16()), E4M3)) < 1e-2
    dw = into if w_into else dw
    assert dw.shape == (vocab, e)
    assert rel_max(dw.get(), dlogits[:, :vocab].T @ fp8_of(h, E4M3)) < 1e-2


@pytest.mark.gpu
def test_the_fp8_head_in_chunks_of_rows_matches_it_whole(fp8_backend: Any) -> None:
    """LM_HEAD_CHUNK=32 on a PRECISION=fp8 run: each chunk casts its own rows of h (their
    own amax, so other codes), and the loss and both gradients match the whole head's to
    e4m3's rounding (3 mantissa bits: an element's step is up to 1/8 of it, of the largest
    element 1/16)."""
    from rustyflow_py.engine.library import get_backend

    xp, rng = fp8_backend.xp, np.random.default_rng(16)
    n, e, vocab = 96, 64, 1000
    h = xp.asarray(rng.standard_normal((n, e)).astype(bf16()))
    w = xp.asarray((rng.standard_normal((vocab, e)) * 0.3).astype(bf16()))
    targets = xp.asarray(rng.integers(0, vocab, n).astype(np.int32))
    chunked = get_backend("gpu", dataclasses.replace(fp8_backend.policy, head_chunk=32))
    runs = []
    for k in (fp8_backend.kernels, chunked.kernels):
        into = xp.zeros((vocab, e), np.float32)
        loss, state = k.lm_head_xent(h, w, targets, True, k.matmul)
        dh, _ = k.lm_head_xent_backward(state, xp.asarray(np.float32(0.5)), True, True,
                                        k.matmul, into)
        runs.append((float(loss), dh.get().astype(np.float64), into.get()))
    (loss, dh, dw), (loss_c, dh_c, dw_c) = runs
    assert abs(loss_c - loss) < 1e-3 * abs(loss)
    assert rel_max(dh_c, dh) < 0.125 and rel_max(dw_c, dw) < 0.125


def delayed_cast(kind: str, x: Any, fmt: Any, site: Any, replay: Any) -> list[Any]:
    """The codes of a delayed cast of x at `site`, each layout it writes as a host array."""
    from rustyflow_py.engine.ops.fp8 import cuda

    out = getattr(cuda, kind)(x, fmt, cuda.Scaling(site=site, replay=replay))
    made = out if isinstance(out, tuple) else (out,)
    assert all(q.amax is None and q.scale_inv is made[0].scale_inv for q in made)
    return [q.codes.get() for q in made] + [made[0].scale_inv.get()[0]]


@pytest.mark.gpu
@pytest.mark.parametrize("kind, shape", [
    ("quantize", (256, 96)), ("quantize", (333, 517)),  # by vector, by value
    ("quantize_t", (256, 96)), ("quantize_t", (333, 517)), ("quantize_both", (272, 200)),
    ("quantize_both", (40, 24)),
    ("quantize_both", (4096, 1088))])  # 1,088 tiles: blocks take several (at most 1,024)
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=sorted(FORMATS))
def test_a_delayed_cast_is_scaled_by_the_last_amax_and_keeps_its_own(
        fp8_backend: Any, kind: str, shape: tuple[int, int], fmt: Any) -> None:
    """Delayed scaling's site: in replay r (its graph's count) a cast scales by the amax
    the site kept in slot (r - 1) % 3 (seeded: 3.0), bit for bit as the NumPy recipe with
    that amax (values beyond it saturate), takes its own tensor's amax into slot r % 3, and
    clears slot (r + 1) % 3 for the next; the next replay's cast reads that amax."""
    xp, rng = fp8_backend.xp, np.random.default_rng(16)
    site = xp.zeros(4, np.float32)
    site[0], site[2] = 3.0, 99.0  # the seed replay 1 reads; a stale slot it clears
    replay = xp.zeros(1, np.uint32)
    for step, (last, size) in enumerate([(3.0, 1.0), (7.5, 0.01)]):
        replay += 1  # the graph's first kernel
        host = (rng.standard_normal(shape) * size).astype(bf16())
        if step == 0:
            host[0, -1] = 7.5  # beyond the last amax: saturates, and is this one's amax
        *codes, scale_inv = delayed_cast(kind, xp.asarray(host), fmt, site, replay)
        want, want_inv = quantize(host.astype(np.float32), fmt, amax=last)
        layouts = {"quantize": [want], "quantize_t": [want.T], "quantize_both": [want, want.T]}
        for got, ref in zip(codes, layouts[kind], strict=True):
            np.testing.assert_array_equal(got, ref)
        assert scale_inv == want_inv
        row, turn = site.get(), (step + 1) % 3
        amax = float(np.abs(host.astype(np.float32)).max())
        assert row[turn] == amax and row[(turn + 1) % 3] == 0  # taken; next one's cleared
        assert row[(turn + 2) % 3] == last  # the slot read, left as it was


def gemms(backend: Any) -> Any:
    """The FP8 GEMMs of the backend's kernel set."""
    fp8 = backend.kernels.fp8
    assert fp8 is not None
    return fp8


# (a's layout, b's layout, which operand is a gradient): the products a step takes
LAYOUTS = [("rows", "rows", None),  # x @ W (the reference formulation of a Linear)
           ("rows", "transposed", "a"),  # dy @ W^T (a Linear's input gradient)
           ("transposed", "rows", "b"),  # x^T @ dy (its weight gradient)
           ("transposed", "rows", "a")]  # dy^T @ h (the tied head's weight gradient)


@pytest.mark.gpu
@pytest.mark.parametrize("a_layout, b_layout, gradient", LAYOUTS)
def test_fp8_matmul_equals_the_product_of_its_quantised_operands(
        fp8_backend: Any, a_layout: str, b_layout: str, gradient: str | None) -> None:
    xp, rng = fp8_backend.xp, np.random.default_rng(6)
    m, k, n = 96, 160, 224
    a = rng.standard_normal((m, k)).astype(bf16())
    b = (rng.standard_normal((k, n)) * 1e-3).astype(bf16())
    # a transposed view of a C-contiguous array, as the ops pass them
    da = xp.asarray(a) if a_layout == "rows" else xp.ascontiguousarray(xp.asarray(a).T).T
    db = xp.asarray(b) if b_layout == "rows" else xp.ascontiguousarray(xp.asarray(b).T).T
    got = gemms(fp8_backend).matmul(da, db, gradient=gradient)
    fmt_a, fmt_b = (E5M2 if gradient == "a" else E4M3), (E5M2 if gradient == "b" else E4M3)
    ref = fp8_of(a, fmt_a) @ fp8_of(b.T, fmt_b).T
    assert got.dtype == bf16() and rel_max(got.get(), ref) < 1e-2  # bf16 out
    into = xp.ones((m, n), np.float32)
    gemms(fp8_backend).matmul(da, db, out=into, accumulate=True, gradient=gradient)
    assert rel_max(into.get() - 1.0, ref) < 2e-3  # fp32 out, added (beta = 1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["bias", "gelu", "residual"])
def test_fp8_linear_runs_its_epilogue_on_the_quantised_product(fp8_backend: Any,
                                                               epilogue: str) -> None:
    xp, rng = fp8_backend.xp, np.random.default_rng(7)
    x = rng.standard_normal((2, 48, 128)).astype(bf16())
    w = (rng.standard_normal((128, 256)) * 0.05).astype(bf16())
    b = (rng.standard_normal(256) * 0.1).astype(bf16())
    r = rng.standard_normal((2, 48, 256)).astype(bf16())
    pre = xp.empty((2, 48, 256), bf16()) if epilogue == "gelu" else None
    y = gemms(fp8_backend).linear(xp.asarray(x), xp.asarray(w), xp.asarray(b),
                                  gelu=epilogue == "gelu", pre_gelu_out=pre,
                                  residual=xp.asarray(r) if epilogue == "residual" else None)
    z = (fp8_of(x.reshape(-1, 128), E4M3) @ fp8_of(w.T, E4M3).T).reshape(2, 48, 256)
    z += b.astype(np.float64)
    if epilogue == "gelu":
        assert rel_max(pre.get(), z) < 1e-2
        z = gelu_tanh(z)
    elif epilogue == "residual":
        z += r.astype(np.float64)
    assert y.shape == (2, 48, 256) and rel_max(y.get(), z) < 1e-2


@pytest.mark.gpu
def test_a_shape_fp8_cannot_take_runs_in_bf16(fp8_backend: Any) -> None:
    """K = 20 is no multiple of 16 bytes of FP8 codes: cuBLASLt has no FP8 algorithm, and
    the kernel set's matmul gives the bf16 product instead (and remembers the refusal)."""
    xp, rng = fp8_backend.xp, np.random.default_rng(8)
    a, b = (rng.standard_normal(s).astype(bf16()) for s in ((64, 20), (20, 48)))
    got = fp8_backend.kernels.matmul(xp.asarray(a), xp.asarray(b))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert rel_max(got.get(), ref) < 1e-2
    # the next call goes to bf16 at once
    assert any(key[1] == (64, 20) for key in gemms(fp8_backend)._refused)


@pytest.mark.gpu
def test_an_amax_spike_keeps_the_product_finite(fp8_backend: Any) -> None:
    """One activation 10^4 times the rest (a diverging unit): current scaling fits it to
    e4m3's largest value, the rest lose precision but nothing overflows."""
    xp, rng = fp8_backend.xp, np.random.default_rng(9)
    a = rng.standard_normal((64, 128)).astype(bf16())
    a[3, 5] = 3.0e4
    b = rng.standard_normal((128, 32)).astype(bf16())
    got = gemms(fp8_backend).matmul(xp.asarray(a), xp.asarray(b)).get().astype(np.float64)
    assert np.isfinite(got).all()
    assert rel_max(got[3], fp8_of(a, E4M3)[3] @ fp8_of(b.T, E4M3).T) < 1e-2


@pytest.mark.gpu
def test_a_gpt_step_runs_every_linear_gemm_in_fp8(fp8_backend: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and backward of a small GPT: the block's Linear and MLP GEMMs and the tied LM
    head (forward, input and weight gradients) all go through the FP8 GEMMs."""
    from helpers import spy_fp8_gemms

    from rustyflow_py.engine.ops.softmax_xent.cuda import HEAD_BLOCKS
    from rustyflow_py.engine.tensor import Tensor
    from rustyflow_py.model.gpt import GPT, GPTConfig

    recorded, made = spy_fp8_gemms(monkeypatch), spy_casts(monkeypatch)
    cfg = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg, fp8_backend, seed=3, compute=bf16())
    tokens = np.random.default_rng(0).integers(0, 64, (4, 17)).astype(np.int32)
    loss = model(Tensor(tokens[:, :-1], device=fp8_backend),
                 Tensor(tokens[:, 1:], device=fp8_backend))
    loss.backward()
    calls = [call.rpartition(":")[0] for call in recorded]  # "kind:gradient"
    # per block: qkv and proj Linears and the MLP's two in forward (4 linear calls); in
    # backward each of the 4 has an input gradient (gradient "a") and a weight gradient
    # ("b"); the head: forward (a GEMM a block of 16 of the 64 rows), input and weight
    # gradient
    assert calls.count("linear:None") == 4 * cfg.n_layer
    assert calls.count("matmul:a") == 4 * cfg.n_layer + 2
    assert calls.count("matmul:b") == 4 * cfg.n_layer
    assert calls.count("matmul:None") == HEAD_BLOCKS
    assert np.isfinite(fp8_backend.to_host(model.buffer.grad)).all()
    # every gradient a block's GEMMs read is cast once, both layouts; the logits' gradient
    # not at all (the cross-entropy kernel writes it in e5m2)
    gradient_casts = [kind for kind, fmt, _ in made if fmt is E5M2]
    assert gradient_casts == ["quantize_both"] * (4 * cfg.n_layer)
    # each Linear's x and w: one cast into both layouts in forward, none in backward; the
    # head's h and weight once for its forward's GEMMs, then for each gradient's
    casts = Counter(kind for kind, fmt, _ in made if fmt is E4M3)
    assert casts == {"quantize_both": 8 * cfg.n_layer, "quantize": 2, "quantize_t": 2}
