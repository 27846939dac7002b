"""The embedding gradient's scatter-add on the CPU: numba's loop for float32 (NumPy's add.at
is one slow call), the reference otherwise."""

from __future__ import annotations

from typing import Any

from .reference import EmbeddingReference


class CpuEmbedding(EmbeddingReference):
    uses = ("_jit_for",)

    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        jit = self._jit_for(dst, rows)
        if jit is None:
            super().scatter_add_rows(dst, idx, rows)
        else:
            jit.embedding.scatter_add_rows(dst, idx.ravel(), rows.reshape(-1, dst.shape[-1]))
