"""Recurrent Delta Net (RDN), paper 000 Sec. 3.2 Eq. 15-18: ``rdn`` (reference ``naive``, Triton
``fused_recurrent`` on CUDA, ``cpu`` on the CPU)."""

from __future__ import annotations

from torch import Tensor

from fwrl.kernels.dispatch import Fused, dispatch

from .cpu import rdn_cpu
from .naive import rdn_reference


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
    """Recurrent Delta Net over a whole sequence (paper 000 Eq. 15-18; see ``naive``)."""
    return dispatch(
        "rdn", rdn_reference, _fused, (xq, xk, xv, xb, Rq, Rk, Rv, rb, W0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (xq, xk, xv, xb, Rq, W0),
        "no Triton RDN kernel can run on these inputs (fwrl.kernels.rdn)", layer, cpu=rdn_cpu,
    )


def _fused() -> Fused:
    from .fused_recurrent import rdn_triton, supports

    return Fused(rdn_triton, supports)
