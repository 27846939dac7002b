"""Optimizers over a flat parameter buffer: AdamW (default), Adam, SGD, RMSprop, AdaGrad,
AdaDelta, LAMB and Muon (with AdamW on what Muon leaves), each one or a few fused kernels.

The learning-rate schedule, the step count and the global grad-norm clip all stay in
device memory (0-d arrays), so a step needs no host value and can be replayed as a graph.
Weight decay applies to the decayed tensors only (the buffer's first decay_size elements):
decoupled for AdamW, LAMB and Muon, an L2 term of the gradient for the others, as in
torch.optim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np

from ..engine.ops import widen
from ..engine.tensor import count_gemm, run_op
from .loss_scale import LossScaler
from .params import ParameterBuffer
from .wd_schedule import DecaySchedule


class Schedule:
    """Linear warm-up to `lr` over `warmup` steps, then cosine decay to lr*min_ratio."""

    def __init__(self, lr: float, warmup: int, total: int, min_ratio: float) -> None:
        self.lr, self.warmup, self.total, self.min_ratio = lr, warmup, max(total, 1), min_ratio

    def __call__(self, step: Any, xp: Any = np) -> Any:
        """LR (float32) for the 1-based `step`, an int or a 0-d array of module `xp`."""
        s = xp.asarray(step).astype(np.float32)
        warm = s / max(self.warmup, 1)
        span = max(self.total - self.warmup, 1)
        progress = xp.clip((s - self.warmup) / span, 0.0, 1.0)
        floor = self.min_ratio * self.lr
        decay = floor + (self.lr - floor) * 0.5 * (1.0 + xp.cos(math.pi * progress))
        return xp.where(s <= self.warmup, self.lr * warm, decay).astype(np.float32)


class Optimizer:
    """Shared machinery: device-side step counter, grad-norm clipping, state (de)serialisation."""

    state_names: tuple[str, ...] = ()
    # True: _update's kernel writes the 16-bit compute copy too (no compute_copy pass)
    writes_compute_copy: ClassVar[bool] = False
    # True: on the GPU, _update and the grad norm take a bf16 gradient as it is (the summed
    # bf16 copy a data-parallel run sums in, with no widening pass back into float32)
    takes_bf16_grad: ClassVar[bool] = False

    def __init__(self, buffer: ParameterBuffer, schedule: Schedule, grad_clip: float) -> None:
        self.buffer, self.schedule, self.grad_clip = buffer, schedule, grad_clip
        xp = buffer.backend.xp
        self.xp = xp
        self.step_count = xp.zeros((), dtype=np.int32)  # lives on the device
        self.grad_norm = xp.zeros((), dtype=np.float32)
        self.lr = xp.zeros((), dtype=np.float32)
        self.kernels = buffer.backend.kernels
        # Set when `buffer` is one shard of the gradient (a sharded optimizer): sums a 0-d
        # array over the shards in place, so the norm (and its clip) stays global.
        self.sum_over_shards: Any = None
        self.loss_scaler: LossScaler | None = None  # float16 runs (see loss_scale.py)
        # WD_SCHEDULE (wd_schedule.py): decoupled decay applied apart, the kernels' set to 0
        self.decay_schedule: DecaySchedule | None = None
        # Set by the gradient sync when the step reads the summed gradient where the
        # collectives left it (see `grad`)
        self.summed_grad: Any = None

    @property
    def reads_bf16_grad(self) -> bool:
        """Whether this optimizer may be handed a bf16 gradient (`summed_grad`)."""
        return self.takes_bf16_grad and self.buffer.backend.kind == "gpu"

    @property
    def grad(self) -> Any:
        """The gradient a step reads: the buffer's, or the summed bf16 copy handed over by a
        data-parallel run's all-reduce (bf16 values widen to float32 exactly, so the update
        is the same as from the widened gradient, with one pass over memory fewer)."""
        return self.buffer.grad if self.summed_grad is None else self.summed_grad

    def clip_scale(self) -> Any:
        """Global grad-norm (kept for logging) and the factor the update multiplies gradients
        by: the one that clips the norm to grad_clip, folded with the loss scaler's 1/scale
        (negative: skip the step) in a float16 run; None when there is nothing to apply."""
        g = self.grad
        norm = run_op("grad_norm", "other", "optimizer", self.kernels.l2_norm, g)
        if self.sum_over_shards is not None:
            square = self.xp.array(norm * norm)  # a fresh, writable 0-d array
            self.sum_over_shards(square)
            norm = self.xp.sqrt(square)
        scaler = self.loss_scaler
        self.grad_norm[...] = norm if scaler is None else scaler.unscaled(norm)
        clip = (self.xp.minimum(1.0, self.grad_clip / (self.grad_norm + 1e-6))
                if self.grad_clip > 0 else None)
        return clip if scaler is None else scaler.factor(self.grad_norm, clip)

    def step(self) -> None:
        """One update. Each part runs as an op of its own (the kernel-level profile of a
        replayed step attributes every kernel to the op that launched it)."""
        run_op("lr_schedule", "other", "optimizer", self._advance)
        scale = run_op("grad_clip", "other", "optimizer", self.clip_scale)
        if self.decay_schedule is not None:
            run_op("weight_decay", "other", "optimizer", self.decay_schedule.apply, self, scale)
        self._update(scale)
        if self.loss_scaler is not None:
            run_op("loss_scale", "other", "optimizer", self.loss_scaler.update, self.grad_norm)
        if not (self.writes_compute_copy and self._compute_copy() is not None):
            run_op("compute_copy", "other", "optimizer", self.buffer.sync_compute)

    def _compute_copy(self) -> Any:
        """The buffer's 16-bit compute copy, for an update kernel that writes it in its own
        pass; None when there is none to write (a float32 run, or a ZeRO shard, whose copy
        is refreshed after the all-gather)."""
        copy = getattr(self.buffer, "compute_flat", None)
        return None if copy is None or copy is self.buffer.flat else copy

    def _advance(self) -> None:
        """Count the step and set its learning rate (on the device: no host read)."""
        self.step_count += 1
        self._set_lr()

    def _set_lr(self) -> None:
        self.lr[...] = self.schedule(self.step_count, self.xp)

    def _update(self, scale: Any) -> None:
        raise NotImplementedError

    def decay_regions(self) -> list[tuple[int, int, Any]]:
        """(start, stop, lr): the decayed element ranges and the learning rate that scales
        their decoupled decay (a 0-d device array)."""
        return [(0, self.buffer.decay_size, self.lr)]

    def _moment_dtype(self, state_dtype: Any) -> np.dtype:
        """Adam's moments' dtype: the parameters' (None), or bfloat16 on the GPU
        (ADAM_STATE_DTYPE=bf16: the kernels round them stochastically)."""
        dtype = np.dtype(self.buffer.flat.dtype if state_dtype is None else state_dtype)
        if dtype != self.buffer.flat.dtype and (dtype.name != "bfloat16"
                                                or self.buffer.backend.kind != "gpu"):
            raise ValueError(f"Adam's moments in {dtype.name} beside {self.buffer.flat.dtype} "
                             "parameters: only bfloat16 moments, and on the GPU "
                             "(ADAM_STATE_DTYPE=bf16 with DEVICE=gpu)")
        return dtype

    def state_dict(self) -> dict[str, np.ndarray]:
        """Each state array on the host; bf16 moments widened to float32 (exactly), so a
        checkpoint holds no dtype NumPy lacks, and loads into float32 or bf16 moments."""
        to_host = self.buffer.backend.to_host
        state = {name: widen.wide(to_host(getattr(self, name)))[0] for name in self.state_names}
        state["step_count"] = to_host(self.step_count)
        if self.loss_scaler is not None:
            state.update(self.loss_scaler.state_dict(to_host))
        return state

    def state_sizes(self) -> dict[str, int]:
        """Element count of each state array, as state_dict() names them."""
        sizes = {name: int(getattr(self, name).size) for name in self.state_names}
        return {**sizes, "step_count": 1}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        from_host = self.buffer.backend.from_host
        for name in (*self.state_names, "step_count"):
            if name not in state:
                raise ValueError(f"optimizer state lacks {name!r}: saved by another optimizer?")
            getattr(self, name)[...] = from_host(np.asarray(state[name]))
        if self.loss_scaler is not None:
            self.loss_scaler.load_state_dict(state, from_host)


class AdamW(Optimizer):
    """Decoupled weight decay Adam (Loshchilov & Hutter), PyTorch's update order."""

    state_names = ("m", "v")
    kernel = "adamw"
    writes_compute_copy = True
    takes_bf16_grad = True

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8, weight_decay: float = 0.1, grad_clip: float = 1.0,
        state_dtype: Any = None,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        state = self._moment_dtype(state_dtype)
        self.m = self.xp.zeros(buffer.flat.shape, state)
        self.v = self.xp.zeros(buffer.flat.shape, state)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op(self.kernel, "other", "optimizer", getattr(self.kernels, self.kernel), b.flat,
               self.grad, self.m, self.v, self.lr, self.step_count, scale, self.betas, self.eps,
               self.weight_decay, b.decay_size, self._compute_copy())


