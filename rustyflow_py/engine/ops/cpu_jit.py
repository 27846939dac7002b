"""CPU_JIT's kernels: every op folder's numba kernels (its jit.py), loaded as one module.

Everything here is optional (`pip install rustyflow-py[jit]`): the CPU kernel set imports this
module only when numba is installed and CPU_JIT is not off (cpu_set.py), and hands it to its
families for float32 work (`_jit_for`); a family finds its own kernels under its folder's
name (`jit.layernorm.layernorm_forward`). Otherwise the op folders' cpu.py classes run their
NumPy formulation. `warm_up()` compiles them all before training (jit_compile.py: how they
compile, and why numba). A new folder's jit.py adds its line here.
"""

from __future__ import annotations

import numba

from .attention import jit as attention
from .embedding import jit as embedding
from .gelu import jit as gelu
from .layernorm import jit as layernorm
from .optim import jit as optim
from .sampling import jit as sampling
from .softmax_xent import jit as softmax_xent

VERSION = str(numba.__version__)
MODULES = (attention, embedding, gelu, layernorm, optim, sampling, softmax_xent)


def warm_up() -> None:
    """Compile every kernel (or load it from numba's cache) for the array types training
    passes, so no training step, and no op in the profile, pays for compilation (slow on a
    first run, shorter from numba's cache, and never free)."""
    for module in MODULES:
        module.warm_up()
