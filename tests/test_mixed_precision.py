"""Mixed precision (PRECISION=bf16|fp16): float32 master weights with a 16-bit compute copy,
float32 gradients, and fp16's dynamic loss scaling with PyTorch GradScaler's rules.

The engine-level mechanics run on the CPU too (its kernels take float16); training with
bf16/fp16 is the GPU's, so those cases skip without one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from helpers import log_records, make_cfg, quiet, spy_fp8_gemms

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.precision import Precision
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.errors import ConfigError
from rustyflow_py.model.gpt import GPT, GPTConfig
from rustyflow_py.model.loss_scale import LossScaler
from rustyflow_py.model.optim import AdamW, Muon, Schedule
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.training.run.loop import Trainer
from rustyflow_py.training.run.parts import check_precision

pytestmark = pytest.mark.usefixtures("tiny_dir")

GPU = pytest.mark.skipif(gpu_unavailable_reason() is not None,
                         reason=str(gpu_unavailable_reason()))
CFG = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, n_embd=32)


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, CFG.vocab_size, (4, CFG.seq_len + 1))
    return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)


def loss_and_grad(model: GPT, seed: Any = None) -> tuple[float, np.ndarray]:
    x, y = batch()
    model.buffer.zero_grad()
    loss = model(Tensor(x, device=model.buffer.backend), Tensor(y, device=model.buffer.backend))
    loss.backward(seed)
    backend = model.buffer.backend
    return float(backend.to_host(loss.data)), backend.to_host(model.buffer.grad)


def fp8_tensor_cores() -> None:
    """Skip on a GPU without FP8 tensor cores (compute capability below 8.9)."""
    from rustyflow_py.engine.devices import gpu_capability
    from rustyflow_py.engine.precision import has_fp8_gemms

    if not has_fp8_gemms(gpu_capability()):
        pytest.skip("PRECISION=fp8 needs compute capability 8.9 or later")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---- the configuration ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8"])
def test_16_bit_precisions_are_gpu_only(name: str) -> None:
    with pytest.raises(ConfigError, match=f"PRECISION={name} is GPU-only.*PRECISION=fp32"):
        check_precision(name, "cpu", None)
    with pytest.raises(ConfigError, match="unusable: no CUDA"):
        check_precision(name, "cpu", "no CUDA")
    check_precision(name, "gpu", None)
    check_precision("fp32", "cpu", None)


def test_a_cpu_run_with_bf16_stops_before_any_work() -> None:
    with pytest.raises(ConfigError, match="PRECISION=fp16 is GPU-only"):
        Trainer(make_cfg(PRECISION="fp16"), quiet)


# ---- the compute copy (CPU: float16 compute works on every backend) ---------------------------
def test_parameters_compute_in_16_bit_while_gradients_and_master_stay_float32() -> None:
    model = GPT(CFG, "cpu", seed=3, compute=np.float16)
    buf = model.buffer
    assert buf.flat.dtype == np.float32 and buf.compute_flat.dtype == np.float16
    assert all(t.data.dtype == np.float16 and t.grad.dtype == np.float32
               for t in buf.params.values())
    np.testing.assert_array_equal(buf.compute_flat, buf.flat.astype(np.float16))
    ref = GPT(CFG, "cpu", seed=3)
    loss16, grad16 = loss_and_grad(model)
    loss32, grad32 = loss_and_grad(ref)
    assert loss16 == pytest.approx(loss32, rel=1e-2)
    assert rel(grad16, grad32) < 3e-2
    # the optimizer updates the master and refreshes the copy
    opt = AdamW(buf, Schedule(1e-2, 0, 10, 1.0))
    before = buf.compute_flat.copy()
    opt.step()
    np.testing.assert_array_equal(buf.compute_flat, buf.flat.astype(np.float16))
    assert not np.array_equal(buf.compute_flat, before)
    # and loading weights does too
    buf.load_state_dict(ref.buffer.state_dict())
    np.testing.assert_array_equal(buf.compute_flat, ref.buffer.flat.astype(np.float16))


# ---- the loss scaler's rules (NumPy arrays: the same array code runs on the device) -------------
def test_scaler_factor_unscales_clips_and_says_skip_on_overflow() -> None:
    s = LossScaler(np, init_scale=1024.0)
    assert float(s.seed(4)) == 256.0
    assert float(s.unscaled(np.float32(2048.0))) == 2.0
    assert float(s.factor(np.float32(3.0), None)) == 1 / 1024
    assert float(s.factor(np.float32(3.0), np.float32(0.5))) == 0.5 / 1024
    assert float(s.factor(np.float32(np.inf), None)) == -1.0
    assert float(s.factor(np.float32(np.nan), np.float32(0.5))) == -1.0


def test_scaler_backs_off_on_overflow_and_grows_after_clean_steps() -> None:
    s = LossScaler(np, init_scale=2.0**16, growth_interval=3)
    for norm, scale, skipped in [(1.0, 2**16, 0), (np.inf, 2**15, 1), (1.0, 2**15, 1),
                                 (np.nan, 2**14, 2), (1.0, 2**14, 2), (1.0, 2**14, 2),
                                 (1.0, 2**15, 2), (1.0, 2**15, 2)]:
        s.update(np.float32(norm))
        assert (float(s.scale), int(s.skipped)) == (scale, skipped), norm
        assert float(s.overflow) == (0.0 if math.isfinite(norm) else 1.0)
    state = s.state_dict(np.asarray)
    t = LossScaler(np)
    t.load_state_dict(state, np.asarray)
    assert t.state(float) == {"scale": 2.0**15, "skipped": 2} and int(t.clean) == 1


def test_the_default_rules_are_gradscalers() -> None:
    s = LossScaler(np)
    assert float(s.scale) == 65536.0 and s.growth_interval == 2000


# ---- on the GPU ---------------------------------------------------------------------------------
@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8"])
def test_16_bit_model_matches_float32_loss_and_gradients(name: str) -> None:
    """fp8 is bf16 with the GEMMs' operands in FP8 (3 mantissa bits for e4m3, 2 for the
    gradients' e5m2): the loss still within 2%, the gradient further off."""
    p = Precision.of(name)
    if name == "fp8":
        fp8_tensor_cores()
    model = GPT(CFG, get_backend("gpu", RunPolicy(p)), seed=5, compute=p.compute)
    assert model.p["h.0.attn.c_attn.weight"].data.dtype == p.compute
    loss16, grad16 = loss_and_grad(model)
    loss32, grad32 = loss_and_grad(GPT(CFG, "gpu", seed=5))
    assert loss16 == pytest.approx(loss32, rel=2e-2)
    assert rel(grad16, grad32) < {"bf16": 8e-2, "fp16": 3e-2, "fp8": 0.3}[name]