class Adam(AdamW):
    """Adam with weight decay as an L2 term of the gradient (torch.optim.Adam)."""

    kernel = "adam"


class SGD(Optimizer):
    """SGD with optional (Nesterov) momentum and L2 weight decay on matrices (torch.optim.SGD,
    no dampening)."""

    state_names = ("velocity",)

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, momentum: float = 0.0,
        nesterov: bool = False, weight_decay: float = 0.0, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        if nesterov and momentum <= 0:
            raise ValueError("NESTEROV=true needs MOMENTUM > 0")
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.velocity = self.xp.zeros_like(buffer.flat)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("sgd", "other", "optimizer", self.kernels.sgd, b.flat, b.grad, self.velocity,
               self.lr, scale, self.momentum, self.nesterov, self.weight_decay, b.decay_size)


class RMSprop(Optimizer):
    """RMSprop (torch.optim.RMSprop): standard or centered, with optional momentum; L2 weight
    decay on matrices. The centered average and the momentum buffer exist only when used."""

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, alpha: float = 0.99,
        eps: float = 1e-8, momentum: float = 0.0, centered: bool = False,
        weight_decay: float = 0.0, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.alpha, self.eps, self.momentum = alpha, eps, momentum
        self.centered, self.weight_decay = centered, weight_decay
        zeros = self.xp.zeros_like
        self.square_avg = zeros(buffer.flat)
        self.grad_avg = zeros(buffer.flat) if centered else None
        self.momentum_buffer = zeros(buffer.flat) if momentum > 0 else None
        self.state_names = ("square_avg", *(["grad_avg"] if centered else []),
                            *(["momentum_buffer"] if momentum > 0 else []))

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("rmsprop", "other", "optimizer", self.kernels.rmsprop, b.flat, b.grad,
               self.square_avg, self.grad_avg, self.momentum_buffer, self.lr, scale, self.alpha,
               self.eps, self.momentum, self.weight_decay, b.decay_size)


