"""FP8 (engine/ops/fp8/): the formats against PyTorch's float8 dtypes and by construction,
the current-scaling recipe in NumPy, and on a GPU the cast kernels bit for bit against that
recipe, the FP8 GEMM against a float64 product of the same quantised inputs, and both
replayed from a captured CUDA graph with the scale never leaving the device."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rustyflow_py.engine.ops.fp8.formats import (
    E4M3,
    E5M2,
    FORMATS,
    MAX_SCALE,
    decode,
    decode_table,
    encode,
    quantize,
    scale_of,
)

FORMAT_NAMES = sorted(FORMATS)


def torch_dtype(name: str) -> Any:
    torch = pytest.importorskip("torch")
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[name]


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_every_code_decodes_as_pytorch_reads_it(name: str) -> None:
    torch = pytest.importorskip("torch")

    theirs = torch.arange(256, dtype=torch.uint8).view(torch_dtype(name)).double().numpy()
    np.testing.assert_array_equal(decode_table(FORMATS[name]), theirs)  # NaNs in one place


@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_encoding_rounds_as_pytorch_does_within_range(name: str) -> None:
    """Random magnitudes over the whole range (subnormals included), and every midpoint
    between neighbouring values (the ties, to an even mantissa)."""
    torch = pytest.importorskip("torch")

    fmt = FORMATS[name]
    rng = np.random.default_rng(0)
    values = np.sort(decode_table(fmt)[:128][np.isfinite(decode_table(fmt)[:128])])
    values = values[values <= fmt.max]
    mids = (values[:-1] + values[1:]) / 2
    x = np.concatenate([mids, -mids, rng.uniform(-1, 1, 4000) * fmt.max,
                        np.exp(rng.uniform(-20, np.log(fmt.max), 4000))]).astype(np.float32)
    theirs = torch.from_numpy(x).to(torch_dtype(name)).view(torch.uint8).numpy()
    np.testing.assert_array_equal(encode(x, fmt), theirs)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=FORMAT_NAMES)
def test_every_finite_code_round_trips_and_beyond_the_range_saturates(fmt: object) -> None:
    codes = np.arange(256, dtype=np.uint8)
    finite = np.isfinite(decode(codes, fmt))
    assert np.array_equal(encode(decode(codes[finite], fmt), fmt), codes[finite])
    big = encode(np.array([fmt.max * 1.5, -1e30, np.inf]), fmt)
    assert list(decode(big, fmt)) == [fmt.max, -fmt.max, fmt.max]
    assert np.isnan(decode(encode(np.array([np.nan]), fmt), fmt)[0])


def test_the_scale_maps_amax_onto_the_largest_value() -> None:
    assert scale_of(2.0, E4M3) == np.float32(224.0)
    assert scale_of(0.0, E4M3) == 1 and scale_of(np.inf, E5M2) == 1
    assert scale_of(np.nan, E4M3) == 1


def test_a_tiny_amax_gives_the_largest_scale_not_infinity() -> None:
    """448 / 1e-37 is past float32's range: the scale stops at 2^126, whose inverse is still
    a normal float32 (the GPU flushes subnormal ones to zero), so the codes stay finite and
    the read-back factor non-zero."""
    assert scale_of(1e-37, E4M3) == MAX_SCALE == np.float32(2.0**126)
    codes, scale_inv = quantize(np.full(16, 1e-37), E4M3)
    assert scale_inv == np.float32(2.0**-126) and np.all(np.isfinite(decode(codes, E4M3)))
    assert decode(codes, E4M3)[0] * np.float64(scale_inv) == pytest.approx(1e-37, rel=0.07)


@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=FORMAT_NAMES)
def test_quantised_values_are_within_half_a_step(fmt: object) -> None:
    """Each normal value comes back within half a unit in the last place (2^-(m+1)
    relative); the largest magnitude comes back exactly."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(5000) * 3.0
    codes, scale_inv = quantize(x, fmt)
    back = decode(codes, fmt) * np.float64(scale_inv)
    scaled = np.abs(x.astype(np.float32) / scale_inv)
    normal = scaled >= 2.0 ** (1 - fmt.bias)
    rel = np.abs(back - x)[normal] / np.abs(x)[normal]
    assert rel.max() <= 2.0 ** -(fmt.mantissa_bits + 1) * (1 + 1e-6)
    top = np.argmax(np.abs(x))
    assert back[top] == pytest.approx(x[top], rel=1e-6)


# ==== GPU ====================================================================================
DTYPES = ["float32", "bfloat16", "float16", "float64"]


def fp8_gemms(cupy: Any) -> bool:
    """Whether this GPU has FP8 tensor cores (compute capability 8.9 or later; CuPy gives
    it as a string of digits, "90" for 9.0)."""
    return int(cupy.cuda.Device().compute_capability) >= 89


