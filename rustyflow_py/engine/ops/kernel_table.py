"""The whole kernel table: importing this module enters every op folder's declaration
(its kernels.py) into table.py. A new op folder adds its line here; the kernel sets import
this module before they are made.
"""

from __future__ import annotations

from .attention import kernels as attention
from .batch import kernels as batch
from .dropout import kernels as dropout
from .elementwise import kernels as elementwise
from .embedding import kernels as embedding
from .gelu import kernels as gelu
from .gemm import kernels as gemm
from .layernorm import kernels as layernorm
from .optim import kernels as optim
from .sampling import kernels as sampling
from .softmax_xent import kernels as softmax_xent

FAMILIES = (attention, batch, dropout, elementwise, embedding, gelu, gemm, layernorm, optim,
            sampling, softmax_xent)
