"""The embedding's row gradient on the GPU (rows.cu): one block a row.

Why a kernel of its own: CuPy's add.at takes rows of the gradient table's dtype, so under
mixed precision the B x T x E rows of 16 bits were first copied to float32, a pass of its
own; this kernel reads them as they are and adds in float32."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...precision import accumulate_dtype
from .. import cuda_build
from .reference import EmbeddingReference

_ROWS = cuda_build.source(__file__, "rows.cu", cuda_build.dtype_defines(np.float32))
THREADS = 256  # a block's threads, across one row's columns


class CudaEmbedding(EmbeddingReference):
    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        width = dst.shape[-1]
        flat, rows = idx.ravel().astype(np.int32, copy=False), rows.reshape(-1, width)
        if not (flat.size and dst.dtype == accumulate_dtype(rows.dtype)
                and dst.flags.c_contiguous and rows.flags.c_contiguous):
            super().scatter_add_rows(dst, idx, rows)
            return
        _ROWS.typed("scatter_add_rows", rows.dtype)((flat.size,), (THREADS,),
                                                    (dst, flat, rows, np.int32(width)))