def storage(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(333, 517), (256, 520)], ids=["by-value", "by-vector"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", [E4M3, E5M2], ids=FORMAT_NAMES)
def test_the_cast_kernels_match_the_recipe_bit_for_bit(cublaslt: SimpleNamespace, dtype: str,
                                                       fmt: object,
                                                       shape: tuple[int, int]) -> None:
    """Codes, amax and read-back factor, for a tensor with an amax spike (one value 10^4
    times the rest, as a diverging activation has) and for an all-zero one; a shape of
    whole 16-byte vectors takes the vector kernels, another the kernels a value at a time."""
    from rustyflow_py.engine.ops.fp8 import cuda

    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(storage(dtype))
    x[7, 11] = 4.0e3
    tiny = np.full((64, 48), 1e-37, np.float32).astype(storage(dtype))  # past the scale's range
    for host in (x, np.zeros((64, 48), storage(dtype)), tiny):
        got = cuda.quantize(cublaslt.cupy.asarray(host), fmt)
        codes, scale_inv = quantize(host.astype(np.float32), fmt)
        assert float(got.amax.get()[0]) == float(np.abs(host.astype(np.float32)).max())
        assert got.scale_inv.get()[0] == scale_inv
        np.testing.assert_array_equal(got.codes.get(), codes)
    x[100, 3] = np.nan  # a NaN is the amax: the scale falls back to 1, the rest still casts
    got = cuda.quantize(cublaslt.cupy.asarray(x), fmt)
    assert np.isnan(got.amax.get()[0]) and got.scale_inv.get()[0] == 1
    x32 = x.astype(np.float32)
    finite = ~np.isnan(x32)
    np.testing.assert_array_equal(got.codes.get()[finite], encode(x32, fmt)[finite])


def fp8_operands(cublaslt: SimpleNamespace, rng: np.random.Generator, m: int, k: int,
                 n: int) -> tuple[Any, Any, np.ndarray]:
    """a (M, K) in e4m3, b (N, K) in e5m2 (as a gradient would be), quantised on the
    device; and the float64 product of exactly those quantised values."""
    from rustyflow_py.engine.ops.fp8 import cuda

    x, w = rng.standard_normal((m, k)), rng.standard_normal((n, k)) * 1e-3
    a = cuda.quantize(cublaslt.cupy.asarray(x.astype(np.float32)), E4M3)
    b = cuda.quantize(cublaslt.cupy.asarray(w.astype(np.float32)), E5M2)
    ref = ((decode(a.codes.get(), E4M3) * float(a.scale_inv.get()[0]))
           @ (decode(b.codes.get(), E5M2) * float(b.scale_inv.get()[0])).T)
    return a, b, ref


def rel_max(got: Any, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("fast_accum", [False, True])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_the_fp8_gemm_equals_the_product_of_its_quantised_inputs(
        cublaslt: SimpleNamespace, out_dtype: str, fast_accum: bool) -> None:
    if not fp8_gemms(cublaslt.cupy):
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    rng = np.random.default_rng(3)
    m, k, n = 512, 768, 2304
    a, b, ref = fp8_operands(cublaslt, rng, m, k, n)
    out = cublaslt.cupy.empty((m, n), storage(out_dtype))
    cublaslt.lt.matmul_fp8(a, b, out, fast_accum=fast_accum)
    # The products are exact, but Hopper's FP8 tensor cores add them in an accumulator of
    # fewer bits than fp32's, promoted to fp32 at intervals (not at all with fast_accum): at
    # K = 768 that left 2.5e-4 of max|ref| on an H100.
    tol = 2e-3 if (out_dtype, fast_accum) == ("float32", False) else 1e-2
    assert rel_max(out.get().astype(np.float64), ref) < tol


@pytest.mark.gpu
def test_cast_and_gemm_replay_from_a_graph_with_new_data(cublaslt: SimpleNamespace) -> None:
    """Captured once, replayed on new inputs in the same buffers: the amax, scale and
    codes are recomputed on the device each replay, so the result follows the new data."""
    if not fp8_gemms(cublaslt.cupy):
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    from rustyflow_py.engine.ops.fp8 import cuda

    cupy, rng = cublaslt.cupy, np.random.default_rng(4)
    m, k, n = 256, 512, 384
    x = cupy.asarray(rng.standard_normal((m, k)).astype(np.float32))
    w = cupy.asarray(rng.standard_normal((n, k)).astype(np.float32))
    out = cupy.empty((m, n), np.float32)

    def step() -> tuple[object, object]:
        a, b = cuda.quantize(x, E4M3), cuda.quantize(w, E4M3)
        cublaslt.lt.matmul_fp8(a, b, out)
        return a, b  # the captured step's buffers, kept while the graph replays

    step()  # eager: plans the GEMM
    cublaslt.stream.begin_capture()
    try:
        kept = step()
    finally:
        graph = cublaslt.stream.end_capture()
    assert kept
    new_x = rng.standard_normal((m, k)) * 50.0  # another amax, so another scale
    x.set(new_x.astype(np.float32), stream=cublaslt.stream)
    graph.launch(cublaslt.stream)
    qa, sa = quantize(new_x, E4M3)
    qb, sb = quantize(w.get(), E4M3)
    ref = (decode(qa, E4M3) * sa) @ (decode(qb, E4M3) * sb).T
    assert rel_max(out.get(), ref) < 2e-3  # the accumulator's bits, as above
