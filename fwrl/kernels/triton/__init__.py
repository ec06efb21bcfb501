"""Triton helpers shared by every rule's fused kernel (``fwrl/kernels/<rule>/fused_recurrent.py``).

``common`` holds the ``@triton.jit`` helpers and the Python utilities the kernels share
(the interpreter check, the device / dtype reasons of ``supports``, the replay starts of
the backward, the launch options). The kernel modules import it relatively
(``from ..triton.common import ...``), so a copy of the ``fwrl/kernels`` package loaded under
another name (the interpreter tests do, ``tests/kernel_harness.py``) is self-consistent.

Importing this package does not import Triton; ``common`` does.
"""
