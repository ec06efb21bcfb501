"""Choose the fused Triton kernel or the PyTorch reference for each recurrence.

CUDA tensors with a shape a kernel supports use Triton; everything else uses
the reference. ``FWRL_KERNELS=reference|triton`` forces one (forcing triton
on an unsupported input is an error that says why).

Every call names its layer (``layer=``, a stable key such as the calling
module's ``kernel_layer_name``); the first call of each layer logs, at INFO on
the ``fwrl.kernels`` logger, which backend runs and on what shape. A CUDA input
that falls back to the reference is never silently slow: it warns once per
layer and reason, saying why and what would avoid it (a supported head dim,
dtype or feature map; ``pip install -e '.[kernels]'``; or
``FWRL_KERNELS=reference`` to choose the reference on purpose, which silences
the warning). CPU inputs run the reference without a warning.
"""

from __future__ import annotations

import importlib
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from fwrl.errors import FwrlError, install_command, unknown_choice
from fwrl.kernels.reference.delta_rule import delta_rule_reference

BACKENDS = ("auto", "reference", "triton")

logger = logging.getLogger("fwrl.kernels")

# Layers (with their kernel, backend and device) already logged, and (layer,
# kernel, reason) already warned about: each is said once per process.
_announced: set[tuple[str, str, str, str]] = set()
_warned: set[tuple[str, str, str]] = set()


class KernelFallbackWarning(UserWarning):
    """A CUDA input runs the (much slower) PyTorch reference instead of a fused kernel."""


def kernel_backend() -> str:
    """The backend requested through ``FWRL_KERNELS`` (default ``auto``)."""
    value = os.environ.get("FWRL_KERNELS", "auto")
    if value not in BACKENDS:
        raise unknown_choice("FWRL_KERNELS value", value, BACKENDS)
    return value


def kernel_layer_name(module: nn.Module) -> str:
    """The ``layer`` key of a fast-weight layer: its class and identity (stable for its life)."""
    return f"{type(module).__name__}@{id(module):#x}"


def forget_announcements() -> None:
    """Log and warn again as if no layer had been seen (for tests)."""
    _announced.clear()
    _warned.clear()


def _on_cuda(x: Tensor) -> bool:
    return x.device.type == "cuda"


def _describe(x: Tensor) -> str:
    return f"{list(x.shape)} {str(x.dtype).removeprefix('torch.')} on {x.device}"


def fallback_message(kernel: str, layer: str, reason: str) -> str:
    """The warning for a CUDA input that runs the reference: why, and what would avoid it.

    ``reason`` comes from the kernel's ``supports`` (which says, in parentheses, what
    input the kernel would take) or from the import of Triton.
    """
    return (f"fwrl.kernels: layer {layer}: the {kernel} recurrence runs the PyTorch reference on "
            f"CUDA, much slower than its fused Triton kernel, because {reason}. To run the "
            f"kernel, change that; to choose the reference on purpose (and silence this "
            f"warning), set FWRL_KERNELS=reference.")


def _announce(layer: str, kernel: str, backend: str, x: Tensor, why: str = "") -> None:
    key = (layer, kernel, backend, str(x.device))
    if key in _announced:
        return
    _announced.add(key)
    because = f" ({why})" if why else ""
    logger.info("layer %s: %s runs on %s%s, input %s", layer, kernel, backend, because,
                _describe(x))


def _warn_fallback(layer: str, kernel: str, reason: str) -> None:
    key = (layer, kernel, reason)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(fallback_message(kernel, layer, reason), KernelFallbackWarning, stacklevel=4)


def _kernel_module(kernel: str) -> tuple[Any, str | None]:
    """(``fwrl.kernels.triton.<kernel>``, None), or (None, why it cannot be imported)."""
    try:
        return importlib.import_module(f"fwrl.kernels.triton.{kernel}"), None
    except ImportError as exc:
        return None, (f"Triton is not importable ({exc}; install it with "
                      f"{install_command('kernels')})")


