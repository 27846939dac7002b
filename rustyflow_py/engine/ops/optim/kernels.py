"""The optimizer kernels: their contract, and their entries in the kernel table. As in
every op folder, reference.py holds each algorithm's reference class, cpu.py and cuda.py its
CPU and CUDA classes (its CUDA C in the .cu file of its name), jit.py the CPU's numba loops.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

They update flat (P,) arrays in place; lr (0-d float32), step (0-d int32, already counting
this step) and scale (the 0-d float32 clip factor, or None; negative: skip the step) are
device arrays, so nothing waits for the host; weight decay applies to p[:decay_size] only.

    l2_norm(g) -> Any
        sqrt(sum(g * g)) of a flat g (P,), as a 0-d array of g's dtype.

    adamw(p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size, copy_to=None)
        -> None
        One AdamW step (PyTorch's order) that updates p, m and v (P,) in place from g (P,).
        lr (0-d float32), step (0-d int32, already counting this step) and scale (the 0-d
        float32 clip factor applied to g, or None) are device arrays; weight decay applies
        to p[:decay_size] only. A given `copy_to` (P,) receives the updated p in its own
        (16-bit) dtype: mixed precision's compute copy. m and v may be bfloat16 beside
        float32 p (ADAM_STATE_DTYPE=bf16, the GPU): the update reads them widened, and they
        are rounded back stochastically, by reference.py's round_bf16_stochastic bits.

    adam(p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size, copy_to=None)
        -> None
        One Adam step (torch.optim.Adam): as adamw, but the weight decay is an L2 term,
        weight_decay * p[:decay_size] added to the (clipped) gradient before the moments.

    sgd(p, g, velocity, lr, scale, momentum, nesterov, weight_decay, decay_size) -> None
        One SGD step (torch.optim.SGD: momentum without dampening, optionally Nesterov) that
        updates p and velocity (P,) in place; weight decay is an L2 term added to the
        clipped gradient of p[:decay_size]; lr and scale as for adamw.

    rmsprop(p, g, square_avg, grad_avg, momentum_buffer, lr, scale, alpha, eps, momentum,
        weight_decay, decay_size) -> None
        One RMSprop step (torch.optim.RMSprop) updating p and the state (P,) in place:
        grad_avg is None unless centered, momentum_buffer None without momentum. Weight
        decay is L2 as for sgd.

    adagrad(p, g, state_sum, lr, scale, eps, weight_decay, decay_size) -> None
        One AdaGrad step (torch.optim.Adagrad, no lr decay) updating p and the sum of
        squared gradients (P,) in place; weight decay is L2 as for sgd.

    adadelta(p, g, square_avg, acc_delta, lr, scale, rho, eps, weight_decay, decay_size)
        -> None
        One AdaDelta step (torch.optim.Adadelta) updating p and both running averages (P,)
        in place; weight decay is L2 as for sgd.

    segments(bounds) -> Any
        An opaque table of the segments [bounds[s], bounds[s + 1]) of a flat buffer (the
        parameter tensors), for lamb. Made once at setup: it may copy to the device.

    lamb(p, g, m, v, lr, step, scale, betas, eps, weight_decay, decay_size, segments) ->
        None
        One LAMB step (You et al. 2019, Algorithm 2) updating p, m and v (P,) in place:
        Adam's bias-corrected direction r plus weight_decay * p on p[:decay_size] gives u,
        and each segment moves by lr * ||p_s|| / ||u_s|| * u_s (the ratio 1 where either
        norm is 0), both norms taken before the update. segments from segments(); lr, step
        and scale as for adamw.

    muon_momentum(g, buf, out, scale, momentum, nesterov) -> None
        Muon's momentum for one matrix: buf <- lerp(buf, g * scale, 1 - momentum) in place,
        and out <- lerp(g * scale, buf, momentum) with nesterov, else buf. g, buf and out
        have one shape; out may be a strided view (a transposed slot of the Newton-Schulz
        batch).

    newton_schulz(x, steps, eps, mm) -> Any
        Orthogonalise each matrix of x (..., R, C), R <= C: divide it by its Frobenius norm
        plus eps, then run `steps` quintic Newton-Schulz iterations X <- aX + (bA + cA @ A)
        @ X, A = X @ X.T, (a, b, c) = (3.4445, -4.7750, 2.0315). Returns the result (x
        itself may be overwritten); every GEMM goes through `mm` as in lm_head_xent.

    muon_apply(p, update, lr, weight_decay, factor) -> None
        p <- p * (1 - lr * weight_decay) - lr * factor * update in place, for one matrix p
        and its orthogonalised update of the same shape (possibly a strided view).

    ema_update(ema, p, decay, step, start) -> None
        The weights' exponential moving average, in place over the flat (P,) buffers: ema <-
        ema + (1 - decay) * (p - ema) once the 0-d int32 device counter `step` (steps done)
        exceeds `start`, else ema <- p exactly (the average starts at step `start`).
"""

from __future__ import annotations

from ..table import ANY, FLOATS, declare
from . import cpu, cuda
from . import reference as ref

# each algorithm's op(s): its reference, CPU and GPU classes, the devices' for every float dtype
ALGORITHMS = {
    "l2_norm": (ref.NormReference, cpu.CpuNorm, cuda.CudaNorm),
    ("adamw", "adam"): (ref.AdamReference, cpu.CpuAdam, cuda.CudaAdam),
    "sgd": (ref.SgdReference, cpu.CpuSgd, cuda.CudaSgd),
    "rmsprop": (ref.RmspropReference, cpu.CpuRmsprop, cuda.CudaRmsprop),
    "adagrad": (ref.AdagradReference, cpu.CpuAdagrad, cuda.CudaAdagrad),
    "adadelta": (ref.AdadeltaReference, cpu.CpuAdadelta, cuda.CudaAdadelta),
    "lamb": (ref.LambReference, cpu.CpuLamb, cuda.CudaLamb),
    ("muon_momentum", "newton_schulz", "muon_apply"): (ref.MuonReference, ref.MuonReference,
                                                       cuda.CudaMuon),
    "ema_update": (ref.EmaReference, ref.EmaReference, cuda.CudaEma),
}
for ops, (reference, on_cpu, on_gpu) in ALGORITHMS.items():
    declare(ops, reference={ANY: reference}, cpu={FLOATS: on_cpu}, gpu={FLOATS: on_gpu})
# segments has no array argument: one entry per device for any dtype
declare("segments", reference={ANY: ref.LambReference}, cpu={ANY: ref.LambReference},
        gpu={ANY: cuda.CudaLamb})
