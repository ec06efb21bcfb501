"""Choose the fused Triton kernel or the PyTorch reference for each recurrence.

CUDA tensors with a shape a kernel supports use Triton; everything else uses
the reference. ``FWRL_KERNELS=reference|triton`` forces one (forcing triton
on an unsupported input is an error that says why).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

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


def _dispatch(
    kernel: str,
    reference: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    supports_args: tuple,
    cannot_run: str,
) -> Any:
    """``<kernel>_triton(*args, **kwargs)`` from ``fwrl.kernels.triton.<kernel>`` where the
    backend allows Triton and its ``supports(*supports_args, **kwargs)`` gives no reason
    against; otherwise ``reference(*args, **kwargs)``, or under ``FWRL_KERNELS=triton`` an
    error "FWRL_KERNELS=triton but <cannot_run>: <reason>."."""
    backend = kernel_backend()
    if backend != "reference":
        try:
            module = importlib.import_module(f"fwrl.kernels.triton.{kernel}")
        except ImportError:
            reason = "Triton kernels are not available"
        else:
            reason = module.supports(*supports_args, **kwargs)
            if reason is None:
                return getattr(module, f"{kernel}_triton")(*args, **kwargs)
        if backend == "triton":
            raise FwrlError(f"FWRL_KERNELS=triton but {cannot_run}: {reason}.")
    return reference(*args, **kwargs)


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
    return _dispatch(
        "delta_rule", delta_rule_reference, (q, k, v, beta, W0, reset),
        dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode), (q, k, v),
        "the delta-rule kernel cannot run",
    )


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

    return _dispatch(
        "rdn", rdn_reference, (xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (xq, xk, xv, xb, Rq, W0),
        "no Triton RDN kernel can run on these inputs (dispatch.rdn)",
    )


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

    return _dispatch(
        "delta_rnn", delta_rnn_reference, (q, k, v, beta, kr, vr, betar, W0, R0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (q, k, v, kr, vr),
        "no Triton Delta RNN kernel can run on these inputs (dispatch.delta_rnn)",
    )


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

    return _dispatch(
        "srwm", srwm_reference, (x, W_y, W_q, W_k, w_b, offsets, reset),
        dict(input_map=input_map, grad_mode=grad_mode), (x, W_y, W_q, W_k, w_b),
        "no Triton SRWM kernel can run on these inputs (dispatch.srwm)",
    )
