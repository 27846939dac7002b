"""The embedding backward kernels: their contract, and their entries in the kernel table.

Every device's kernel for an op takes exactly these arguments and keeps these rules (and
table.py's common ones); tests/test_kernel_contract.py holds each to the reference.

    scatter_add_rows(dst, idx, rows) -> None
        dst (V, E)[idx[i]] += rows[i] in place for idx (...,) and rows (..., E), repeated
        indices adding up.
"""

from __future__ import annotations

from ..table import ANY, FLOATS, declare
from .cpu import CpuEmbedding
from .cuda import CudaEmbedding
from .reference import EmbeddingReference

# keyed by dst, the (V, E) gradient buffer (float32 under mixed precision)
declare("scatter_add_rows", reference={ANY: EmbeddingReference}, cpu={FLOATS: CpuEmbedding},
        gpu={FLOATS: CudaEmbedding})
