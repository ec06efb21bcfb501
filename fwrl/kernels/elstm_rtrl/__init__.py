"""eLSTM recurrence and its exact RTRL gradients (paper 004, Eq. 5-12): PyTorch only.

There is no fused kernel, so nothing to choose (no ``KernelRule``): ``naive`` holds the maths and
the reference that defines them (``rtrl_reference``, forward mode), ``recurrence`` what the eLSTM
core runs, on any device (``elstm_scan`` for truncated BPTT; ``elstm_rtrl``, a
``torch.autograd.Function`` with the exact RTRL gradient, forward mode when acting). The core
imports them from here.
"""

from .naive import PARAM_KEYS, SENSITIVITY_KEYS, initial_sensitivities
from .recurrence import elstm_rtrl, elstm_scan

__all__ = ["PARAM_KEYS", "SENSITIVITY_KEYS", "elstm_rtrl", "elstm_scan", "initial_sensitivities"]
