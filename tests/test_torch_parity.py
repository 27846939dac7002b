"""Float32 parity with PyTorch: every op forward and backward, a whole GPT, AdamW, the schedule.

The finite-difference checks (test_gradcheck.py) prove each backward is the derivative of its
forward in float64; these prove that what we compute in float32 is what PyTorch computes,
to a norm-wise relative error of TOL per tensor. Torch always runs on the CPU from host copies
of the same inputs, so the GPU cases compare our device results with the same reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import REPO, load_script

from rustyflow_py.engine import ops
from rustyflow_py.engine.backend import Backend
from rustyflow_py.engine.library import get_backend
from rustyflow_py.engine.policy import RunPolicy
from rustyflow_py.engine.tensor import Tensor
from rustyflow_py.model.gpt import GPT, GPTConfig, init_weights
from rustyflow_py.model.optim import AdamW, Schedule

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOL = 1e-5
RNG = np.random.default_rng(0)


REF = load_script(REPO / "benchmarks" / "torch_gpt.py")  # the folder is no package


@pytest.fixture
def dev(device: str) -> str:
    """The device under test: its default backend computes fp32 (no TF32), so parity is
    float32 all the way."""
    assert get_backend(device).policy.matmul_compute == "fp32"
    return device


def rel_err(ours: Any, ref: Any) -> float:
    """|ours - ref| / |ref| over the whole tensor (in float64, so the metric adds no error)."""
    a, b = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != reference {b.shape}"
    scale = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (scale if scale > 0 else 1.0))


def assert_parity(label: str, pairs: dict[str, tuple[Any, Any]]) -> None:
    """Every (ours, reference) pair within TOL; prints the worst (pytest -s shows it)."""
    errors = {name: rel_err(a, b) for name, (a, b) in pairs.items()}
    worst = max(errors, key=errors.__getitem__)
    print(f"parity {label}: max rel err {errors[worst]:.2e} ({worst})")
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v < TOL}
    assert not bad, f"{label}: relative error above {TOL}: {bad}"


def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def compare(
    label: str, device: str | Backend, ours: Callable[..., Tensor], theirs: Callable[..., Any],
    arrays: list[np.ndarray],
) -> None:
    """Run both on the same inputs, backpropagate the same random upstream gradient, and
    compare the output and the gradient of every floating-point input."""
    ts = [Tensor(a.copy(), requires_grad=a.dtype.kind == "f", device=device) for a in arrays]
    refs = [torch.tensor(a, requires_grad=True) if a.dtype.kind == "f"
            else torch.from_numpy(a.astype(np.int64)) for a in arrays]
    out, ref = ours(*ts), theirs(*refs)
    upstream = np.asarray(RNG.standard_normal(tuple(ref.shape)), np.float32)
    pairs = {"forward": (out.numpy(), ref.detach().numpy())}
    out.backward(out.backend.from_host(upstream))
    ref.backward(torch.from_numpy(upstream))
    for i, (t, r) in enumerate(zip(ts, refs, strict=True)):
        if t.requires_grad:
            pairs[f"grad[{i}]"] = (t.backend.to_host(t.grad), r.grad.numpy())
    assert_parity(label, pairs)


# ---- elementwise ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sa", "sb"),
    [((16, 24), (16, 24)), ((4, 8, 24), (24,)), ((4, 1, 24), (8, 1)), ((1,), (8, 24)),
     ((8, 24), ())],
)
def test_add_mul_broadcast(dev: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a, b = randn(*sa), randn(*sb)
    compare(f"add {sa}+{sb}", dev, ops.add, torch.add, [a, b])
    compare(f"mul {sa}*{sb}", dev, ops.mul, torch.mul, [a, b])


def test_scalar_ops(dev: str) -> None:
    def fn(x: Any) -> Any:
        return -((x * 3.0 + 1.5) * -2.0 - 0.25)

    compare("scalar add/mul", dev, fn, fn, [randn(8, 24)])


# ---- matmul ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sa", "sb", "transpose_b"),
    [((32, 48), (48, 40), False), ((4, 32, 48), (4, 48, 40), False),
     ((4, 32, 48), (48, 40), False), ((2, 3, 16, 24), (2, 3, 24, 16), False),
     ((64, 48), (200, 48), True), ((4, 16, 48), (200, 48), True)],
)
def test_matmul(dev: str, sa: tuple[int, ...], sb: tuple[int, ...], transpose_b: bool) -> None:
    def theirs(a: Any, b: Any) -> Any:
        return a @ (b.T if transpose_b else b)

    compare(f"matmul {sa}@{sb}{'^T' if transpose_b else ''}", dev,
            lambda a, b: ops.matmul(a, b, transpose_b=transpose_b), theirs,
            [randn(*sa), randn(*sb)])


# ---- shape ops and reductions ---------------------------------------------------------------
def test_shape_ops(dev: str) -> None:
    x = randn(4, 6, 8)
    compare("reshape", dev, lambda t: ops.reshape(t, (24, 8)), lambda t: t.reshape(24, 8), [x])
    compare("transpose", dev, lambda t: ops.transpose(t, (2, 0, 1)),
            lambda t: t.permute(2, 0, 1), [x])
    key = (slice(None), slice(1, 5), 3)
    compare("index", dev, lambda t: ops.index(t, key), lambda t: t[key], [x])
    compare("split", dev, lambda t: ops.split(t, 2, axis=1)[1] * 2.0,
            lambda t: torch.split(t, 3, dim=1)[1] * 2.0, [x])


@pytest.mark.parametrize(("axis", "keepdims"), [(None, False), (1, False), ((0, 2), True),
                                                (-1, True)])
def test_sum_mean(dev: str, axis: int | tuple[int, ...] | None, keepdims: bool) -> None:
    x = randn(4, 6, 8)

    def theirs(name: str) -> Callable[[Any], Any]:
        def fn(t: Any) -> Any:
            reduce = getattr(torch, name)
            return reduce(t) if axis is None else reduce(t, dim=axis, keepdim=keepdims)

        return fn

    compare(f"sum axis={axis}", dev, lambda t: ops.sum(t, axis, keepdims), theirs("sum"), [x])
    compare(f"mean axis={axis}", dev, lambda t: ops.mean(t, axis, keepdims), theirs("mean"), [x])


# ---- model ops -------------------------------------------------------------------------------
def test_embedding_repeated_indices(dev: str) -> None:
    idx = RNG.integers(0, 7, size=(4, 16)).astype(np.int32)  # 64 lookups of 7 rows: repeats
    compare("embedding", dev, ops.embedding, lambda w, i: F.embedding(i, w),
            [randn(50, 24), idx])


def test_layer_norm(dev: str) -> None:
    compare("layer_norm", dev, ops.layer_norm,
            lambda x, w, b: F.layer_norm(x, (32,), w, b, eps=1e-5),
            [randn(4, 16, 32, scale=3.0) + 1.0, randn(32), randn(32)])


def test_gelu(dev: str) -> None:
    compare("gelu", dev, ops.gelu, lambda x: F.gelu(x, approximate="tanh"),
            [randn(8, 64, scale=2.0)])
    compare("gelu+bias", dev, ops.gelu, lambda x, b: F.gelu(x + b, approximate="tanh"),
            [randn(4, 8, 64, scale=2.0), randn(64)])


def test_linear(dev: str) -> None:
    compare("linear", dev, ops.linear, lambda x, w, b: x @ w + b,
            [randn(4, 16, 32), randn(32, 48, scale=0.2), randn(48)])


def test_mlp(dev: str) -> None:
    compare("mlp", dev, ops.mlp,
            lambda x, w1, b1, w2, b2: F.gelu(x @ w1 + b1, approximate="tanh") @ w2 + b2,
            [randn(4, 16, 32), randn(32, 128, scale=0.2), randn(128), randn(128, 32, scale=0.1),
             randn(32)])


def test_attention(dev: str) -> None:
    compare("attention", dev, lambda qkv: ops.causal_self_attention(qkv, n_head=4),
            lambda qkv: REF.causal_attention(qkv, 4), [randn(2, 24, 3 * 32)])


@pytest.mark.parametrize("inplace", [False, True])
def test_cross_entropy(dev: str, inplace: bool) -> None:
    targets = RNG.integers(0, 50, size=(4, 8)).astype(np.int32)
    compare(f"cross_entropy inplace={inplace}", dev,
            lambda x, t: ops.cross_entropy(x, t, inplace=inplace),
            lambda x, t: F.cross_entropy(x.reshape(-1, 50), t.reshape(-1)),
            [randn(4, 8, 50, scale=3.0), targets])


@pytest.mark.parametrize("scale", [1.0, 40.0])
@pytest.mark.parametrize("rows", [0, 256])  # LM_HEAD_CHUNK: all 600 rows; 256, 256 and 88
def test_lm_head_cross_entropy(dev: str, scale: float, rows: int) -> None:
    # 600 x 2,000 logits: large enough for the CPU kernels' row blocks and threads; scale 40
    # makes the model confident enough that rows need the max shift recomputed
    targets = RNG.integers(0, 2000, size=600).astype(np.int32)
    backend = get_backend(dev, RunPolicy(head_chunk=rows))
    compare(f"lm_head_cross_entropy scale={scale} rows={rows}", backend,
            ops.lm_head_cross_entropy,
            lambda h, w, t: F.cross_entropy(h @ w.T, t),
            [randn(600, 64, scale=scale), randn(2000, 64), targets])


def test_dropout_matches_torch_with_the_same_mask(dev: str) -> None:
    p, x = 0.3, randn(64, 80)
    t = Tensor(x, requires_grad=True, device=dev)
    y = ops.dropout(t, p)
    out = y.numpy()
    mask = (out != 0).astype(np.float32)  # x has no exact zeros, so the output reveals it
    assert 0.25 < 1.0 - mask.mean() < 0.35
    upstream = randn(64, 80)
    y.backward(t.backend.from_host(upstream))
    ref_x = torch.tensor(x, requires_grad=True)
    ref = ref_x * torch.from_numpy(mask) / (1.0 - p)
    ref.backward(torch.from_numpy(upstream))
    assert_parity("dropout", {"forward": (out, ref.detach().numpy()),
                              "grad[0]": (t.backend.to_host(t.grad), ref_x.grad.numpy())})


# ---- the whole model -------------------------------------------------------------------------
CFG = GPTConfig(vocab_size=211, seq_len=32, n_layer=2, n_head=4, n_embd=64)


def model_pair(device: str) -> tuple[GPT, Any, dict[str, np.ndarray]]:
    """Our GPT and the torch reference with the same weights; LayerNorm and bias parameters
    are perturbed away from their 1/0 init so a mistake in how they enter shows up."""
    weights = init_weights(CFG, seed=7)
    for w in weights.values():
        if w.ndim == 1:
            w += randn(*w.shape, scale=0.1)
    ours = GPT(CFG, device)
    ours.buffer.load_state_dict(weights)
    ref = REF.TorchGPT(CFG.vocab_size, CFG.seq_len, CFG.n_layer, CFG.n_head, CFG.n_embd)
    ref.load_from_rustyflow(weights)
    return ours, ref, weights


def batch(b: int = 4) -> tuple[np.ndarray, np.ndarray]:
    tokens = RNG.integers(0, CFG.vocab_size, size=(b, CFG.seq_len + 1)).astype(np.int32)
    return tokens[:, :-1], tokens[:, 1:]


def test_gpt_loss_and_every_gradient(dev: str) -> None:
    ours, ref, _ = model_pair(dev)
    x, y = batch()
    loss = ours(Tensor(x, device=dev), Tensor(y, device=dev))
    loss.backward()
    ref_loss = ref(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
    ref_loss.backward()
    ref_grads = ref.to_rustyflow(grads=True)
    to_host = ours.buffer.backend.to_host
    pairs = {"loss": (loss.item(), ref_loss.item())}
    pairs.update({f"grad {n}": (to_host(t.grad), ref_grads[n]) for n, t in ours.p.items()})
    assert len(pairs) == len(ref_grads) + 1
    assert_parity("gpt 2-layer", pairs)


def test_adamw_with_clipping_matches_torch(dev: str) -> None:
    """Four steps (two warm-up, two cosine) on the same gradients, clipping active on some."""
    ours, ref, _ = model_pair(dev)
    lr, warmup, total = 3e-3, 2, 4
    opt = AdamW(ours.buffer, Schedule(lr, warmup, total, 0.1), betas=(0.9, 0.95), eps=1e-8,
                weight_decay=0.1, grad_clip=1.0)
    ref_opt = REF.make_adamw(ref, lr, weight_decay=0.1)
    backend = ours.buffer.backend
    norms = []
    for step, loss_scale in enumerate((20.0, 0.05, 5.0, 0.1), start=1):
        x, y = batch()
        ref_opt.zero_grad()
        ref_loss = ref(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
        (ref_loss * loss_scale).backward()
        for name, g in ref.to_rustyflow(grads=True).items():  # the very same gradients
            ours.p[name].grad[...] = backend.from_host(np.ascontiguousarray(g))
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0))
        for group in ref_opt.param_groups:
            group["lr"] = REF.cosine_lr(step, lr, warmup, total, 0.1)
        ref_opt.step()
        opt.step()
        norms.append(ref_norm)
        theirs = ref.to_rustyflow()
        pairs = {"grad_norm": (float(backend.to_host(opt.grad_norm)), ref_norm),
                 "lr": (float(backend.to_host(opt.lr)), ref_opt.param_groups[0]["lr"])}
        pairs.update({n: (w, theirs[n]) for n, w in ours.buffer.state_dict().items()})
        assert_parity(f"adamw step {step}", pairs)
    assert max(norms) > 1.0 > min(norms), f"clipping not exercised both ways: norms {norms}"


@pytest.mark.parametrize(("warmup", "total"), [(100, 200), (0, 50), (10, 10)])
def test_schedule_matches_python_formula(dev: str, warmup: int, total: int) -> None:
    backend = get_backend(dev)
    sched = Schedule(1e-3, warmup, total, 0.1)
    steps = range(1, total + 20)
    ours = [float(backend.to_host(sched(backend.xp.asarray(s, dtype=np.int32), backend.xp)))
            for s in steps]
    theirs = [REF.cosine_lr(s, 1e-3, warmup, total, 0.1) for s in steps]
    worst = max(abs(a - b) / b for a, b in zip(ours, theirs, strict=True))
    print(f"parity schedule warmup={warmup} total={total}: max rel err {worst:.2e}")
    assert worst < 1e-6
