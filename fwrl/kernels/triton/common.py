"""Triton helpers shared by every fused kernel (one copy, imported relatively).

Numerics: the sigmoid and tanh never overflow (they exponentiate ``-|x|``
only); softmaxes subtract the row maximum; masked lanes of a row give 0 in
every feature map and in every gradient.

Why only Triton builtins and ``tl.reduce``: the library wrappers (``tl.sum``,
``tl.sigmoid``, ``tl.zeros``...) are themselves ``@triton.jit`` functions, built
for GPUs or for the CPU interpreter once, when Triton is imported. The kernel
tests load a private copy of this package with ``TRITON_INTERPRET=1``
(``tests/kernel_harness.py``) in a process whose Triton was imported for GPUs;
helpers made of builtins work in both copies. The kernel modules import these
helpers relatively (``from .common import ...``), so the private copy of a
kernel module uses the private copy of this module.

Python helpers used by every wrapper are here too: the interpreter check, the
device / dtype reasons of ``supports``, the replay starts of the backward and the
launch options (with ``register_cap``, the benchmark's register cap).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Whether the kernels of this package copy were built for the CPU interpreter
# (decided by Triton when the module is imported).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

_SUM_COMBINE = tl.standard._sum_combine
_MAX_COMBINE = tl.standard._elementwise_max

# Feature-map codes of the kernels (constexpr FMAP); constexpr globals, so the
# kernels can name them.
FMAP_IDENTITY = tl.constexpr(0)
FMAP_ELU1_SUMNORM = tl.constexpr(1)
FMAP_SOFTMAX = tl.constexpr(2)
KERNEL_FEATURE_MAPS = {"identity": 0, "elu1_sumnorm": 1, "softmax": 2}


# --------------------------------------------------------------------------- reductions


@triton.jit
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _SUM_COMBINE)


@triton.jit
def _max(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _MAX_COMBINE)


@triton.jit
def _matvec(A, x):
    """A x for a [R, C] block and a [C] vector."""
    return _sum(A * x[None, :], 1)


@triton.jit
def _vecmat(A, g):
    """A^T g for a [R, C] block and an [R] vector."""
    return _sum(A * g[:, None], 0)


# --------------------------------------------------------------------------- element-wise


@triton.jit
def _sigmoid(x):
    """1 / (1 + exp(-x)) without overflow for large |x|."""
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _tanh(x):
    """tanh without overflow for large |x|."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _flag(mask, flag):
    """``mask & flag`` for a scalar flag, broadcast by hand (the CPU interpreter
    rejects a mask made by broadcasting a scalar inside ``&``)."""
    return mask & ((tl.full(mask.shape, 0, tl.int32) + flag.to(tl.int32)) != 0)


# --------------------------------------------------------------------------- feature maps


@triton.jit
def _softmax(x, mask):
    """Softmax of one row over the lanes in ``mask`` (0 elsewhere)."""
    xm = tl.where(mask, x, -float("inf"))
    e = tl.where(mask, tl.exp(xm - _max(xm, 0)), 0.0)
    return e / _sum(e, 0)


@triton.jit
def _softmax_backward(p, dp):
    """Gradient w.r.t. the logits given p = softmax and dp = dL/dp (0 on masked lanes)."""
    return p * (dp - _sum(dp * p, 0))


@triton.jit
def _phi(x, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """Feature map of one row (paper 001 Sec. 5): 1 = elu(x) + 1 then sum
    normalisation with EPS (Eq. 29), 2 = softmax, 0 = identity; masked lanes give 0."""
    if FMAP == 1:
        e = tl.where(mask, tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0))), 0.0)
        out = e / (_sum(e, 0) + EPS)
    elif FMAP == 2:
        out = _softmax(x, mask)
    else:
        out = tl.where(mask, x, 0.0)
    return out