class Adagrad(Optimizer):
    """AdaGrad (torch.optim.Adagrad without lr decay), L2 weight decay on matrices."""

    state_names = ("state_sum",)

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, initial_accumulator: float = 0.0,
        eps: float = 1e-10, weight_decay: float = 0.0, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.eps, self.weight_decay = eps, weight_decay
        self.state_sum = self.xp.full_like(buffer.flat, initial_accumulator)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("adagrad", "other", "optimizer", self.kernels.adagrad, b.flat, b.grad,
               self.state_sum, self.lr, scale, self.eps, self.weight_decay, b.decay_size)


class Adadelta(Optimizer):
    """AdaDelta (torch.optim.Adadelta), L2 weight decay on matrices. The learning rate scales
    the update as in torch (whose default is 1.0)."""

    state_names = ("square_avg", "acc_delta")

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, rho: float = 0.9, eps: float = 1e-6,
        weight_decay: float = 0.0, grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.rho, self.eps, self.weight_decay = rho, eps, weight_decay
        self.square_avg = self.xp.zeros_like(buffer.flat)
        self.acc_delta = self.xp.zeros_like(buffer.flat)

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("adadelta", "other", "optimizer", self.kernels.adadelta, b.flat, b.grad,
               self.square_avg, self.acc_delta, self.lr, scale, self.rho, self.eps,
               self.weight_decay, b.decay_size)


