"""ADAM_STATE_DTYPE=bf16: Adam's moments in bf16, widened for each update and rounded back
stochastically. On the CPU the reference's rounding (what it does, and why round-to-nearest
would not do) and the refusals; on a GPU the vector and one-element kernels against the
reference, and a checkpoint of the moments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import make_cfg

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.optim.reference import round_bf16_stochastic
from rustyflow_py.engine.ops.reference_set import XpKernels
from rustyflow_py.errors import ConfigError
from rustyflow_py.model.optim import AdamW, Schedule
from rustyflow_py.model.params import ParameterBuffer

pytestmark = pytest.mark.usefixtures("tiny_dir")  # make_cfg's dataset
bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
HYPER = ((0.9, 0.95), 1e-8, 0.1)  # betas, eps, weight decay


def neighbours(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bf16 values just below and above float32 x (x itself twice where it is one)."""
    down = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    up = (x.view(np.uint32) + np.uint32(0xFFFF)) & np.uint32(0xFFFF0000)
    return down.astype(bf16), up.view(np.float32).astype(bf16)


def reference_step(kernels: Any, xp: Any, n: int, state: Any, steps: int = 1,
                   betas: tuple[float, float] = (0.9, 0.95), g: Any = None) -> tuple[Any, ...]:
    """p, m, v after `steps` AdamW steps of the reference from fixed values, the moments in
    `state`'s dtype (starting at 2^-7, a bf16 value)."""
    rng = np.random.default_rng(1)
    p = xp.asarray(rng.standard_normal(n).astype(np.float32))
    g = xp.asarray(rng.standard_normal(n).astype(np.float32)) if g is None else g
    m, v = (xp.asarray(np.full(n, 2.0**-7, np.float32).astype(state)) for _ in range(2))
    lr, scale = xp.asarray(1e-3, np.float32), xp.asarray(1.0, np.float32)
    for t in range(1, steps + 1):
        kernels.adamw(p, g, m, v, lr, xp.asarray(t, np.int32), scale, betas, *HYPER[1:],
                      n // 2)
    return p, m, v


def test_the_moments_round_to_a_bf16_neighbour_and_the_parameters_do_not_change() -> None:
    """One step: the parameters are the float32 moments' (the update reads the moments
    before they are rounded), each moment is one of the two bf16 values around its float32
    one, and both neighbours occur (the rounding is not to nearest)."""
    ref = XpKernels(get_backend("cpu"))
    p32, m32, v32 = reference_step(ref, np, 4096, np.float32)
    p16, m16, v16 = reference_step(ref, np, 4096, bf16)
    np.testing.assert_array_equal(p16, p32)
    for got, wide in ((m16, m32), (v16, v32)):
        down, up = neighbours(wide)
        assert ((got == down) | (got == up)).all()
        split = down != up
        assert (got[split] == up[split]).mean() == pytest.approx(0.5, abs=0.15)


def test_stochastic_rounding_keeps_a_slow_second_moment_following_its_gradient() -> None:
    """beta2 = 0.999 and a constant gradient: v's increments fall under half a bf16 step
    once v is a quarter of g^2. Rounded to nearest, v stops there; rounded stochastically it
    follows float32's v to within 1% on average over the elements."""
    ref, n, steps = XpKernels(get_backend("cpu")), 2048, 1500
    g = np.ones(n, np.float32)
    _, _, v32 = reference_step(ref, np, n, np.float32, steps, (0.9, 0.999), g)
    _, _, v16 = reference_step(ref, np, n, bf16, steps, (0.9, 0.999), g)
    assert float(v16.astype(np.float32).mean()) == pytest.approx(float(v32.mean()), rel=0.01)
    nearest = np.full(n, 2.0**-7, np.float32).astype(bf16)  # the same recursion, nearest
    for _ in range(steps):
        nearest = (0.999 * nearest.astype(np.float32) + 0.001).astype(bf16)
    assert float(nearest.astype(np.float32).mean()) < 0.8 * float(v32.mean())


def test_a_nan_moment_stays_nan_and_the_bits_depend_on_index_and_step() -> None:
    x = np.array([np.nan, 1.0 + 2**-9, -(1.0 + 2**-9), np.inf], np.float32)
    out = np.empty(4, bf16)
    round_bf16_stochastic(np, x, out, np.asarray(7, np.int32), False)
    assert np.isnan(out[0].astype(np.float32)) and out[3] == np.inf
    many = np.full(256, 1.0 + 2**-9, np.float32)  # halfway between two bf16 values
    draws = []
    for step in (1, 2):
        out = np.empty(256, bf16)
        round_bf16_stochastic(np, many, out, np.asarray(step, np.int32), False)
        draws.append(out.astype(np.float32))
    assert set(np.unique(draws[0])) == {1.0, 1.0078125}
    assert (draws[0] != draws[1]).any()


@pytest.mark.parametrize(("keys", "named"), [
    ({"DEVICE": "cpu"}, "DEVICE=cpu"), ({"DEVICE": "gpu", "OPTIMIZER": "sgd"}, "OPTIMIZER=sgd"),
    ({"DEVICE": "gpu", "SHARD_OPTIMIZER": "true"}, "SHARD_OPTIMIZER=true"),
])
def test_bf16_moments_are_refused_where_no_kernel_keeps_them(keys: dict[str, str],
                                                            named: str) -> None:
    with pytest.raises(ConfigError, match=f"ADAM_STATE_DTYPE=bf16.*{named}"):
        make_cfg(ADAM_STATE_DTYPE="bf16", **keys)
    make_cfg(ADAM_STATE_DTYPE="bf16", DEVICE="gpu", OPTIMIZER="muon")  # its AdamW part


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "muon"])
def test_by_default_the_moments_take_the_parameters_dtype(optimizer: str) -> None:
    """ADAM_STATE_DTYPE=fp32 means the parameters' own dtype: float64 in a PRECISION=fp64
    run (its gradient checks), not float32."""
    from rustyflow_py.training.config.optimizers import make_optimizer

    weights = {"w": np.ones((4, 4)), "b": np.ones(4)}
    buffer = ParameterBuffer(weights, "cpu", np.float64)
    opt = make_optimizer(make_cfg(OPTIMIZER=optimizer), buffer, 10)
    assert opt.m.dtype == opt.v.dtype == np.float64


