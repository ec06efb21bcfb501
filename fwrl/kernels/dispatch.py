"""Choose the fused Triton kernel or the PyTorch reference for each recurrence.

CUDA tensors with a shape a kernel supports use Triton; everything else uses
the reference. ``FWRL_KERNELS=reference|triton`` forces one (forcing triton
on an unsupported input is an error that says why).
"""

from __future__ import annotations

import os

from torch import Tensor

from fwrl.errors import FwrlError, unknown_choice
from fwrl.kernels.reference.delta_rule import delta_rule_reference

BACKENDS = ("auto", "reference", "triton")


def kernel_backend() -> str:
    """The backend requested through ``FWRL_KERNELS`` (default ``auto``)."""
    value = os.environ.get("FWRL_KERNELS", "auto")
    if value not in BACKENDS:
        raise unknown_choice("FWRL_KERNELS value", value, BACKENDS)
    return value


def _triton_delta_rule():
    """The Triton implementation, or None where Triton or the module is missing."""
    try:
        from fwrl.kernels.triton.delta_rule import delta_rule_triton, supports
    except ImportError:
        return None, None
    return delta_rule_triton, supports


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor | None,
    W0: Tensor,
    reset: Tensor,
    *,
    rule: str = "delta",
    feature_map: str = "elu1_sumnorm",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor]:
    """Sum / delta rule over a whole sequence (see ``reference.delta_rule``)."""
    kwargs = dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode)
    backend = kernel_backend()
    if backend != "reference":
        impl, supports = _triton_delta_rule()
        reason = "Triton kernels are not available" if impl is None else supports(q, k, v, **kwargs)
        if reason is None:
            return impl(q, k, v, beta, W0, reset, **kwargs)
        if backend == "triton":
            raise FwrlError(f"FWRL_KERNELS=triton but the delta-rule kernel cannot run: {reason}.")
    return delta_rule_reference(q, k, v, beta, W0, reset, **kwargs)


# --------------------------------------------------------------------------- recurrent FWPs
# RDN and Delta RNN have fused kernels (chosen like the delta rule); Delta LSTM
# runs the PyTorch reference only, until its Triton kernel exists (forcing
# FWRL_KERNELS=triton on it is an error).


def _reference_only(name: str) -> None:
    if kernel_backend() == "triton":
        raise FwrlError(
            f"FWRL_KERNELS=triton but there is no Triton kernel for the {name} recurrence yet; "
            "use FWRL_KERNELS=auto or reference."
        )


def rdn(
    xq: Tensor,
    xk: Tensor,
    xv: Tensor,
    xb: Tensor,
    Rq: Tensor,
    Rk: Tensor,
    Rv: Tensor,
    rb: Tensor,
    W0: Tensor,
    h0: Tensor,
    reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor]:
    """Recurrent Delta Net over a whole sequence (see ``reference.rdn``)."""
    from fwrl.kernels.reference.rdn import rdn_reference

    kwargs = dict(feature_map=feature_map, grad_mode=grad_mode)
    args = (xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset)
    backend = kernel_backend()
    if backend != "reference":
        try:
            from fwrl.kernels.triton.rdn import rdn_triton, supports
        except ImportError:
            reason = "Triton kernels are not available"
        else:
            reason = supports(xq, xk, xv, xb, Rq, W0, **kwargs)
            if reason is None:
                return rdn_triton(*args, **kwargs)
        if backend == "triton":
            raise FwrlError(
                f"FWRL_KERNELS=triton but no Triton RDN kernel can run on these inputs "
                f"(dispatch.rdn): {reason}."
            )
    return rdn_reference(*args, **kwargs)


def delta_rnn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    kr: Tensor,
    vr: Tensor,
    betar: Tensor,
    W0: Tensor,
    R0: Tensor,
    h0: Tensor,
    reset: Tensor,
    *,
    feature_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Delta RNN over a whole sequence (see ``reference.delta_rnn``)."""
    from fwrl.kernels.reference.delta_rnn import delta_rnn_reference

    kwargs = dict(feature_map=feature_map, grad_mode=grad_mode)
    args = (q, k, v, beta, kr, vr, betar, W0, R0, h0, reset)
    backend = kernel_backend()
    if backend != "reference":
        try:
            from fwrl.kernels.triton.delta_rnn import delta_rnn_triton, supports
        except ImportError:
            reason = "Triton kernels are not available"
        else:
            reason = supports(q, k, v, kr, vr, **kwargs)
            if reason is None:
                return delta_rnn_triton(*args, **kwargs)
        if backend == "triton":
            raise FwrlError(
                f"FWRL_KERNELS=triton but no Triton Delta RNN kernel can run on these inputs "
                f"(dispatch.delta_rnn): {reason}."
            )
    return delta_rnn_reference(*args, **kwargs)


def delta_lstm(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    W0: Tensor,
    c0: Tensor,
    y0: Tensor,
    reset: Tensor,
    *,
    grad_mode: str = "full",
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Delta LSTM over a whole sequence (see ``reference.delta_lstm``)."""
    from fwrl.kernels.reference.delta_lstm import delta_lstm_reference

    _reference_only("delta_lstm")
    return delta_lstm_reference(q, k, v, beta, W0, c0, y0, reset, grad_mode=grad_mode)


# --------------------------------------------------------------------------- SRWM (paper 002)
# Self-contained block: the self-referential weight matrix (SRWM, Fake SR,
# SR-DeltaNet cores), chosen the same way as the delta rule above.


def srwm(
    x: Tensor,
    W_y: Tensor,
    W_q: Tensor,
    W_k: Tensor,
    w_b: Tensor,
    offsets: tuple[Tensor, Tensor, Tensor, Tensor],
    reset: Tensor,
    *,
    input_map: str = "softmax",
    grad_mode: str = "full",
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """SRWM recurrence over a whole sequence (see ``reference.srwm``)."""
    from fwrl.kernels.reference.srwm import srwm_reference

    kwargs = dict(input_map=input_map, grad_mode=grad_mode)
    backend = kernel_backend()
    if backend != "reference":
        try:
            from fwrl.kernels.triton.srwm import srwm_triton, supports
        except ImportError:
            reason = "Triton kernels are not available"
        else:
            reason = supports(x, W_y, W_q, W_k, w_b, **kwargs)
            if reason is None:
                return srwm_triton(x, W_y, W_q, W_k, w_b, offsets, reset, **kwargs)
        if backend == "triton":
            raise FwrlError(
                f"FWRL_KERNELS=triton but no Triton SRWM kernel can run on these inputs "
                f"(dispatch.srwm): {reason}."
            )
    return srwm_reference(x, W_y, W_q, W_k, w_b, offsets, reset, **kwargs)
