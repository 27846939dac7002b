"""The optimizer suite (OPTIMIZER=adamw|adam|sgd|lamb|rmsprop|adagrad|adadelta|muon).

- Parity with torch.optim over 50 steps of the same gradients, clipping and LR schedule, with
  weight decay on the >= 2-D tensors only (two torch param groups), per tensor within 1e-5
  relative in float32, on every device.
- LAMB and Muon against plain NumPy float64 references written from their papers' formulas,
  and their properties: LAMB's trust ratio is per tensor; Muon's Newton-Schulz output has
  singular values near 1, and only the 2-D hidden weights take Muon steps.
- Every new kernel against the reference formulation on every device (float32 and float64).
- Graph capture and transfer-free steps for every optimizer (GPU only), config rules, exact
  resume, the per-op profile, the report line, and the sample-efficiency benchmark at a tiny
  shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from helpers import STEPS_PER_EPOCH, load_script, make_cfg, quiet, run_interrupted

from rustyflow_py.engine.backend import gpu_unavailable_reason
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.ops.optim.reference import NS_COEFFICIENTS
from rustyflow_py.engine.ops.reference_set import XpKernels
from rustyflow_py.model.gpt import hidden_matrices
from rustyflow_py.model.optim import (
    SGD,
    Adadelta,
    Adagrad,
    Adam,
    AdamW,
    Lamb,
    Muon,
    Optimizer,
    RMSprop,
    Schedule,
)
from rustyflow_py.model.params import ParameterBuffer
from rustyflow_py.reporting.log_parser import read_log
from rustyflow_py.reporting.log_writer import format_block
from rustyflow_py.training.config import optimizers
from rustyflow_py.training.config.config import KEYS, OPTIMIZERS, Config, ConfigError
from rustyflow_py.training.run.loop import Trainer
from rustyflow_py.training.start.resume import MATH_KEYS, SHAPE_KEYS, START_KEYS

pytestmark = pytest.mark.usefixtures("tiny_dir")

REPO = Path(__file__).resolve().parents[1]
GPU_ONLY = pytest.mark.skipif(gpu_unavailable_reason() is not None,
                              reason=str(gpu_unavailable_reason()))
TOL = 1e-5  # per tensor, |ours - reference| / |reference|
TOL64 = 1e-6  # float64 runs: the LR, the clip factor and (on the GPU) the constants of the
# elementwise kernels are float32 scalars, so float64 buffers agree to ~1e-7, not to 1e-15
STEPS, WARMUP, CLIP, WD = 50, 5, 1.0, 0.01

# A GPT-like parameter set: two hidden matrices of one shape (one Muon batch), a tall one
# (Newton-Schulz runs it transposed), a square one, the embeddings, biases and LayerNorm.
SHAPES = {
    "wte": (40, 8), "wpe": (16, 8),
    "h.0.attn.c_attn.weight": (8, 24), "h.0.attn.c_proj.weight": (8, 8),
    "h.0.mlp.c_fc.weight": (8, 32), "h.0.mlp.c_proj.weight": (32, 8),
    "h.1.attn.c_attn.weight": (8, 24),
    "h.0.ln_1.weight": (8,), "h.0.attn.c_attn.bias": (24,), "ln_f.bias": (8,),
}
HIDDEN = ("h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight",
          "h.0.mlp.c_proj.weight", "h.1.attn.c_attn.weight")


def start_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = {n: (rng.standard_normal(s) * 0.5).astype(np.float32) for n, s in SHAPES.items()}
    w["h.0.ln_1.weight"] += 1.0
    w["ln_f.bias"][:] = 0.0  # a zero tensor: LAMB's trust ratio is 1 there
    return w


def gradients(steps: int = STEPS, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Random gradients whose global norm swings around CLIP: some steps are clipped."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        scale = float(rng.choice([0.01, 0.03, 0.1]))
        out.append({n: (rng.standard_normal(s) * scale).astype(np.float32)
                    for n, s in SHAPES.items()})
    return out


def feed(buffer: ParameterBuffer, grads: dict[str, np.ndarray]) -> None:
    host = np.concatenate([grads[s.name].ravel() for s in buffer.spans])
    buffer.grad[...] = buffer.backend.from_host(host.astype(buffer.flat.dtype))


def run_ours(device: str, make: Callable[[ParameterBuffer, Schedule], Optimizer], lr: float,
             grads: list[dict[str, np.ndarray]], dtype: Any = np.float32,
             weights: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    buffer = ParameterBuffer(weights or start_weights(), device, dtype)
    opt = make(buffer, Schedule(lr, WARMUP, len(grads), 0.1))
    for g in grads:
        feed(buffer, g)
        opt.step()
    return buffer.state_dict()


def lr_at(lr: float, total: int, step: int) -> float:
    """Our schedule's float32 learning rate at `step`, as the device computes it."""
    return float(Schedule(lr, WARMUP, total, 0.1)(step))


def rel_err(ours: Any, ref: Any) -> float:
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (scale if scale > 0 else 1.0))