def _fp16_model(optimizer: str = "adamw") -> tuple[GPT, Any, LossScaler]:
    p = Precision.of("fp16")
    model = GPT(CFG, "gpu", seed=7, compute=p.compute)
    buf = model.buffer
    if optimizer == "muon":
        hidden = tuple(s.name for s in buf.spans if s.name.startswith("h.") and len(s.shape) == 2)
        opt: Any = Muon(buf, Schedule(1e-2, 0, 100, 1.0), Schedule(2e-2, 0, 100, 1.0), hidden)
    else:
        opt = AdamW(buf, Schedule(1e-2, 0, 100, 1.0))
    # 2**16 overflows this model's first gradients (as GradScaler's first steps often do)
    opt.loss_scaler = scaler = LossScaler(buf.backend.xp, init_scale=2.0**8)
    return model, opt, scaler


def _scaled_step(model: GPT, opt: Any, scaler: LossScaler) -> None:
    loss_and_grad(model, scaler.seed(1))
    opt.step()


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_fp16_overflow_skips_the_step_halves_the_scale_and_training_goes_on(
        optimizer: str) -> None:
    model, opt, scaler = _fp16_model(optimizer)
    host = model.buffer.backend.to_host
    _scaled_step(model, opt, scaler)  # a clean step
    assert scaler.state(host) == {"scale": 2.0**8, "skipped": 0}
    weights = host(model.buffer.flat)
    state = {k: host(getattr(opt, k)) for k in opt.state_names}  # moments, momentum
    scaler.scale[...] = 2.0**40  # gradients x 2**40 overflow float16 (max 65504)
    _scaled_step(model, opt, scaler)
    assert scaler.state(host) == {"scale": 2.0**39, "skipped": 1}
    np.testing.assert_array_equal(host(model.buffer.flat), weights)  # not applied
    for k, v in state.items():
        np.testing.assert_array_equal(host(getattr(opt, k)), v, err_msg=k)
    assert not math.isfinite(float(host(opt.grad_norm)))
    scaler.scale[...] = 2.0**10
    _scaled_step(model, opt, scaler)  # and the next clean step trains
    assert scaler.state(host) == {"scale": 2.0**10, "skipped": 1}
    assert not np.array_equal(host(model.buffer.flat), weights)
    assert np.isfinite(host(model.buffer.flat)).all()


@GPU
@pytest.mark.gpu
def test_fp16_scaled_gradients_equal_the_unscaled_ones_after_unscaling() -> None:
    model, opt, scaler = _fp16_model()
    _, grad = loss_and_grad(model, scaler.seed(1))
    _, grad32 = loss_and_grad(GPT(CFG, "gpu", seed=7))
    assert rel(grad / 2.0**8, grad32) < 3e-2


@GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8", "fp8-delayed"])
def test_training_in_16_bit_with_graph_replay(name: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8 also runs its Linear layers' GEMMs and the head's in FP8 inside the captured step
    (forward, input and weight gradients): none of them fell back to bf16 there. With
    FP8_SCALING=delayed every cast inside the captured step is scaled from its site, and
    the producers that can write FP8 themselves do (at a width and batch their kernels take:
    the MLP's GELU backward, the LayerNorms next to a Linear, forward and backward)."""
    from rustyflow_py.engine.ops.gemm.fp8_sites import Fp8Sites

    precision, _, scaling = name.partition("-")
    if precision == "fp8":
        fp8_tensor_cores()
    fp8_calls = spy_fp8_gemms(monkeypatch)
    scalings: list[tuple[bool, bool]] = []  # (in the capture, from a site)
    real = Fp8Sites.scaling

    def spy(self: Any, *cast: Any) -> Any:
        chosen = real(self, *cast)
        scalings.append((self._lt().stream.is_capturing(), chosen.site is not None))
        return chosen

    monkeypatch.setattr(Fp8Sites, "scaling", spy)
    from rustyflow_py.engine.ops.fp8 import cuda

    gelu_codes: list[bool] = []  # in the capture, for each GELU backward writing FP8 codes
    real_codes = cuda.gelu_backward_codes

    def spy_codes(*args: Any) -> Any:
        gelu_codes.append(any(capturing for capturing, _ in scalings[-1:]))
        return real_codes(*args)

    monkeypatch.setattr(cuda, "gelu_backward_codes", spy_codes)
    ln_codes: list[bool] = []  # the same, for each LayerNorm writing its output's FP8 codes
    real_ln = cuda.layernorm_forward_codes

    def spy_ln(*args: Any) -> Any:
        ln_codes.append(any(capturing for capturing, _ in scalings[-1:]))
        return real_ln(*args)

    monkeypatch.setattr(cuda, "layernorm_forward_codes", spy_ln)
    ln_grad_codes: list[bool] = []  # the same, for each LayerNorm backward writing dx's
    real_ln_grad = cuda.layernorm_backward_codes

    def spy_ln_grad(*args: Any) -> Any:
        ln_grad_codes.append(any(capturing for capturing, _ in scalings[-1:]))
        return real_ln_grad(*args)

    monkeypatch.setattr(cuda, "layernorm_backward_codes", spy_ln_grad)
    fp8_scaling = {"FP8_SCALING": scaling or "current"} if precision == "fp8" else {}
    # delayed: 128 rows a step, of 256 values: what the FP8-writing producers take
    wide = {"EMBED_DIM": 256, "NUM_HEADS": 4, "BATCH_SIZE": 8} if scaling == "delayed" else {}
    cfg = make_cfg(DEVICE="gpu", PRECISION=precision, NUM_EPOCHS=3, GRAPH="on", PROFILE=True,
                   PROFILE_STEPS=2, **wide, **fp8_scaling)
    trainer = Trainer(cfg, quiet)
    record = trainer.run()
    assert (record["status"] == "completed" and record["graph"]
            and record["precision"] == precision)
    assert record["fp8_scaling"] == ((scaling or "current") if precision == "fp8" else None)
    # the record lists each tensor the captured step casts, with the amax of its last replay
    tensors = record["fp8_tensors"]
    if precision == "fp8":
        assert tensors and len(tensors) == sum(capturing for capturing, _ in scalings)
        assert all(t["amax"] > 0 and math.isfinite(t["scale"]) for t in tensors)
        assert {t["format"] for t in tensors} == {"e4m3", "e5m2"}
        assert "FP8 casts per step:" in format_block(log_records()[-1])
    else:
        assert tensors is None
    captured = {call for call in fp8_calls if call.endswith(":captured")}
    assert captured == ({"linear:None:captured", "matmul:None:captured", "matmul:a:captured",
                         "matmul:b:captured"} if precision == "fp8" else set())
    in_capture = {sited for capturing, sited in scalings if capturing}
    assert in_capture == ({scaling == "delayed"} if precision == "fp8" else set())
    # with delayed scaling the captured MLPs' GELU backward writes dpre as FP8 codes itself
    assert set(gelu_codes) == ({True} if scaling == "delayed" else set())
    assert set(ln_codes) == ({True} if scaling == "delayed" else set())
    assert set(ln_grad_codes) == ({True} if scaling == "delayed" else set())
    losses = trainer.losses
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert math.isfinite(record["val_ppl"]) and math.isfinite(record["test_ppl"])
    block = format_block(log_records()[-1])
    if name == "fp16":  # no growth within 87 steps: each skip halved the initial 2**16
        skipped, scale = record["loss_scale"]["skipped"], record["loss_scale"]["scale"]
        assert 0 <= skipped < 10 and scale == 2.0 ** (16 - skipped)
        assert f"Loss scaling: final scale {scale:g} | {skipped} of 87 steps skipped" in block
    else:
        assert record["loss_scale"] is None and "Loss scaling" not in block