def test_the_optimizer_refuses_bf16_moments_on_the_cpu() -> None:
    buffer = ParameterBuffer({"w": np.ones((4, 4), np.float32)}, "cpu", np.float32)
    with pytest.raises(ValueError, match="ADAM_STATE_DTYPE=bf16 with DEVICE=gpu"):
        AdamW(buffer, Schedule(1e-3, 1, 10, 0.1), state_dtype=bf16)


# ---- on a GPU ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpu() -> Any:
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    return get_backend("gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["adamw", "adam"])
@pytest.mark.parametrize("grad", ["float32", "bfloat16"])
def test_the_gpu_kernels_round_the_moments_as_the_reference(gpu: Any, name: str,
                                                             grad: str) -> None:
    """The vector kernel (4096 elements) and the one-element one (an odd 1001, and a view
    off the vectors' alignment) round with the reference's bits: the same bf16 moments but
    where float32 arithmetic put a value on the other side of a rounding edge (at most one
    bf16 step, in at most 0.5% of them: one element of 1000 on the device); the parameters
    to float32's rounding."""
    xp, rng = gpu.xp, np.random.default_rng(2)
    for n, offset in ((4096, 0), (1001, 0), (1000, 1)):
        host = [rng.standard_normal(n + offset).astype(np.float32) for _ in range(4)]
        g_host = host[1].astype(bf16) if grad == "bfloat16" else host[1]
        runs = []
        # the reference reads the bf16 gradient widened, as the kernels do (its own product
        # with the clip factor would round in bf16)
        for kernels, grads in ((gpu.kernels, g_host), (XpKernels(gpu), g_host.astype(np.float32))):
            p, g = xp.asarray(host[0])[offset:], xp.asarray(grads)[offset:]
            m, v = (xp.asarray((np.abs(h) * 0.01).astype(bf16))[offset:] for h in host[2:])
            for t in (1, 2, 3):
                getattr(kernels, name)(p, g, m, v, xp.asarray(1e-3, np.float32),
                                       xp.asarray(t, np.int32), xp.asarray(0.5, np.float32),
                                       *HYPER, n // 3)
            runs.append([a.get() for a in (p, m, v)])
        (p, m, v), (p_ref, m_ref, v_ref) = runs
        np.testing.assert_allclose(p, p_ref, rtol=1e-6, atol=1e-7)
        for got, want in ((m, m_ref), (v, v_ref)):
            steps = np.abs(got.view(np.uint16).astype(np.int32)
                           - want.view(np.uint16).astype(np.int32))
            assert steps.max() <= 1 and (steps > 0).mean() <= 5e-3


@pytest.mark.gpu
def test_the_vector_and_one_element_kernels_give_the_same_bits(gpu: Any) -> None:
    xp, rng = gpu.xp, np.random.default_rng(3)
    host = [rng.standard_normal(4096).astype(np.float32) for _ in range(2)]
    runs = []
    for lo in (0, 1):  # moments on 8-byte boundaries (vectors), or one element off (none)
        p, g = xp.asarray(host[0]), xp.asarray(host[1])
        m, v = xp.zeros(4097, bf16)[lo: lo + 4096], xp.zeros(4097, bf16)[lo: lo + 4096]
        for t in (1, 2):
            gpu.kernels.adamw(p, g, m, v, xp.asarray(1e-3, np.float32), xp.asarray(t, np.int32),
                              None, *HYPER, 2048)
        runs.append([a.get() for a in (p, m, v)])
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_a_checkpoint_holds_bf16_moments_as_float32_and_restores_their_bits(gpu: Any) -> None:
    rng = np.random.default_rng(4)
    weights = {"w": rng.standard_normal((64, 32)).astype(np.float32)}
    made = []
    for _ in range(2):
        buffer = ParameterBuffer(weights, gpu, np.float32)
        buffer.grad[...] = gpu.xp.asarray(rng.standard_normal(buffer.grad.size), np.float32)
        made.append(AdamW(buffer, Schedule(1e-2, 1, 10, 0.1), state_dtype=bf16))
    saver, loader = made
    saver.step()
    state = saver.state_dict()
    assert state["m"].dtype == np.float32 and state["v"].dtype == np.float32
    loader.load_state_dict(state)
    for name in ("m", "v"):
        assert getattr(loader, name).dtype == bf16
        np.testing.assert_array_equal(getattr(loader, name).get(), getattr(saver, name).get())


@pytest.mark.gpu
def test_a_replayed_update_rounds_as_the_eager_updates(gpu: Any) -> None:
    """Captured once and replayed, the update rounds each step's moments with that step's
    bits (its counter read on the device): three replays give three eager updates' bits."""
    from rustyflow_py.engine.graph import CapturedStep

    rng = np.random.default_rng(5)
    weights = {"w": rng.standard_normal((64, 33)).astype(np.float32)}
    grad = rng.standard_normal(64 * 33).astype(np.float32)
    runs = []
    for graphed in (False, True):
        buffer = ParameterBuffer(weights, gpu, np.float32)
        buffer.grad[...] = gpu.xp.asarray(grad)
        opt = AdamW(buffer, Schedule(1e-2, 1, 10, 0.1), state_dtype=bf16)
        opt.step()  # the warm-up step, eager in both
        warm = buffer.flat.get()
        if graphed:
            captured = CapturedStep(gpu, opt.step)
            captured.capture()
            for _ in range(3):
                captured.replay()
        else:
            for _ in range(3):
                opt.step()
        assert not np.array_equal(buffer.flat.get(), warm), "the replays updated nothing"
        runs.append([a.get() for a in (buffer.flat, opt.m, opt.v)])
    for eager, replayed in zip(*runs, strict=True):
        np.testing.assert_array_equal(replayed, eager)
