"""The GRU recurrence with per-row episode resets (Cho et al. 2014), for the ``gru`` core: PyTorch only.

There is no fused Triton kernel: on CUDA the core runs ``nn.GRU`` (cuDNN) over the segments between
episode starts. ``naive`` holds the maths and the reference that defines it (``gru_reference``),
``cpu`` the path the core runs on CPU tensors (``gru_cpu``: a hand-derived backward, the products
with the input and the weight gradients batched over the whole sequence).
"""

from .cpu import gru_cpu
from .naive import gru_reference

__all__ = ["gru_cpu", "gru_reference"]
