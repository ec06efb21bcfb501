"""Delta RNN (a fast RNN), paper 000 Sec. 3.1 Eq. 12: ``delta_rnn``. CPU tensors take
``cpu`` (the same maths: W and R's write vectors chunk-wide, only the recurrent read step by step,
a hand-derived backward)."""

from __future__ import annotations

from torch import Tensor

from fwrl.kernels.dispatch import Fused, dispatch

from .cpu import delta_rnn_cpu
from .naive import delta_rnn_reference


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
    """Delta RNN over a whole sequence (paper 000 Eq. 12; see ``naive``)."""
    return dispatch(
        "delta_rnn", delta_rnn_reference, _fused, (q, k, v, beta, kr, vr, betar, W0, R0, h0, reset),
        dict(feature_map=feature_map, grad_mode=grad_mode), (q, k, v, kr, vr),
        "no Triton Delta RNN kernel can run on these inputs (fwrl.kernels.delta_rnn)", layer,
        cpu=delta_rnn_cpu,
    )


def _fused() -> Fused:
    from .fused_recurrent import delta_rnn_triton, supports

    return Fused(delta_rnn_triton, supports)
