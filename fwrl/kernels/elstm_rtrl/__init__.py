"""eLSTM recurrence and its exact RTRL gradients (paper 004, Eq. 5-12): PyTorch only.

There is no fused kernel, so nothing to choose: ``naive`` holds the maths (``rtrl_reference``,
the forward-mode definition) and the functions the eLSTM core calls (``elstm_scan`` for
truncated BPTT, ``elstm_rtrl``, a ``torch.autograd.Function`` with the RTRL gradient).
"""
