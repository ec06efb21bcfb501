"""Delta LSTM (a fast LSTM), paper 000 App. A.2 Eq. 36-40: ``delta_lstm``. CPU tensors take
``cpu`` (the same maths: the six matrices' write vectors chunk-wide, only the reads and the cell
step by step, a hand-derived backward)."""

from __future__ import annotations

from torch import Tensor

from fwrl.kernels.dispatch import Fused, dispatch

from .cpu import delta_lstm_cpu
from .naive import delta_lstm_reference


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
    """Delta LSTM over a whole sequence (paper 000 App. A.2 Eq. 36-40; see ``naive``)."""
    return dispatch(
        "delta_lstm", delta_lstm_reference, _fused, (q, k, v, beta, W0, c0, y0, reset),
        dict(grad_mode=grad_mode), (q, k, v, beta, W0),
        "no Triton Delta LSTM kernel can run on these inputs (fwrl.kernels.delta_lstm)", layer,
        cpu=delta_lstm_cpu,
    )


def _fused() -> Fused:
    from .fused_recurrent import delta_lstm_triton, supports

    return Fused(delta_lstm_triton, supports)