class Lamb(Optimizer):
    """LAMB (You et al. 2019, Algorithm 2): Adam's direction plus decoupled weight decay,
    scaled per tensor by the trust ratio ||w|| / ||update|| (1 where either is 0). The
    tensors are the buffer's spans; on the GPU their norms are one segmented reduction."""

    state_names = ("m", "v")

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule,
        betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
        grad_clip: float = 1.0,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.m = self.xp.zeros_like(buffer.flat)
        self.v = self.xp.zeros_like(buffer.flat)
        bounds = (0, *(s.offset + s.size for s in buffer.spans))
        self.segments = self.kernels.segments(bounds)  # made once: may copy to the device

    def _update(self, scale: Any) -> None:
        b = self.buffer
        run_op("lamb", "other", "optimizer", self.kernels.lamb, b.flat, b.grad, self.m, self.v,
               self.lr, self.step_count, scale, self.betas, self.eps, self.weight_decay,
               b.decay_size, self.segments)


@dataclasses.dataclass
class _MuonGroup:
    """Hidden matrices of one shape, orthogonalised together as a batch (G, R, C) in the wide
    orientation R <= C (a tall matrix sits there transposed)."""

    transposed: bool
    factor: float  # Muon's shape scale sqrt(max(1, fan_out / fan_in))
    batch: Any  # (G, R, C): the momentum writes each matrix's update into its slot
    grads: list[Any] = dataclasses.field(default_factory=list)
    bufs: list[Any] = dataclasses.field(default_factory=list)
    params: list[Any] = dataclasses.field(default_factory=list)
    decays: list[float] = dataclasses.field(default_factory=list)

    def slot(self, x: Any, k: int) -> Any:
        """Matrix k of a (G, R, C) batch in the parameter's own (in, out) shape."""
        return x[k].T if self.transposed else x[k]


