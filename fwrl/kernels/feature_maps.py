"""Feature maps phi applied to queries and keys (paper 001, Sec. 5 and Eq. 37).

- ``elu1_sumnorm``: phi(x) = elu(x) + 1, then divided by (sum + 1e-5)
  ("sum normalisation", paper 001 Eq. 29; how the RL code ran LT / Delta Net).
- ``softmax``: softmax over the head dimension (RDN, Delta RNN, SRWM).
- ``dpfp-N``: deterministic parameter-free projection with nu = N
  (paper 001 Eq. 37): r = relu([x, -x]), phi_{i*2d+j} = r_j * r_{(j+i) mod 2d}
  for i = 1..nu; output size 2 * nu * d; followed by sum normalisation.
- ``l2norm``: phi(x) = x / sqrt(sum x^2 + 1e-6), unit length (Gated DeltaNet, Yang et al. 2025,
  Sec. 3.4, PAPERS.md §7: the keys of the gated delta rule; 1e-6 as flash-linear-attention's l2norm).
- ``identity``: no map (for tests).

And f of paper 000 Eq. 12 (``recurrent_softmax``), the softmax with 1e-6 added to its
denominator that maps the previous output to the recurrent query of the Delta RNN and the
Delta LSTM (PAPERS.md §2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fwrl.errors import unknown_choice

SUM_NORM_EPS = 1e-5
RECURRENT_SOFTMAX_EPS = 1e-6
L2_NORM_EPS = 1e-6
FEATURE_MAPS = ("elu1_sumnorm", "softmax", "dpfp-1", "dpfp-2", "dpfp-3", "l2norm", "identity")


def sum_normalise(x: Tensor) -> Tensor:
    return x / (x.sum(dim=-1, keepdim=True) + SUM_NORM_EPS)


def l2_normalise(x: Tensor) -> Tensor:
    """x / sqrt(sum x^2 + L2_NORM_EPS) over the last axis."""
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def dpfp(x: Tensor, nu: int) -> Tensor:
    r = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    rolled = torch.cat([torch.roll(r, shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)
    repeated = torch.cat([r] * nu, dim=-1)
    return repeated * rolled


def feature_dim(name: str, dim: int) -> int:
    """Size of phi(x) for x of size ``dim``."""
    check_feature_map(name)
    if name.startswith("dpfp-"):
        return 2 * int(name.split("-")[1]) * dim
    return dim


def check_feature_map(name: str) -> None:
    if name not in FEATURE_MAPS:
        raise unknown_choice("feature map", name, FEATURE_MAPS)


def apply_feature_map(name: str, x: Tensor) -> Tensor:
    check_feature_map(name)
    if name == "elu1_sumnorm":
        return sum_normalise(F.elu(x) + 1.0)
    if name == "softmax":
        return torch.softmax(x, dim=-1)
    if name.startswith("dpfp-"):
        return sum_normalise(dpfp(x, int(name.split("-")[1])))
    if name == "l2norm":
        return l2_normalise(x)
    return x


def recurrent_softmax(h: Tensor) -> Tensor:
    """f of paper 000 Eq. 12: softmax over the last axis with 1e-6 added to the denominator."""
    e = torch.exp(h - h.amax(dim=-1, keepdim=True))
    return e / (e.sum(dim=-1, keepdim=True) + RECURRENT_SOFTMAX_EPS)


def adjacent_pair(q: Tensor, k: Tensor) -> Tensor | None:
    """``q`` and ``k`` as one [..., 2, D] view where ``k`` follows ``q`` in memory with the same strides
    (the slow net's ``[q | k | ...]`` slices of one output), else None: phi maps both in one call."""
    D = q.shape[-1]
    if (q.shape != k.shape or q.stride() != k.stride() or q.stride(-1) != 1 or q.dtype != k.dtype
            or k.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
            or k.storage_offset() != q.storage_offset() + D):
        return None
    return q.as_strided((*q.shape[:-1], 2, D), (*q.stride()[:-1], D, 1), q.storage_offset())
