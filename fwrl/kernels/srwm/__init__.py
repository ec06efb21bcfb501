"""Self-referential weight matrix (SRWM), paper 002 Eq. 5-8 with App. A's rates: ``srwm``.

The recurrence of the SRWM, Fake SR and SR-DeltaNet cores; its fused kernel takes
``fused_recurrent_split`` (W^y's rows over programs) where the whole matrix does not fit
one program. CPU tensors take ``cpu`` (the same maths in fewer, larger calls).
"""

from __future__ import annotations

from torch import Tensor

from fwrl.kernels.dispatch import Fused, dispatch

from .cpu import srwm_cpu
from .naive import srwm_reference


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
    """SRWM recurrence over a whole sequence (paper 002 Eq. 5-8; see ``naive``)."""
    return dispatch(
        "srwm", srwm_reference, _fused, (x, W_y, W_q, W_k, w_b, offsets, reset),
        dict(input_map=input_map, grad_mode=grad_mode), (x, W_y, W_q, W_k, w_b),
        "no Triton SRWM kernel can run on these inputs (fwrl.kernels.srwm)", layer, cpu=srwm_cpu,
    )


def _fused() -> Fused:
    from .fused_recurrent import srwm_triton, supports

    return Fused(srwm_triton, supports)