@triton.jit
def _phi_backward(x, dphi, mask, FMAP: tl.constexpr, EPS: tl.constexpr):
    """Gradient w.r.t. x of one row, given the gradient w.r.t. phi(x)."""
    if FMAP == 1:
        ex = tl.exp(tl.minimum(x, 0.0))
        e = tl.where(mask, tl.where(x > 0, x + 1.0, ex), 0.0)
        s = _sum(e, 0) + EPS
        de = (dphi - _sum(dphi * e, 0) / s) / s
        dx = de * tl.where(x > 0, 1.0, ex)
    elif FMAP == 2:
        dx = _softmax_backward(_softmax(x, mask), tl.where(mask, dphi, 0.0))
    else:
        dx = dphi
    return tl.where(mask, dx, 0.0)


@triton.jit
def _l2norm(x, mask, EPS: tl.constexpr):
    """x / sqrt(sum x^2 + EPS) of one row over the lanes in ``mask`` (0 elsewhere): the ``l2norm``
    feature map (the gated delta rule's keys and queries)."""
    xm = tl.where(mask, x, 0.0)
    return xm / tl.sqrt(_sum(xm * xm, 0) + EPS)


@triton.jit
def _l2norm_backward(x, dphi, mask, EPS: tl.constexpr):
    """Gradient w.r.t. x of one row given the gradient w.r.t. phi = x / sqrt(s + EPS), s = sum x^2:
    (dphi - phi (phi . dphi)) / sqrt(s + EPS)."""
    xm = tl.where(mask, x, 0.0)
    r = 1.0 / tl.sqrt(_sum(xm * xm, 0) + EPS)
    phi = xm * r
    dm = tl.where(mask, dphi, 0.0)
    return tl.where(mask, (dm - phi * _sum(phi * dm, 0)) * r, 0.0)


@triton.jit
def _recurrent_softmax(h, mask, EPS: tl.constexpr):
    """f of paper 000 Eq. 12: softmax with EPS added to the denominator."""
    hm = tl.where(mask, h, -float("inf"))
    e = tl.where(mask, tl.exp(hm - _max(hm, 0)), 0.0)
    return e / (_sum(e, 0) + EPS)


@triton.jit
def _recurrent_softmax_backward(h, df, mask, EPS: tl.constexpr):
    """d f(h) / d h applied to df, with f = e / (sum e + eps), e = exp(h - max h).

    The max is not constant under the eps: its gradient goes, like amax's,
    evenly to the entries equal to the max.
    """
    hm = tl.where(mask, h, -float("inf"))
    m = _max(hm, 0)
    e = tl.where(mask, tl.exp(hm - m), 0.0)
    denom = _sum(e, 0) + EPS
    f = e / denom
    fdf = _sum(f * df, 0)
    dh = f * (df - fdf)
    at_max = mask & (hm == m)
    dm = -EPS / denom * fdf
    dh += tl.where(at_max, dm / _sum(at_max.to(tl.float32), 0), 0.0)
    return tl.where(mask, dh, 0.0)


# --------------------------------------------------------------------------- blocks


@triton.jit
def _pick(vec, idx, i: tl.constexpr):
    """Element i of a small vector as a scalar."""
    return _sum(tl.where(idx == i, vec, 0.0), 0)


@triton.jit
def _lanes(start, BLOCK: tl.constexpr, N):
    """Lanes ``start + [0, BLOCK)`` of an axis of length N, and their mask (lanes at N or past it off)."""
    o = start + tl.arange(0, BLOCK)
    return o, o < N


@triton.jit
def _tile(o_rows, m_rows, o_cols, m_cols, C):
    """Mask and offsets of the tile (the given rows and columns, with their masks) of a row-major
    matrix of C columns."""
    return m_rows[:, None] & m_cols[None, :], o_rows[:, None] * C + o_cols[None, :]


