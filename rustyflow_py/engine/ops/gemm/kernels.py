"""The GEMM kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

`gemm` is the caller's runner for a product: gemm(fn, *args, **kwargs) calls fn(*args,
**kwargs) and times it as a matmul (Function.gemm); a kernel runs each of its GEMMs (plain or
with a fused epilogue) through it.

    matmul(a, b, *, transpose_b: bool = False, out: Any = None, accumulate: bool = False,
           gradient: str | None = None) -> Any
        a @ b: (M, K) @ (K, N) -> (M, N); batched (..., M, K) @ (..., K, N) with equal batch
        shapes; or (..., M, K) @ (K, N). transpose_b=True multiplies by b with its last two
        axes swapped, b of (..., N, K), without copying it (the tied LM head). `out`, a
        C-contiguous array of the result's shape and dtype (or the accumulation dtype: a
        float32 gradient from 16-bit inputs), receives the product and is returned;
        otherwise the result is a fresh array. With `accumulate` the product is added into
        `out` (required). `gradient`, "a" or "b", names the operand that is a gradient
        (a PRECISION=fp8 run stores it in FP8's wide format, e5m2); the value is the same.

    kept_for_backward(x, w) -> tuple[Any, Any]
        What a layer keeps for its backward of the x (..., K) and w (K, N) that its
        `linear` call just took (call it right after): x and w themselves, or stand-ins
        that this set's matmul (for w, with transpose_b) and linear_grads (for x) take in
        their place, with the same values. A PRECISION=fp8 run keeps the FP8 codes its
        forward cast made, in the layouts the backward GEMMs read (x^T, w), so backward
        neither reads nor casts them again, and the bf16 x is not kept alive for it.

    shared_gradient(g) -> AbstractContextManager[None]
        A block in which GEMMs read the gradient g (..., N) both as it is and transposed
        (a layer's input gradient and its weight gradient): a backend may convert g once for
        both (a PRECISION=fp8 run casts it into both FP8 layouts by one kernel). g must not
        change inside the block. The values are those of the GEMMs without it.

    sum_rows(x, into=None) -> Any
        Column sums (C,) of x (N, C): bias gradients; added into `into` (None returned)
        when given.

    linear(x, w, b, gelu, gemm, residual=None) -> tuple[Any, Any]
        (y, state): y = x @ w + b for x (..., K), w (K, N), b (N,), or gelu_tanh of it when
        `gelu`, with the state linear_dgelu takes back (None without gelu). Without gelu, a
        `residual` (..., N) is added to y too.

    linear_grads(x, g, gemm, into=(None, None), bias=True) -> tuple[Any, Any]
        (dw, db) of y = x @ w + b for the gradient g (..., N) of y: (x.T @ g, the column
        sums of g), over all leading axes. For 16-bit inputs both may be float32 (the
        gradient buffer's type). `into`: (dw's, db's) gradient buffers or None each; a
        given one receives its gradient, added, and None is returned in its place.
        bias=False: no db (None), for a bias whose gradient comes from elsewhere.

    linear_dgelu(g, w, state, gemm, db_into=None) -> Any
        For y = gelu(pre) @ w with pre = x @ w1 + b1 (`state`, from linear(..., gelu=True)):
        dpre = (g @ w.T) * gelu'(pre) for the gradient g of y, the gradient into the GELU's
        input (linear_grads(x, dpre) then gives the layer before's weight and bias
        gradients). With `db_into` (b1's gradient buffer) b1's gradient, the column sums
        of dpre, is added into it as well (then linear_grads(..., bias=False)). A PRECISION=fp8
        run may give dpre, 2-D (rows, 4E), as the FP8 codes of its two layouts that its
        producer wrote: a stand-in that this set's matmul and linear_grads take, and that
        shared_gradient passes through.

    fp8_tensors() -> list[dict[str, Any]] | None
        A query after training (it reads the device): in a PRECISION=fp8 run whose step was
        captured, each tensor that step casts to FP8, in the order of its casts, as
        {"tensor", "format", "shape", "amax", "scale"}: the amax of its last replay and the
        scale that amax gives. None elsewhere.
"""

from __future__ import annotations

from ..table import ANY, FLOATS, declare
from .cpu import CpuGemm
from .cuda import CudaGemm
from .reference import GemmReference

declare(("matmul", "kept_for_backward", "shared_gradient", "sum_rows", "linear",
         "linear_grads", "linear_dgelu"),
        reference={ANY: GemmReference}, cpu={FLOATS: CpuGemm}, gpu={FLOATS: CudaGemm})
declare("fp8_tensors", reference={ANY: GemmReference}, cpu={ANY: CpuGemm}, gpu={ANY: CudaGemm})
