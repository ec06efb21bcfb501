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