def _dispatch(
    kernel: str,
    reference: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    supports_args: tuple,
    cannot_run: str,
    layer: str | None,
) -> Any:
    """``<kernel>_triton(*args, **kwargs)`` from ``fwrl.kernels.triton.<kernel>`` where the
    backend allows Triton and its ``supports(*supports_args, **kwargs)`` gives no reason
    against; otherwise ``reference(*args, **kwargs)``, or under ``FWRL_KERNELS=triton`` an
    error "FWRL_KERNELS=triton but <cannot_run>: <reason>.". Logs the choice once per
    ``layer``; warns once per layer and reason when a CUDA input falls back."""
    backend = kernel_backend()
    x = supports_args[0]
    layer = layer or f"{kernel} (unnamed)"
    if backend == "reference":
        _announce(layer, kernel, "reference", x, "FWRL_KERNELS=reference")
        return reference(*args, **kwargs)
    module, reason = _kernel_module(kernel)
    if module is not None:
        reason = module.supports(*supports_args, **kwargs)
        if reason is None:
            _announce(layer, kernel, "triton", x)
            return getattr(module, f"{kernel}_triton")(*args, **kwargs)
    if backend == "triton":
        raise FwrlError(f"FWRL_KERNELS=triton but {cannot_run}: {reason}.")
    if _on_cuda(x):
        _warn_fallback(layer, kernel, reason)
    _announce(layer, kernel, "reference", x, reason)
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
    layer: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Sum / delta rule over a whole sequence (paper 001 Eq. 20-25; see ``reference.delta_rule``)."""
    return _dispatch(
        "delta_rule", delta_rule_reference, (q, k, v, beta, W0, reset),
        dict(rule=rule, feature_map=feature_map, grad_mode=grad_mode), (q, k, v),
        "the delta-rule kernel cannot run", layer,
    )


# --------------------------------------------------------------------------- recurrent FWPs
# RDN, Delta RNN and Delta LSTM (paper 000), chosen like the delta rule.


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
    layer: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Recurrent Delta Net over a whole sequence (paper 000 Eq. 15-18; see ``reference.rdn``)."""
    from fwrl.kernels.reference.rdn import rdn_reference

    return _dispatch(
        "rdn", rdn_reference, (xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (xq, xk, xv, xb, Rq, W0),
        "no Triton RDN kernel can run on these inputs (dispatch.rdn)", layer,
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
    layer: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Delta RNN over a whole sequence (paper 000 Eq. 12; see ``reference.delta_rnn``)."""
    from fwrl.kernels.reference.delta_rnn import delta_rnn_reference

    return _dispatch(
        "delta_rnn", delta_rnn_reference, (q, k, v, beta, kr, vr, betar, W0, R0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (q, k, v, kr, vr),
        "no Triton Delta RNN kernel can run on these inputs (dispatch.delta_rnn)", layer,
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
    layer: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Delta LSTM over a whole sequence (paper 000 App. A.2 Eq. 36-40; see
    ``reference.delta_lstm``)."""
    from fwrl.kernels.reference.delta_lstm import delta_lstm_reference

    return _dispatch(
        "delta_lstm", delta_lstm_reference, (q, k, v, beta, W0, c0, y0, reset),
        dict(grad_mode=grad_mode), (q, k, v, beta, W0),
        "no Triton Delta LSTM kernel can run on these inputs (dispatch.delta_lstm)", layer,
    )


# --------------------------------------------------------------------------- SRWM (paper 002)
# The self-referential weight matrix (SRWM, Fake SR, SR-DeltaNet cores), chosen
# the same way.


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
    layer: str | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
    """SRWM recurrence over a whole sequence (paper 002 Eq. 5-8; see ``reference.srwm``)."""
    from fwrl.kernels.reference.srwm import srwm_reference

    return _dispatch(
        "srwm", srwm_reference, (x, W_y, W_q, W_k, w_b, offsets, reset),
        dict(input_map=input_map, grad_mode=grad_mode), (x, W_y, W_q, W_k, w_b),
        "no Triton SRWM kernel can run on these inputs (dispatch.srwm)", layer,
    )
