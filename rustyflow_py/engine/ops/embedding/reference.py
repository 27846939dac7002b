"""The embedding backward's reference kernel: rows of g added into the (V, E) gradient."""

from __future__ import annotations

from typing import Any

from ..table import Family


class EmbeddingReference(Family):

    def scatter_add_rows(self, dst: Any, idx: Any, rows: Any) -> None:
        """(Mixed precision: 16-bit rows into a float32 gradient, converted first.)"""
        rows = rows.reshape(-1, dst.shape[-1]).astype(dst.dtype, copy=False)
        self.xp.add.at(dst, idx.ravel(), rows)