def assert_close(label: str, ours: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                 tol: float = TOL) -> None:
    errors = {n: rel_err(ours[n], ref[n]) for n in ref}
    worst = max(errors, key=errors.__getitem__)
    print(f"{label}: max rel err {errors[worst]:.2e} ({worst})")
    assert all(e < tol for e in errors.values()), {n: f"{e:.1e}" for n, e in errors.items()}


def clip_factor(grads: dict[str, np.ndarray]) -> float:
    norm = math.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads.values()))
    return min(1.0, CLIP / (norm + 1e-6))


# ---- parity with torch.optim ---------------------------------------------------------------------
# case -> (our optimizer, torch class, torch arguments, peak LR); weight decay WD on >= 2-D
TORCH_CASES: dict[str, tuple[Callable[..., Optimizer], str, dict[str, Any], float]] = {
    "sgd": (lambda b, s: SGD(b, s, 0.0, False, WD, CLIP), "SGD", {"momentum": 0.0}, 0.1),
    "sgd_momentum": (lambda b, s: SGD(b, s, 0.9, False, WD, CLIP), "SGD", {"momentum": 0.9},
                     0.05),
    "sgd_nesterov": (lambda b, s: SGD(b, s, 0.9, True, WD, CLIP), "SGD",
                     {"momentum": 0.9, "nesterov": True}, 0.05),
    "adam": (lambda b, s: Adam(b, s, (0.9, 0.95), 1e-8, WD, CLIP), "Adam",
             {"betas": (0.9, 0.95), "eps": 1e-8}, 1e-2),
    "adam_torch_betas": (lambda b, s: Adam(b, s, (0.9, 0.999), 1e-8, WD, CLIP), "Adam",
                         {"betas": (0.9, 0.999), "eps": 1e-8}, 1e-2),
    "adamw": (lambda b, s: AdamW(b, s, (0.9, 0.95), 1e-8, 0.1, CLIP), "AdamW",
              {"betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}, 1e-2),
    "rmsprop": (lambda b, s: RMSprop(b, s, 0.99, 1e-8, 0.0, False, WD, CLIP), "RMSprop",
                {"alpha": 0.99, "eps": 1e-8}, 1e-3),
    "rmsprop_centered": (lambda b, s: RMSprop(b, s, 0.9, 1e-8, 0.0, True, WD, CLIP), "RMSprop",
                         {"alpha": 0.9, "eps": 1e-8, "centered": True}, 1e-3),
    "rmsprop_momentum": (lambda b, s: RMSprop(b, s, 0.99, 1e-8, 0.9, False, WD, CLIP),
                         "RMSprop", {"alpha": 0.99, "eps": 1e-8, "momentum": 0.9}, 1e-3),
    "rmsprop_centered_momentum": (
        lambda b, s: RMSprop(b, s, 0.9, 1e-8, 0.5, True, WD, CLIP), "RMSprop",
        {"alpha": 0.9, "eps": 1e-8, "momentum": 0.5, "centered": True}, 1e-3),
    "adagrad": (lambda b, s: Adagrad(b, s, 0.1, 1e-10, WD, CLIP), "Adagrad",
                {"initial_accumulator_value": 0.1, "eps": 1e-10}, 0.05),
    "adagrad_zero_start": (lambda b, s: Adagrad(b, s, 0.0, 1e-10, WD, CLIP), "Adagrad",
                           {"eps": 1e-10}, 0.05),
    "adadelta": (lambda b, s: Adadelta(b, s, 0.9, 1e-6, WD, CLIP), "Adadelta",
                 {"rho": 0.9, "eps": 1e-6}, 1.0),
}


def run_torch(cls_name: str, kwargs: dict[str, Any], lr: float,
              grads: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    torch = pytest.importorskip("torch")
    params = {n: torch.tensor(w, requires_grad=True) for n, w in start_weights().items()}
    kwargs = dict(kwargs)
    wd = kwargs.pop("weight_decay", WD)
    groups = [{"params": [p for p in params.values() if p.ndim >= 2], "weight_decay": wd},
              {"params": [p for p in params.values() if p.ndim < 2], "weight_decay": 0.0}]
    opt = getattr(torch.optim, cls_name)(groups, lr=lr, **kwargs)
    for step, g in enumerate(grads, start=1):
        for n, p in params.items():
            p.grad = torch.from_numpy(g[n].copy())
        torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        for group in opt.param_groups:
            group["lr"] = lr_at(lr, len(grads), step)
        opt.step()
    return {n: p.detach().numpy() for n, p in params.items()}


@pytest.mark.parametrize("case", TORCH_CASES)
def test_parity_with_torch_optim(device: str, case: str) -> None:
    make, cls_name, kwargs, lr = TORCH_CASES[case]
    grads = gradients()
    assert min(map(clip_factor, grads)) < 1.0 == max(map(clip_factor, grads)), "clip unused"
    theirs = run_torch(cls_name, kwargs, lr, grads)
    ours = run_ours(device, make, lr, grads)
    moved = min(rel_err(theirs[n], w) for n, w in start_weights().items() if n != "ln_f.bias")
    assert moved > 100 * TOL, f"the parameters barely moved ({moved:.1e}): a vacuous test"
    assert_close(f"{case} on {device} vs torch.optim.{cls_name}", ours, theirs)


# ---- LAMB against the paper ----------------------------------------------------------------------
def lamb_reference(lr: float, grads: list[dict[str, np.ndarray]], betas: tuple[float, float],
                   eps: float, wd: float, weights: dict[str, np.ndarray] | None = None,
                   ) -> dict[str, np.ndarray]:
    """You et al. 2019, Algorithm 2, in float64, per tensor, phi = identity; weight decay on
    the >= 2-D tensors only; the global clip first."""
    b1, b2 = betas
    w = {n: np.asarray(v, np.float64) for n, v in (weights or start_weights()).items()}
    m = {n: np.zeros_like(v) for n, v in w.items()}
    v2 = {n: np.zeros_like(v) for n, v in w.items()}
    for t, g in enumerate(grads, start=1):
        eta, scale = lr_at(lr, len(grads), t), clip_factor(g)
        for n in w:
            gt = np.asarray(g[n], np.float64) * scale
            m[n] = b1 * m[n] + (1 - b1) * gt
            v2[n] = b2 * v2[n] + (1 - b2) * gt * gt
            r = (m[n] / (1 - b1**t)) / (np.sqrt(v2[n] / (1 - b2**t)) + eps)
            u = r + wd * w[n] if w[n].ndim >= 2 else r
            wn, un = np.linalg.norm(w[n]), np.linalg.norm(u)
            ratio = wn / un if wn > 0 and un > 0 else 1.0
            w[n] = w[n] - eta * ratio * u
    return w


def make_lamb(b: ParameterBuffer, s: Schedule) -> Lamb:
    return Lamb(b, s, (0.9, 0.999), 1e-6, 0.1, CLIP)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lamb_matches_the_paper(device: str, dtype: Any) -> None:
    grads = gradients(30)
    ours = run_ours(device, make_lamb, 2e-2, grads, dtype)
    ref = lamb_reference(2e-2, grads, (0.9, 0.999), 1e-6, 0.1)
    assert_close(f"lamb {np.dtype(dtype).name} on {device}", ours, ref,
                 TOL if dtype == np.float32 else TOL64)
    assert np.array_equal(ours["ln_f.bias"] != 0, ref["ln_f.bias"] != 0)


def test_lamb_trust_ratio_is_per_tensor(device: str) -> None:
    """Scaling one tensor's weights by 10 scales its own update by 10 (without weight decay,
    its direction is unchanged) and leaves every other tensor's update exactly as it was; a
    zero tensor moves by lr * u (ratio 1)."""
    def lamb(b: ParameterBuffer, s: Schedule) -> Lamb:
        return Lamb(b, s, (0.9, 0.999), 1e-6, 0.0, 0.0)

    grads = gradients(1)
    base, big = start_weights(), start_weights()
    big["h.0.mlp.c_fc.weight"] *= 10
    moved = [{n: run[n].astype(np.float64) - w[n] for n in w}
             for run, w in ((run_ours(device, lamb, 1e-2, grads, weights=base), base),
                            (run_ours(device, lamb, 1e-2, grads, weights=big), big))]
    for n in SHAPES:
        factor = 10.0 if n == "h.0.mlp.c_fc.weight" else 1.0
        np.testing.assert_allclose(moved[1][n], factor * moved[0][n], rtol=1e-4, atol=1e-9)
    # step 1 (no clipping here): u = Adam's direction g / (|g| + eps); ratio 1 on a zero tensor
    g = grads[0]["ln_f.bias"].astype(np.float64)
    u = g / (np.abs(g) + 1e-6)
    np.testing.assert_allclose(moved[0]["ln_f.bias"], -lr_at(1e-2, 1, 1) * u, rtol=1e-5)


# ---- Muon against the reference implementation ---------------------------------------------------
def newton_schulz_reference(x: np.ndarray, steps: int = 5, eps: float = 1e-7) -> np.ndarray:
    """The quintic iteration on one matrix, in float64, in the wide orientation."""
    a, b, c = NS_COEFFICIENTS
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_reference(muon_lr: float, lr: float, grads: list[dict[str, np.ndarray]],
                   momentum: float, nesterov: bool, steps: int, wd: float,
                   betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                   ) -> dict[str, np.ndarray]:
    """Muon on the hidden matrices as the reference implementation writes it for a torch
    Linear weight W (out, in), which is our (in, out) matrix transposed; AdamW (decoupled
    decay on >= 2-D) on the rest. float64."""
    b1, b2 = betas
    w = {n: np.asarray(v, np.float64) for n, v in start_weights().items()}
    state = {n: [np.zeros_like(v.T if n in HIDDEN else v), np.zeros_like(v)]
             for n, v in w.items()}
    for t, g in enumerate(grads, start=1):
        eta, eta_muon, scale = lr_at(lr, len(grads), t), lr_at(muon_lr, len(grads), t), \
            clip_factor(g)
        for n in w:
            gt = np.asarray(g[n], np.float64) * scale
            if n in HIDDEN:
                grad, buf = gt.T, state[n][0]  # torch layout (out, in)
                buf += (1 - momentum) * (grad - buf)
                update = grad + momentum * (buf - grad) if nesterov else buf
                rows, cols = grad.shape
                o = newton_schulz_reference(update, steps) * max(1.0, rows / cols) ** 0.5
                w[n] = w[n] * (1 - eta_muon * wd) - eta_muon * o.T
                continue
            m, v = state[n]
            m[...] = b1 * m + (1 - b1) * gt
            v[...] = b2 * v + (1 - b2) * gt * gt
            if w[n].ndim >= 2:
                w[n] *= 1 - eta * wd
            w[n] -= eta * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


def make_muon(momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
              muon_lr: float = 0.02) -> Callable[[ParameterBuffer, Schedule], Muon]:
    def make(b: ParameterBuffer, s: Schedule) -> Muon:
        muon_schedule = Schedule(muon_lr, s.warmup, s.total, s.min_ratio)
        return Muon(b, s, muon_schedule, hidden_matrices(b), momentum, nesterov, ns_steps,
                    (0.9, 0.95), 1e-8, 0.1, CLIP)

    return make


@pytest.mark.parametrize(("dtype", "nesterov", "ns_steps"),
                         [(np.float32, True, 5), (np.float32, False, 3), (np.float64, True, 5)])
def test_muon_matches_the_reference_implementation(device: str, dtype: Any, nesterov: bool,
                                                   ns_steps: int) -> None:
    grads = gradients(20)
    ours = run_ours(device, make_muon(0.95, nesterov, ns_steps), 1e-2, grads, dtype)
    ref = muon_reference(0.02, 1e-2, grads, 0.95, nesterov, ns_steps, 0.1)
    assert_close(f"muon {np.dtype(dtype).name} nesterov={nesterov} steps={ns_steps} on "
                 f"{device}", ours, ref, TOL if dtype == np.float32 else TOL64)


def test_muon_matches_torch_optim_muon_with_its_iteration_in_float64(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.optim.Muon (adjust_lr_fn='original') on the hidden matrices, transposed to torch's
    (out, in) layout, with its Newton-Schulz made float64 (it runs bfloat16)."""
    torch = pytest.importorskip("torch")
    module = pytest.importorskip("torch.optim._muon")
    if not hasattr(module, "_zeropower_via_newtonschulz"):
        pytest.skip("this torch's Muon has another internal layout")

    def float64_ns(grad: Any, coefficients: Any, steps: int, eps: float) -> Any:
        return torch.from_numpy(newton_schulz_reference(grad.double().numpy(), steps, eps))

    monkeypatch.setattr(module, "_zeropower_via_newtonschulz", float64_ns)
    grads = gradients(10)
    params = {n: torch.tensor(start_weights()[n].T.astype(np.float64), requires_grad=True)
              for n in HIDDEN}
    opt = torch.optim.Muon(list(params.values()), lr=0.02, weight_decay=0.1, momentum=0.95,
                           nesterov=True, adjust_lr_fn="original")
    for step, g in enumerate(grads, start=1):
        scale = clip_factor(g)
        for n, p in params.items():
            p.grad = torch.from_numpy(g[n].T.astype(np.float64) * scale)
        opt.param_groups[0]["lr"] = lr_at(0.02, len(grads), step)
        opt.step()
    theirs = {n: p.detach().numpy().T for n, p in params.items()}
    ours = run_ours("cpu", make_muon(), 1e-2, grads, np.float64)
    assert_close("muon vs torch.optim.Muon", {n: ours[n] for n in HIDDEN}, theirs, 1e-7)


def test_newton_schulz_gives_singular_values_near_one(device: str) -> None:
    """Five quintic steps map every singular value in [0.0016, 1] of the normalised matrix
    into [0.68, 1.21] (they do not converge to 1: the coefficients trade that for speed). A
    random wide matrix and one with a spread spectrum (condition number 100) land there; an
    ill-conditioned square one still never exceeds 1.21."""
    backend = get_backend(device)
    k, rng = backend.kernels, np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    v, _ = np.linalg.qr(rng.standard_normal((96, 32)))
    spread = (u * np.logspace(-2, 0, 32)) @ v.T  # (32, 96), singular values 0.01 .. 1
    batch = np.stack([spread, rng.standard_normal((32, 96))]).astype(np.float32)
    out = backend.to_host(k.newton_schulz(backend.from_host(batch), 5, 1e-7, k.matmul))
    for matrix in out:
        s = np.linalg.svd(matrix.astype(np.float64), compute_uv=False)
        assert 0.68 <= s.min() and s.max() <= 1.21, s
    square = rng.standard_normal((1, 48, 48)).astype(np.float32)
    s = np.linalg.svd(backend.to_host(k.newton_schulz(backend.from_host(square), 5, 1e-7,
                                                      k.matmul))[0], compute_uv=False)
    assert s.max() <= 1.21 and np.median(s) > 0.68


def test_muon_steps_only_the_hidden_matrices(device: str) -> None:
    """Muon's own steps go to the blocks' 2-D weights; everything else (embeddings, biases,
    LayerNorm) gets exactly AdamW's steps, with AdamW state for those tensors only."""
    grads = gradients(5)
    ours = run_ours(device, make_muon(), 1e-2, grads)
    adamw = run_ours(device, lambda b, s: AdamW(b, s, (0.9, 0.95), 1e-8, 0.1, CLIP), 1e-2,
                     grads)
    for n in SHAPES:
        if n in HIDDEN:
            assert rel_err(ours[n], adamw[n]) > 1e-3, n
        else:
            np.testing.assert_allclose(ours[n], adamw[n], rtol=1e-6, atol=1e-7, err_msg=n)
    buffer = ParameterBuffer(start_weights(), device, np.float32)
    muon = make_muon()(buffer, Schedule(1e-2, 1, 5, 0.1))
    assert set(muon.muon_names) == set(HIDDEN) == set(hidden_matrices(buffer))
    sizes = muon.state_sizes()
    hidden_size = sum(math.prod(SHAPES[n]) for n in HIDDEN)
    assert sizes["muon_buffer"] == hidden_size
    assert sizes["m"] == sizes["v"] == buffer.flat.size - hidden_size
    assert len(muon.groups) == 4  # (8, 24) x 2, (8, 8), (8, 32), (32, 8) transposed


def test_muon_takes_only_existing_two_dimensional_tensors() -> None:
    buffer = ParameterBuffer(start_weights(), "cpu", np.float32)
    sched = Schedule(1e-2, 1, 5, 0.1)
    for hidden in (("ln_f.bias",), ("no.such.weight",)):
        with pytest.raises(ValueError, match="Muon takes existing 2-D tensors"):
            Muon(buffer, sched, sched, hidden)


# ---- every new kernel against the reference formulation ------------------------------------------
class Pair:
    """A device's kernels and the reference formulation on the same device."""

    def __init__(self, device: str, dtype: Any) -> None:
        self.backend, self.dtype = get_backend(device), dtype
        self.mine, self.ref = self.backend.kernels, XpKernels(self.backend)
        self.rng = np.random.default_rng(0)

    def randn(self, *shape: int, scale: float = 1.0) -> Any:
        host = self.rng.standard_normal(shape) * scale
        return self.backend.from_host(host.astype(self.dtype))

    def scalar(self, value: float, dtype: Any = np.float32) -> Any:
        return self.backend.from_host(np.asarray(value, dtype))

    def run(self, fn: Callable[[Any, list[Any]], Any], arrays: list[Any]) -> None:
        """fn(kernels, copies of arrays) for both kernel sets; every array must agree."""
        results = []
        for k in (self.mine, self.ref):
            copies = [None if a is None else a.copy() for a in arrays]
            out = fn(k, copies)
            results.append([*copies, *([] if out is None else [out])])
        # float32 tolerances on the GPU: its elementwise kernels take their constants (betas,
        # momentum, weight decay) as float32 for float64 arrays too
        tight = self.dtype == np.float64 and self.backend.kind != "gpu"
        rtol, atol = (1e-9, 1e-11) if tight else (1e-5, 1e-6)
        for mine, ref in zip(*results, strict=True):
            if mine is None:
                continue
            np.testing.assert_allclose(self.backend.to_host(mine), self.backend.to_host(ref),
                                       rtol=rtol, atol=atol)


N, DECAY = 300_001, 200_003  # several CPU blocks and CUDA chunks; the boundary inside one


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def pair(device: str, request: pytest.FixtureRequest) -> Pair:
    return Pair(device, request.param)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_kernel_adam(pair: Pair, clip: float | None) -> None:
    lr, step = pair.scalar(1e-2), pair.scalar(3, np.int32)
    scale = None if clip is None else pair.scalar(clip)
    arrays = [pair.randn(N), pair.randn(N), pair.randn(N), abs(pair.randn(N)) * 0.1]
    pair.run(lambda k, a: k.adam(a[0], a[1], a[2], a[3], lr, step, scale, (0.9, 0.95), 1e-8,
                                 0.1, DECAY), arrays)


@pytest.mark.parametrize("nesterov", [False, True])
def test_kernel_sgd(pair: Pair, nesterov: bool) -> None:
    lr, scale = pair.scalar(1e-2), pair.scalar(0.5)
    pair.run(lambda k, a: k.sgd(a[0], a[1], a[2], lr, scale, 0.9, nesterov, 0.1, DECAY),
             [pair.randn(N), pair.randn(N), pair.randn(N)])


@pytest.mark.parametrize(("centered", "momentum"), [(False, 0.0), (True, 0.0), (False, 0.9),
                                                    (True, 0.9)])
def test_kernel_rmsprop(pair: Pair, centered: bool, momentum: float) -> None:
    lr, scale = pair.scalar(1e-2), pair.scalar(0.5)
    sq = abs(pair.randn(N)) + 4.0  # > grad_avg ** 2: the centered variance stays positive
    arrays = [pair.randn(N), pair.randn(N), sq, pair.randn(N, scale=0.3) if centered else None,
              pair.randn(N) if momentum else None]
    pair.run(lambda k, a: k.rmsprop(a[0], a[1], a[2], a[3], a[4], lr, scale, 0.9, 1e-8,
                                    momentum, 0.1, DECAY), arrays)


def test_kernel_adagrad_and_adadelta(pair: Pair) -> None:
    lr, scale = pair.scalar(1e-2), pair.scalar(0.5)
    pair.run(lambda k, a: k.adagrad(a[0], a[1], a[2], lr, scale, 1e-10, 0.1, DECAY),
             [pair.randn(N), pair.randn(N), abs(pair.randn(N))])
    pair.run(lambda k, a: k.adadelta(a[0], a[1], a[2], a[3], lr, None, 0.9, 1e-6, 0.1, DECAY),
             [pair.randn(N), pair.randn(N), abs(pair.randn(N)), abs(pair.randn(N))])


def test_kernel_lamb(pair: Pair) -> None:
    """Segments of odd sizes across CPU blocks and CUDA chunks, one all-zero (ratio 1)."""
    bounds = (0, 5, 9000, 70_001, DECAY, 250_000, N)
    lr, step, scale = pair.scalar(1e-2), pair.scalar(3, np.int32), pair.scalar(0.5)
    p = pair.randn(N)
    p[:5] = 0
    segments = {id(k): k.segments(bounds) for k in (pair.mine, pair.ref)}
    pair.run(lambda k, a: k.lamb(a[0], a[1], a[2], a[3], lr, step, scale, (0.9, 0.999), 1e-6,
                                 0.1, DECAY, segments[id(k)]),
             [p, pair.randn(N), pair.randn(N), abs(pair.randn(N)) * 0.1])


@pytest.mark.parametrize("nesterov", [False, True])
def test_kernel_muon(pair: Pair, nesterov: bool) -> None:
    """Momentum into a transposed slot of a batch, Newton-Schulz on the batch, the update
    from a transposed view."""
    scale, lr = pair.scalar(0.5), pair.scalar(0.02)

    def muon(k: Any, a: list[Any]) -> Any:
        g, buf, batch, p = a
        k.muon_momentum(g, buf, batch[1].T, scale, 0.95, nesterov)
        x = k.newton_schulz(batch, 5, 1e-7, k.matmul)
        k.muon_apply(p, x[1].T, lr, 0.1, 2.0)
        return x

    pair.run(muon, [pair.randn(40, 16), pair.randn(40, 16), pair.randn(3, 16, 40),
                    pair.randn(40, 16)])


# ---- the trainer: every optimizer end to end -----------------------------------------------------
def tiny(**changes: Any) -> Config:
    return make_cfg(**changes)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_trains_and_reports_itself(optimizer: str) -> None:
    extra = {"adadelta": {"LEARNING_RATE": 1.0}, "rmsprop": {"LEARNING_RATE": 1e-3}}.get(
        optimizer, {})
    trainer = Trainer(tiny(OPTIMIZER=optimizer, MAX_STEPS=12, PROFILE=True, **extra), quiet)
    record = trainer.run()
    assert record is not None and len(trainer.losses) == 12
    assert trainer.losses[-1] < trainer.losses[0], trainer.losses
    settings = record["optimizer_settings"]
    assert settings == optimizers.settings(trainer.cfg)
    assert settings["learning_rate"] == trainer.cfg.learning_rate
    assert set(settings) >= {k.lower() for k in optimizers.OPTIMIZER_KEYS[optimizer]}
    line = next(x for x in format_block(record).splitlines() if x.startswith("Backend:"))
    assert f"| optimizer {optimizer} (learning_rate=" in line
    ops = {(op["name"], op["phase"], op["category"]) for op in record["profile"]["ops"]}
    assert ("grad_norm", "optimizer", "other") in ops
    kernel = {"muon": "muon_momentum"}.get(optimizer, optimizer)
    assert (kernel, "optimizer", "other") in ops, ops
    if optimizer == "muon":
        assert {("newton_schulz.matmul", "optimizer", "matmul"), ("newton_schulz", "optimizer",
                "other"), ("muon_apply", "optimizer", "other"),
                ("adamw", "optimizer", "other")} <= ops
    logged = read_log("log.txt")[-1]
    assert logged["optimizer"] == optimizer and logged["optimizer_settings"] == settings


@pytest.mark.parametrize("changes", [
    {"OPTIMIZER": "rmsprop", "CENTERED": True, "MOMENTUM": 0.5, "LEARNING_RATE": 1e-3},
    {"OPTIMIZER": "lamb"},
    {"OPTIMIZER": "muon"},
    {"OPTIMIZER": "adagrad", "INITIAL_ACCUMULATOR": 0.1},
], ids=lambda c: c["OPTIMIZER"])
def test_resume_continues_exactly(changes: dict[str, Any]) -> None:
    cfg = tiny(**changes)
    straight = Trainer(cfg, quiet)
    straight.run()
    first = run_interrupted(cfg, 11)
    resumed = Trainer(cfg, quiet, resume=first.checkpoint_path)
    resumed.run()
    assert resumed.losses == straight.losses and len(resumed.losses) == STEPS_PER_EPOCH
    ours, theirs = resumed.model.buffer.state_dict(), straight.model.buffer.state_dict()
    assert all(np.array_equal(ours[n], theirs[n]) for n in ours)


def test_resume_names_a_change_of_rmsprop_state() -> None:
    """MOMENTUM 0 -> 0.9 gives RMSprop a momentum buffer the checkpoint does not have."""
    first = run_interrupted(tiny(OPTIMIZER="rmsprop", MOMENTUM=0.0), 5)
    with pytest.raises(Exception, match=r"OPTIMIZER=rmsprop keeps other state .*"
                                        r"MOMENTUM 0.0 -> 0.9"):
        Trainer(tiny(OPTIMIZER="rmsprop", MOMENTUM=0.9), quiet, resume=first.checkpoint_path)
    with pytest.raises(Exception, match="CENTERED=False .checkpoint. vs True"):
        Trainer(tiny(OPTIMIZER="rmsprop", MOMENTUM=0.0, CENTERED=True), quiet,
                resume=first.checkpoint_path)


def test_resume_warns_only_for_keys_the_optimizer_reads() -> None:
    first = run_interrupted(tiny(OPTIMIZER="muon"), 5)
    warned: list[str] = []
    Trainer(tiny(OPTIMIZER="muon", MUON_LR=0.01, RHO=0.5, MOMENTUM=0.1), quiet,
            resume=first.checkpoint_path, warn=warned.append)
    [warning] = warned
    assert "MUON_LR 0.02 -> 0.01" in warning and "RHO" not in warning
    assert "MOMENTUM" not in warning.replace("MUON_MOMENTUM", "")


def test_the_banner_shows_muons_split() -> None:
    from click.testing import CliRunner

    from rustyflow_py.cli import main

    result = CliRunner().invoke(main, ["banner", "--config", "tiny.env", "--optimizer", "muon"])
    assert result.exit_code == 0, result.output
    row = next(x for x in result.output.splitlines() if x.startswith("  optimizer"))
    assert ("muon (2-D hidden weights) + adamw (embeddings, biases, LayerNorm) (MUON_LR=0.02, "
            "MUON_MOMENTUM=0.95, MUON_NESTEROV=true, NS_STEPS=5") in row


# ---- config --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "message"), [
    ({"optimizer": "adam", "nesterov": True}, "NESTEROV=true .* applies only to OPTIMIZER=sgd"),
    ({"optimizer": "muon", "nesterov": True}, "muon has MUON_NESTEROV"),
    ({"optimizer": "adamw", "centered": True}, "CENTERED=true .* applies only to "
                                               "OPTIMIZER=rmsprop"),
    ({"optimizer": "sgd", "nesterov": True, "momentum": 0.0}, "NESTEROV=true .* needs MOMENTUM"),
    ({"optimizer": "muon", "muon_momentum": 0.0}, "MUON_NESTEROV=true .* needs MUON_MOMENTUM > 0"
                                                  r".*MUON_MOMENTUM \(e.g. 0.95\)"),
    ({"ns_steps": 0}, "NS_STEPS='0' is not valid: expected an integer in"),
    ({"rmsprop_alpha": 1.0}, r"RMSPROP_ALPHA='1.0' is not valid: expected a finite number in "
                             r"\[0, 1\)"),
    ({"initial_accumulator": -0.1}, "INITIAL_ACCUMULATOR='-0.1' is not valid"),
    ({"adadelta_eps": 0.0}, "ADADELTA_EPS='0.0' is not valid"),
    ({"muon_nesterov": "maybe"}, "MUON_NESTEROV='maybe' is not valid"),
    ({"centered": "maybe"}, "CENTERED='maybe' is not valid: expected true or false"),
    ({"muon_momentum": 1.0}, "MUON_MOMENTUM='1.0' is not valid"),
    ({"rho": -0.1}, "RHO='-0.1' is not valid"),
    ({"adagrad_eps": "nan"}, "ADAGRAD_EPS='nan' is not valid"),
    ({"muon_lr": 0}, "MUON_LR='0' is not valid: expected a finite number > 0"),
])
def test_config_rules(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**changes)


def test_config_allows_what_is_merely_unused() -> None:
    """Numbers for other optimizers are ignored, not errors (a config file keeps them all);
    MUON_NESTEROV's default true with MUON_MOMENTUM=0 is fine when muon is not used."""
    assert Config(optimizer="adamw", muon_momentum=0.0, rho=0.5).rho == 0.5
    assert Config(optimizer="sgd", nesterov=True).nesterov
    assert Config(optimizer="muon", muon_momentum=0.0, muon_nesterov=False).muon_momentum == 0


def test_every_optimizer_key_is_classified_for_resume() -> None:
    keys = set().union(*optimizers.OPTIMIZER_KEYS.values()) | set(optimizers.SCHEDULE_KEYS)
    assert keys <= set(SHAPE_KEYS) | set(MATH_KEYS) | set(START_KEYS) | {"CENTERED"}
    assert keys <= set(KEYS)
    assert set(optimizers.OPTIMIZER_KEYS) == set(OPTIMIZERS) == set(KEYS["OPTIMIZER"].choices)


# ---- GPU: graph capture and transfer-free steps --------------------------------------------------
def gpu_config(tmp_path: Path, optimizer: str, **extra: Any) -> Config:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        words = [f"w{i % 37}" for i in range(6000)]
        corpus.write_text("\n".join(" ".join(words[i:i + 12]) for i in range(0, 6000, 12)))
    values: dict[str, Any] = dict(
        dataset=str(corpus), seq_len=16, batch_size=4, embed_dim=32, num_heads=2, num_layers=2,
        log_file=str(tmp_path / "log.txt"), model_path=str(tmp_path / "m.npz"), device="gpu",
        log_interval=5, warmup_steps=3, profile_steps=3, max_steps=20, optimizer=optimizer,
        learning_rate=1.0 if optimizer == "adadelta" else 3e-3, momentum=0.5,
        centered=optimizer == "rmsprop")
    values.update(extra)
    return Config(**values)


@GPU_ONLY
@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_graph_replay_matches_eager(tmp_path: Path, optimizer: str) -> None:
    """Graph replay computes what eager steps compute, for every optimizer's state updates. The
    run is in fp64: the GPU step is not bitwise repeatable (the embedding backward adds rows
    with atomics, in no fixed order), and an optimizer that divides by a small running average
    (RMSprop early on) amplifies that rounding noise step after step. In fp32 two RMSprop runs
    (eager or replayed) drifted apart by 7e-6 to 5e-5 relative in 20 steps on an H100, so no
    fixed bound both held and would catch a mismatch of that size; in fp64 the same noise stays
    far below the 1e-9 held here."""
    runs = []
    for graph in ("off", "on"):
        trainer = Trainer(gpu_config(tmp_path, optimizer, graph=graph, precision="fp64"), quiet,
                          overwrite=True)  # the two runs share a checkpoint path
        trainer.run()
        runs.append(trainer)
    eager, graphed = runs
    assert graphed.runner.captured is not None, "the step was not captured"
    assert len(graphed.losses) == len(eager.losses) == 20
    np.testing.assert_allclose(graphed.losses, eager.losses, rtol=1e-9, atol=0)


@GPU_ONLY
@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_optimizer_steps_make_no_transfers(optimizer: str) -> None:
    import cupyx

    from rustyflow_py.engine.backend import counting_transfers, strict_transfers
    from rustyflow_py.engine.tensor import Tensor
    from rustyflow_py.model.gpt import GPT, GPTConfig
    from rustyflow_py.training.config.optimizers import make_optimizer

    model = GPT(GPTConfig(vocab_size=101, seq_len=16, n_layer=2, n_head=2, n_embd=32), "gpu")
    cfg = Config(optimizer=optimizer, momentum=0.5, centered=optimizer == "rmsprop")
    opt = make_optimizer(cfg, model.buffer, 10)
    xp, rng = model.buffer.backend.xp, np.random.default_rng(0)
    x = xp.asarray(rng.integers(0, 101, (4, 16)), dtype=np.int32)
    y = xp.asarray(rng.integers(0, 101, (4, 16)), dtype=np.int32)
    with counting_transfers() as seen, strict_transfers(), cupyx.allow_synchronize(False):
        for _ in range(2):
            model.buffer.zero_grad()
            model(Tensor(x), Tensor(y)).backward()
            opt.step()
    assert seen.h2d_count == seen.d2h_count == 0


# ---- the sample-efficiency benchmark at a tiny shape ---------------------------------------------
def _benchmark() -> ModuleType:
    return load_script(REPO / "benchmarks" / "optimizers.py", "bench_optimizers")


def test_optimizer_benchmark_runs_at_a_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "optimizers.md"
    _benchmark().main([
        "--device", "cpu", "--dataset", "tiny.txt", "--layers", "1", "--heads", "2",
        "--embed", "32", "--seq-len", "16", "--batch", "4", "--steps", "6", "--warmup", "2",
        "--adamw-lrs", "1e-3,3e-3", "--muon-lrs", "0.02", "--out", str(out)])
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| adamw") or
            line.startswith("| muon")]
    assert len(rows) == 3, text
    assert "validation loss" in text and "best" in text.lower()
    assert all(math.isfinite(float(r.split("|")[5])) for r in rows), rows
