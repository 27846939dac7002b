"""The reference kernel set: every op's reference kernel (the op folders' reference.py,
written once against the array module `xp`, NumPy or CuPy), the truth that every device's
faster kernel is tested against. Tests make one on any device (`XpKernels(backend)`).

Each reference returns fresh arrays (or fills `out=` buffers) and keeps float32 inputs in
float32: Python scalars are used as weak scalars so no float64 temporaries appear. 16-bit
inputs are computed in float32, their accumulation type, and only the results are rounded
back: outputs keep the input's dtype, statistics (mean, rstd, lse, the loss) stay float32.
"""

from __future__ import annotations

from . import kernel_table  # noqa: F401  (enters every op folder into the table)
from .table import KernelSet


class XpKernels(KernelSet):
    """The table's "reference" entries on one backend's device."""

    kind = "reference"