class Muon(Optimizer):
    """Muon (Jordan et al. 2024) on the 2-D hidden weights, AdamW on every other tensor.

    For each hidden matrix: momentum (as torch.optim.Muon and the reference implementation:
    buf <- lerp(buf, g, 1 - mu), Nesterov's lerp(g, buf, mu) by default), the quintic
    Newton-Schulz orthogonalisation of that update (NS_STEPS iterations, normalised by its
    Frobenius norm; tall matrices run transposed), scaled by sqrt(max(1, fan_out / fan_in))
    and applied with Muon's own learning rate and decoupled weight decay. Matrices of one
    shape are orthogonalised as one batch, their GEMMs through the backend's matmul. The rest
    (embeddings and the tied head, biases, LayerNorm) take AdamW steps at the main schedule's
    learning rate, in one kernel per contiguous range of the buffer.
    """

    state_names = ("muon_buffer", "m", "v")

    def __init__(
        self, buffer: ParameterBuffer, schedule: Schedule, muon_schedule: Schedule,
        hidden: tuple[str, ...], momentum: float = 0.95, nesterov: bool = True,
        ns_steps: int = 5, betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
        weight_decay: float = 0.1, grad_clip: float = 1.0, ns_eps: float = 1e-7,
        state_dtype: Any = None,
    ) -> None:
        super().__init__(buffer, schedule, grad_clip)
        self.muon_schedule, self.momentum, self.nesterov = muon_schedule, momentum, nesterov
        self.ns_steps, self.ns_eps = ns_steps, ns_eps
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        xp = self.xp
        self.muon_lr = xp.zeros((), dtype=np.float32)
        names = set(hidden)
        muon = [s for s in buffer.spans if s.name in names]
        if len(muon) != len(names) or any(len(s.shape) != 2 for s in muon):
            raise ValueError(f"Muon takes existing 2-D tensors, not {sorted(hidden)}")
        self.muon_names = tuple(s.name for s in muon)
        # AdamW's share: the buffer outside Muon's spans, as contiguous ranges (start, stop),
        # each with its offset into the compact moment arrays
        self.ranges: list[tuple[int, int, int]] = []
        stored = 0
        for s in buffer.spans:
            if s.name in names:
                continue
            if self.ranges and self.ranges[-1][1] == s.offset:
                start, _, off = self.ranges.pop()
                self.ranges.append((start, s.offset + s.size, off))
            else:
                self.ranges.append((s.offset, s.offset + s.size, stored))
            stored += s.size
        state = self._moment_dtype(state_dtype)
        self.m = xp.zeros(stored, state)
        self.v = xp.zeros(stored, state)
        self.muon_buffer = xp.zeros(sum(s.size for s in muon), buffer.flat.dtype)
        self.groups: dict[tuple[int, int], _MuonGroup] = {}
        at = 0
        for s in muon:
            fan_in, fan_out = s.shape  # stored (in, out): y = x @ W
            group = self.groups.get(s.shape)
            if group is None:
                count = sum(1 for t in muon if t.shape == s.shape)
                wide = (min(s.shape), max(s.shape))
                group = _MuonGroup(fan_in > fan_out, math.sqrt(max(1.0, fan_out / fan_in)),
                                   xp.zeros((count, *wide), buffer.flat.dtype))
                self.groups[s.shape] = group
            group.grads.append(buffer.grad[s.offset : s.offset + s.size].reshape(s.shape))
            group.params.append(buffer.flat[s.offset : s.offset + s.size].reshape(s.shape))
            group.bufs.append(self.muon_buffer[at : at + s.size].reshape(s.shape))
            group.decays.append(weight_decay if s.decayed else 0.0)
            at += s.size

    def _set_lr(self) -> None:
        super()._set_lr()
        self.muon_lr[...] = self.muon_schedule(self.step_count, self.xp)

    def _update(self, scale: Any) -> None:
        b, k, lr = self.buffer, self.kernels, self.muon_lr
        if self.loss_scaler is not None:  # a skipped step (scale < 0) moves no hidden matrix
            lr = self.xp.where(scale < 0, np.float32(0.0), lr)
        for start, stop, off in self.ranges:
            n = stop - start
            run_op("adamw", "other", "optimizer", k.adamw, b.flat[start:stop],
                   b.grad[start:stop], self.m[off : off + n], self.v[off : off + n], self.lr,
                   self.step_count, scale, self.betas, self.eps, self.weight_decay,
                   max(0, min(b.decay_size - start, n)))
        for group in self.groups.values():
            for i, (g, buf) in enumerate(zip(group.grads, group.bufs, strict=True)):
                run_op("muon_momentum", "other", "optimizer", k.muon_momentum, g, buf,
                       group.slot(group.batch, i), scale, self.momentum, self.nesterov)
            x = run_op("newton_schulz", "other", "optimizer", k.newton_schulz, group.batch,
                       self.ns_steps, self.ns_eps, self._matmul)
            for i, (p, decay) in enumerate(zip(group.params, group.decays, strict=True)):
                run_op("muon_apply", "other", "optimizer", k.muon_apply, p, group.slot(x, i),
                       lr, decay, group.factor)

    def decay_regions(self) -> list[tuple[int, int, Any]]:
        """The decayed spans, each with MUON_LR's rate (hidden matrices) or the main one,
        merged where consecutive spans share it."""
        out: list[tuple[int, int, Any]] = []
        for s in self.buffer.spans:
            if not s.decayed:
                continue
            lr = self.muon_lr if s.name in self.muon_names else self.lr
            if out and out[-1][1] == s.offset and out[-1][2] is lr:
                out[-1] = (out[-1][0], s.offset + s.size, lr)
            else:
                out.append((s.offset, s.offset + s.size, lr))
        return out

    def _matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None) -> Any:
        """Newton-Schulz's GEMMs, timed as matmuls of the optimizer phase."""
        mm = self.kernels.matmul
        return run_op("newton_schulz.matmul", "matmul", "optimizer",
                      lambda a, b: count_gemm(a, mm(a, b, transpose_b=transpose_b, out=out)),
                      a, b)
