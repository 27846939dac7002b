"""The reference kernels' 16-bit rule: compute in the accumulation type, round only the
outputs."""

from __future__ import annotations

from typing import Any

from ..precision import accumulate_dtype, is_16bit


def wide(*arrays: Any) -> tuple[Any, ...]:
    """The arrays (None passes through), the 16-bit ones converted to float32."""
    return tuple(a.astype(accumulate_dtype(a.dtype)) if a is not None and is_16bit(a.dtype)
                 else a for a in arrays)