@triton.jit
def _block(row0, rows, BR: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Offsets and mask of rows [row0, row0 + rows) of a [*, D] matrix, as [BR, BD]."""
    orr = tl.arange(0, BR)
    od = tl.arange(0, BD)
    return (row0 + orr[:, None]) * D + od[None, :], (orr[:, None] < rows) & (od[None, :] < D)


@triton.jit
def _runtime_zero(flag):
    """0, computed from the loaded 0/1 byte ``flag``.

    Added to the row offset of reads inside a time loop (e.g. slow weights at
    resets and replays): the address tensors then depend on a value the compiler
    cannot see and are formed at each read, instead of being hoisted out of the
    loop where they would hold registers for all of it.
    """
    return tl.minimum(flag.to(tl.int32), 0)


@triton.jit
def _load_rows(base, row0, rows, BR: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Rows [row0, row0 + rows) of the [*, D] matrix at ``base`` as an fp32 [BR, BD] block."""
    p, m = _block(row0, rows, BR, BD, D)
    return tl.load(base + p, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _add_rows(base, row0, rows, value, BR: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Rows [row0, row0 + rows) of the fp32 [*, D] matrix at ``base`` += ``value`` ([BR, BD]):
    a read-modify-write by the one program that owns those rows (no atomics)."""
    p, m = _block(row0, rows, BR, BD, D)
    tl.store(base + p, tl.load(base + p, mask=m, other=0.0) + value, mask=m)


# --------------------------------------------------------------------------- Python helpers


def interpreting() -> bool:
    """True when this copy was built for the interpreter and TRITON_INTERPRET is still set."""
    return INTERPRETED and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The reason of every ``supports`` for an empty sequence.
EMPTY_SEQUENCE = "the sequence is empty (T = 0)"


def option_reasons(inputs: Mapping[str, Any], choices: Mapping[str, Collection[str]]) -> str | None:
    """The first option of a call (``inputs``: its arguments by the reference's parameter names)
    named in ``choices`` whose value is not one of its choices, as a reason of ``supports``
    ("<name> <value> is not one of <choices>"); None if none."""
    for name, allowed in choices.items():
        if inputs[name] not in allowed:
            return f"{name} {inputs[name]!r} is not one of {', '.join(allowed)}"
    return None


def rank_reasons(inputs: Mapping[str, Any], names: Sequence[str], layout: str) -> str | None:
    """The first of the named tensors of a call whose rank is not that of ``layout`` (e.g.
    "[T, B, H, D]"), as a reason of ``supports``; None if none."""
    rank = layout.count(",") + 1
    for name in names:
        if inputs[name].dim() != rank:
            return f"{name} has shape {tuple(inputs[name].shape)}; expected {layout}"
    return None


def tensor_reasons(inputs: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The first dtype or device problem of the named tensors of a call, with what would fix it.

    Dtypes are checked before devices, so a CUDA caller learns of every problem
    the kernel has with its inputs.
    """
    for name in names:
        if inputs[name].dtype not in INPUT_DTYPES:
            return f"{name} has dtype {inputs[name].dtype} (use float32, bfloat16 or float16 inputs)"
    for name in names:
        device = inputs[name].device.type
        if device != "cuda" and not (device == "cpu" and interpreting()):
            return (f"{name} is on {device}; the kernel needs CUDA tensors "
                    "(or TRITON_INTERPRET=1 when this module was imported, for CPU tests)")
    return None


def replay_starts(reset: Tensor) -> Tensor:
    """Per (t, b), int32 [T, B]: where the backward replays the state before a reset from.

    A reset at step t >= 1 makes W_{t-1} unrecoverable by undoing step t, so the
    backward rebuilds it by replaying the recorded updates of the segment that
    ends at t - 1: from its start s (the last reset before t, or 0, where the
    state is the initial one or zero) up to t - 1. ``starts[t, b] = s`` there and
    -1 elsewhere (no reset, or t = 0). Computed on the device from shapes alone:
    no host synchronisation, and no state is stored (each step is replayed at
    most once, since the segments are disjoint).
    """
    r = reset.to(torch.bool)
    T = r.shape[0]
    steps = torch.arange(T, device=r.device, dtype=torch.int32).view(T, *([1] * (r.dim() - 1)))
    last = torch.cummax(torch.where(r, steps, 0), dim=0).values  # last reset at or before t
    starts = torch.full(r.shape, -1, device=r.device, dtype=torch.int32)
    starts[1:] = torch.where(r[1:], last[:-1], -1)
    return starts.contiguous()


def aligned(x: Tensor) -> Tensor:
    """``x`` contiguous at a 16-byte aligned address (copied if it is not).

    Triton specialises kernels for aligned pointers (vectorised loads, compact
    register layouts); the sm_90 spill checks compile for that case, so every
    wrapper passes its tensors through here. Reads no device memory.
    """
    x = x.contiguous()
    return x if x.data_ptr() % 16 == 0 else x.clone()


# Registers per thread a cap may ask for (register_cap): a thread has at most 255,
# and ptxas gives a kernel 24 at least (on sm_90 a cap of 16 compiles at 24).
REGISTER_CAP_RANGE = (24, 255)
# The cap register_cap sets (None: none); read by launch_options at every launch.
_register_cap: int | None = None


def launch_options(num_warps: int, maxnreg: int | None = None) -> dict:
    """Options of every kernel launch (and of the sm_90 spill checks).

    ``maxnreg``: as many registers per thread as a block of ``num_warps`` can have
    (255 up to 8 warps). Left to itself, ptxas sometimes caps a kernel at 64 or
    128 registers to fit more blocks per SM and spills a few bytes; these kernels
    keep their state in registers and run one or two programs per SM, so they
    take the registers instead, unless the kernel names a cap of its own
    (``maxnreg``: one an A/B timing chose, e.g. the delta rule's 128). Inside
    ``register_cap(n)``, n replaces the kernel's own cap.
    """
    most = min(255, 65536 // (32 * num_warps))
    cap = _register_cap if _register_cap is not None else maxnreg
    if cap is not None:
        most = min(most, cap)
    return dict(num_warps=num_warps, maxnreg=most, enable_fp_fusion=True)


@contextlib.contextmanager
def register_cap(n: int | None) -> Iterator[None]:
    """Cap the registers per thread (``maxnreg``) of every kernel launched inside the
    context at ``n`` (an int in REGISTER_CAP_RANGE); None: the default of
    ``launch_options`` (the most a block can have, 255 up to 8 warps).

    For A/B timings of occupancy against spills (``fwrl bench kernels --maxnreg``):
    a cap of 128 lets an 8-warp program that takes 129-255 registers share an SM with
    another one, if ptxas fits it without spilling too much. The cap is
    ``min(a block's share, n)`` and replaces a kernel's own cap, so 255 is the
    uncapped binary of every kernel (the delta rule's default caps at 128). Triton compiles a
    separate binary per ``maxnreg`` value (it is part of the kernel's cache key), so
    the first launch under a new cap compiles. The setting is module-wide, not
    per thread: it applies to every launch inside the context, the backward kernels
    autograd runs included (on whatever thread), and is restored on exit, also on an
    exception; contexts nest, but do not open them concurrently from two threads.
    """
    global _register_cap
    low, high = REGISTER_CAP_RANGE
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high):
        raise ValueError(f"register cap {n!r} is not an int in [{low}, {high}] (registers per "
                         "thread) or None (the default)")
    previous = _register_cap
    _register_cap = n
    try:
        yield
    finally:
        _register_cap = previous


def warps_for(elements: int, per_warp: int, low: int = 1, high: int = 8) -> int:
    """A power of two of warps, ``elements / per_warp`` clamped to [low, high]."""
    return min(high, max(low, triton.next_power_of_2(max(1, elements // per_warp))))


def padded(n: int) -> int:
    """``n`` padded to a power of two, 16 at least: the block size every kernel lays a
    head dim (or a row count) out in."""
    return max(16, triton.next_power_of_2(n))
