"""The kernel contract: every method the ops, the optimizers and the trainer call on a
backend's kernel set (`backend.kernels`), with one signature for every backend.

The ops are written once against this Protocol, so a kernel whose signature differs between
backends would only fail on the device that has it; tests/test_kernel_contract.py checks
every backend class against it (names, parameter kinds, defaults) and their results against
the reference formulation, kernels/reference.py.

Common rules. Arrays live on the backend's device. Float arrays share one storage dtype
(float32 for training, float64 for gradient checks, float16 for mixed precision) and results
keep it; kernels accumulate in float32 (float64 for float64), and the statistics they hand back
(LayerNorm mean/rstd, log-sum-exps, losses) are float32 for 16-bit inputs. Integer arrays
(targets, indices, tokens) are int32 or int64. Nothing here reads a value back to the host or
synchronizes, so a training step can be captured as a CUDA graph: scalars that change from step
to step (learning rate, step counter, clip scale) are 0-d device arrays. Arguments are not
modified unless the docstring says so. A "state" that a forward returns is opaque to callers:
hand it to the matching backward, once, and do not look inside (each backend keeps what its own
backward needs, and it may alias the forward's buffers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Kernels(Protocol):
    """The kernel set of one device (XpKernels, CpuKernels, CudaKernels)."""

    xp: Any  # the array module (numpy or cupy)

    # ---- GEMM and reductions ------------------------------------------------------------------
    def matmul(self, a: Any, b: Any, *, transpose_b: bool = False, out: Any = None) -> Any:
        """a @ b: (M, K) @ (K, N) -> (M, N); batched (..., M, K) @ (..., K, N) with equal
        batch shapes; or (..., M, K) @ (K, N). transpose_b=True multiplies by b with its last
        two axes swapped, b of (..., N, K), without copying it (the tied LM head). `out`, a
        C-contiguous array of the result's shape and dtype, receives the product and is
        returned; otherwise the result is a fresh array."""
        ...

    def sum_rows(self, x: Any) -> Any:
        """Column sums (C,) of x (N, C): bias gradients."""
        ...

    # ---- Linear layers: the GEMM with its bias (and GELU) ---------------------------------------
    # `gemm` is the caller's runner for the product: gemm(fn, *args, **kwargs) calls
    # fn(*args, **kwargs) and times it as a matmul (Function.gemm); a kernel runs each of its
    # GEMMs (plain or with a fused epilogue) through it.
    def linear(self, x: Any, w: Any, b: Any, gelu: bool,
               gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """(y, state): y = x @ w + b for x (..., K), w (K, N), b (N,), or gelu_tanh of it when
        `gelu`, with the state linear_dgelu takes back (None without gelu)."""
        ...

    def linear_grads(self, x: Any, g: Any, gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """(dw, db) of y = x @ w + b for the gradient g (..., N) of y: (x.T @ g, the column
        sums of g), over all leading axes. For 16-bit inputs both may be float32 (the
        gradient buffer's type)."""
        ...

    def linear_dgelu(self, g: Any, w: Any, state: Any,
                     gemm: Callable[..., Any]) -> tuple[Any, Any]:
        """For y = gelu(pre) @ w with pre = x @ w1 + b1 (`state`, from linear(..., gelu=True)):
        (dpre, db1) = ((g @ w.T) * gelu'(pre), the column sums of dpre) for the gradient g of
        y: the gradient into the GELU's input and the bias gradient of the layer before."""
        ...

    # ---- LayerNorm over the last axis -----------------------------------------------------------
    def layernorm_forward(self, x: Any, w: Any, b: Any, eps: float) -> tuple[Any, Any, Any]:
        """(y, mean, rstd) for x (..., C), w and b (C,): y (..., C) is the normalised x
        scaled by w and shifted by b; mean and rstd (..., 1) are its backward's inputs."""
        ...

    def layernorm_backward(
        self, g: Any, x: Any, w: Any, mean: Any, rstd: Any
    ) -> tuple[Any, Any, Any]:
        """(dx (..., C), dw (C,), db (C,)) for upstream g (..., C), from the forward's x, w
        and its mean, rstd (..., 1)."""
        ...

    # ---- GELU (tanh approximation), the preceding bias add fused in ---------------------------
    def gelu_forward(self, x: Any, bias: Any | None) -> Any:
        """GELU(x + bias) (..., C) for x (..., C) and bias (C,) or None."""
        ...

    def gelu_backward(self, g: Any, x: Any, bias: Any | None) -> Any:
        """d(x + bias) (..., C) for upstream g (..., C), from the forward's inputs."""
        ...

    # ---- causal attention softmax over (B, H, T, T) scores ------------------------------------
    def causal_softmax_forward(self, scores: Any, scale: float, with_lse: bool = False) -> Any:
        """Softmax over the last axis of scale * scores (B, H, T, T) with the keys after each
        query masked (probability exactly 0). Overwrites `scores` (the probabilities may be
        that buffer). with_lse=True returns (probs, lse), lse (B, H, T, 1) being each row's
        log-sum-exp of the scaled scores, which causal_softmax_recompute takes."""
        ...

    def causal_softmax_recompute(self, scores: Any, lse: Any, scale: float) -> Any:
        """The probabilities (B, H, T, T) again from the same scores and the forward's lse
        (B, H, T, 1), without a reduction. Overwrites `scores`."""
        ...

    def causal_softmax_backward(self, g: Any, probs: Any, scale: float) -> Any:
        """d(scores) (B, H, T, T) for upstream g (B, H, T, T) on the probabilities; masked
        entries come out 0."""
        ...

    # ---- softmax cross-entropy ----------------------------------------------------------------
    def cross_entropy(
        self, logits: Any, targets: Any, need_grad: bool, inplace: bool
    ) -> tuple[Any, Any]:
        """(loss, state): the mean NLL, a 0-d array, of logits (N, V) against targets (N,).
        state is None unless need_grad; with inplace=True the logits buffer may be
        overwritten (by this call or by the backward: do not read it afterwards)."""
        ...

    def cross_entropy_backward(self, state: Any, g: Any) -> Any:
        """d(logits) (N, V) for upstream g, a 0-d array (the loss's gradient). May reuse the
        state's buffers, so it runs once per state."""
        ...

    # ---- tied LM head + cross-entropy: the loss of logits = h @ w.T ----------------------------
    def lm_head_xent(
        self, h: Any, w: Any, targets: Any, need_grad: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """(loss, state): the mean NLL, a 0-d array, of h (N, E) @ w.T, w (V, E), against
        targets (N,), without handing the (N, V) logits back. Every GEMM goes through
        `mm`, called like matmul (mm(a, b, transpose_b=..., out=...)), so the caller can
        time it. state is None unless need_grad."""
        ...

    def lm_head_xent_backward(
        self, state: Any, g: Any, need_h: bool, need_w: bool, mm: Callable[..., Any]
    ) -> tuple[Any, Any]:
        """(dh (N, E) or None, dw (V, E) or None) for upstream g, a 0-d array; GEMMs through
        `mm` as in the forward. Consumes the state (once)."""
        ...

    # ---- embedding backward -------------------------------------------------------------------
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        """dst (V, E)[idx[i]] += rows[i] in place for idx (...,) and rows (..., E), repeated
        indices adding up."""
        ...

    # ---- optimizer kernels over the flat parameter buffer -------------------------------------
    def l2_norm(self, g: Any) -> Any:
        """sqrt(sum(g * g)) of a flat g (P,), as a 0-d array of g's dtype."""
        ...

    def adamw(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """One AdamW step (PyTorch's order) that updates p, m and v (P,) in place from g
        (P,). lr (0-d float32), step (0-d int32, already counting this step) and scale (the
        0-d float32 clip factor applied to g, or None) are device arrays; weight decay
        applies to p[:decay_size] only."""
        ...

    def adam(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """One Adam step (torch.optim.Adam): as adamw, but the weight decay is an L2 term,
        weight_decay * p[:decay_size] added to the (clipped) gradient before the moments."""
        ...

    def sgd(
        self, p: Any, g: Any, velocity: Any, lr: Any, scale: Any, momentum: float,
        nesterov: bool, weight_decay: float, decay_size: int,
    ) -> None:
        """One SGD step (torch.optim.SGD: momentum without dampening, optionally Nesterov)
        that updates p and velocity (P,) in place; weight decay is an L2 term added to the
        clipped gradient of p[:decay_size]; lr and scale as for adamw."""
        ...

    def rmsprop(
        self, p: Any, g: Any, square_avg: Any, grad_avg: Any, momentum_buffer: Any, lr: Any,
        scale: Any, alpha: float, eps: float, momentum: float, weight_decay: float,
        decay_size: int,
    ) -> None:
        """One RMSprop step (torch.optim.RMSprop) updating p and the state (P,) in place:
        grad_avg is None unless centered, momentum_buffer None without momentum. Weight
        decay is L2 as for sgd."""
        ...

    def adagrad(
        self, p: Any, g: Any, state_sum: Any, lr: Any, scale: Any, eps: float,
        weight_decay: float, decay_size: int,
    ) -> None:
        """One AdaGrad step (torch.optim.Adagrad, no lr decay) updating p and the sum of
        squared gradients (P,) in place; weight decay is L2 as for sgd."""
        ...

    def adadelta(
        self, p: Any, g: Any, square_avg: Any, acc_delta: Any, lr: Any, scale: Any,
        rho: float, eps: float, weight_decay: float, decay_size: int,
    ) -> None:
        """One AdaDelta step (torch.optim.Adadelta) updating p and both running averages
        (P,) in place; weight decay is L2 as for sgd."""
        ...

    def segments(self, bounds: tuple[int, ...]) -> Any:
        """An opaque table of the segments [bounds[s], bounds[s + 1]) of a flat buffer (the
        parameter tensors), for lamb. Made once at setup: it may copy to the device."""
        ...

    def lamb(
        self, p: Any, g: Any, m: Any, v: Any, lr: Any, step: Any, scale: Any,
        betas: tuple[float, float], eps: float, weight_decay: float, decay_size: int,
        segments: Any,
    ) -> None:
        """One LAMB step (You et al. 2019, Algorithm 2) updating p, m and v (P,) in place:
        Adam's bias-corrected direction r plus weight_decay * p on p[:decay_size] gives u,
        and each segment moves by lr * ||p_s|| / ||u_s|| * u_s (the ratio 1 where either
        norm is 0), both norms taken before the update. segments from segments(); lr, step
        and scale as for adamw."""
        ...

    def muon_momentum(
        self, g: Any, buf: Any, out: Any, scale: Any, momentum: float, nesterov: bool,
    ) -> None:
        """Muon's momentum for one matrix: buf <- lerp(buf, g * scale, 1 - momentum) in
        place, and out <- lerp(g * scale, buf, momentum) with nesterov, else buf. g, buf
        and out have one shape; out may be a strided view (a transposed slot of the
        Newton-Schulz batch)."""
        ...

    def newton_schulz(self, x: Any, steps: int, eps: float, mm: Callable[..., Any]) -> Any:
        """Orthogonalise each matrix of x (..., R, C), R <= C: divide it by its Frobenius
        norm plus eps, then run `steps` quintic Newton-Schulz iterations X <- aX + (bA +
        cA @ A) @ X, A = X @ X.T, (a, b, c) = (3.4445, -4.7750, 2.0315). Returns the result
        (x itself may be overwritten); every GEMM goes through `mm` as in lm_head_xent."""
        ...

    def muon_apply(self, p: Any, update: Any, lr: Any, weight_decay: float,
                   factor: float) -> None:
        """p <- p * (1 - lr * weight_decay) - lr * factor * update in place, for one matrix
        p and its orthogonalised update of the same shape (possibly a strided view)."""
        ...

    def ema_update(self, ema: Any, p: Any, decay: float, step: Any, start: int) -> None:
        """The weights' exponential moving average, in place over the flat (P,) buffers:
        ema <- ema + (1 - decay) * (p - ema) once the 0-d int32 device counter `step` (steps
        done) exceeds `start`, else ema <- p exactly (the average starts at step `start`)."""
        ...

    # ---- data and logging ------------------------------------------------------------------------
    def gather_batch(self, stream: Any, step: Any, seq_len: int, x: Any, y: Any, *,
                     rank: int = 0, world_size: int = 1) -> None:
        """Fill x, y (B, T=seq_len) in place with batch (step mod batches-per-epoch) of the
        (world_size * B, N) token stream: rows [rank * B, (rank + 1) * B) are this rank's
        streams, x the window of T tokens and y the same shifted by one. step is a 0-d
        int32 device counter."""
        ...

    def store_at_step(self, ring: Any, step: Any, value: Any) -> None:
        """ring[(step - 1) mod len(ring)] = value in place, for a 0-d device counter `step`
        and a 0-d value (the loss)."""
        ...

    # ---- fused attention (a backend without it says so) -------------------------------------
    def set_attention(self, mode: str) -> None:
        """ATTENTION: "auto" lets fused_attention say yes where it can, "materialized" makes
        it say no."""
        ...

    def fused_attention(self, dtype: Any, head_dim: int, seq_len: int) -> bool:
        """Whether attention_forward/backward take q, k, v of this dtype and shape; when
        not, attention is materialised (batched GEMMs around the causal softmax)."""
        ...

    def attention_forward(self, q: Any, k: Any, v: Any, scale: float,
                          dropout: tuple[float, int, int, Any] | None,
                          out: Any = None) -> tuple[Any, Any]:
        """Causal attention of q, k, v (B, H, T, D) without forming T x T: (o (B, H, T, D),
        the softmax's row log-sum-exps (B, H, T), float32). `dropout` is (p, seed, stream,
        step): the probabilities' mask dropout_mask would draw for (B, H, T, T). q, k, v may
        be strided views (the heads of one packed (B, T, 3E) projection); o is written into
        `out` when given (e.g. the head-major view of a (B, T, E) array) and returned."""
        ...

    def attention_backward(self, q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any,
                           scale: float, dropout: tuple[float, int, int, Any] | None,
                           out: tuple[Any, Any, Any] | None = None) -> tuple[Any, Any, Any]:
        """(dq, dk, dv) of attention_forward for upstream do, from its o and lse; written
        into `out`'s three views when given (e.g. those of one (B, T, 3E) gradient)."""
        ...

    def decode_attention(self, qkv: Any, keys: Any, values: Any, pos: Any, scale: float,
                         n: int) -> Any:
        """Generation's attention for one new position per sequence: write the key and value
        of qkv (B, 3E) at `pos` ((1,) int64 on the device) into one layer's cache keys/values
        (B, H, S, D) in place, then attend the query over cache positions 0..pos; y (B, E).
        `n` (pos + 1 eagerly, S in a captured graph) is the window a backend that cannot read
        pos on the device masks within."""
        ...

    # ---- randomness ------------------------------------------------------------------------------
    def dropout_mask(self, shape: tuple[int, ...], dtype: Any, p: float, seed: int, site: int,
                     step: Any) -> Any:
        """Inverted dropout's multiplier, a fresh array of `shape` and float `dtype`: 1/(1-p)
        where element i is kept, else 0, kept when Philox4x32-10's draw for (seed, site,
        step, i) is at least p (kernels/philox.py). `step` is a 0-d int32 device counter.
        Every backend returns the same bits for the same arguments."""
        ...

    def dropout_apply(self, x: Any, p: float, seed: int, site: int, step: Any) -> Any:
        """x * dropout_mask(x.shape, x.dtype, p, seed, site, step), a fresh array, where a
        backend can without forming the mask (the GPU draws the bits inline): backward
        applies it again to the gradient instead of keeping a mask."""
        ...
