"""The fused Triton kernel of the Delta LSTM (paper 000 App. A.2 Eq. 36-40) against its float64 PyTorch reference.

``DELTA_LSTM``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it.
"""

from __future__ import annotations

import functools
import re

import torch

import kernel_harness
from kernel_harness import LAUNCH_INTS, compile_sm90
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import Path, Rule, Shape, parametrize_for, randn

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _delta_lstm_inputs(T, B, H, d, g, **_):
    """q, k, v, beta, W0, c0, y0 (six matrices per head, in naive.MATRICES' order)."""
    return [randn(g, T, B, H, d), randn(g, T, B, H, 6, d), randn(g, T, B, H, 6, d), randn(g, T, B, H, 6),
            randn(g, B, H, 6, d, d, scale=0.5), randn(g, B, H, d), randn(g, B, H, d)]


def _delta_lstm_extreme(inputs):
    """Logits of +-80, saturated rates and a peaked recurrent softmax."""
    q, k, _, beta, _, _, y0 = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1, :, 3] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0
    y0[0] = 80.0


def _delta_lstm_rebuild(K, inputs, reset, **_):
    """All six matrices of W0, undone from W_T."""
    y, WT, cT, yT, records = K._forward(*inputs, reset, store=True)
    *_, rebuilt = K._backward(*inputs[:5], records, WT, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(cT), torch.zeros_like(yT), full=True, rebuild=True)
    return [(rebuilt, inputs[4])]


_BLOCKED = re.compile(r"#(\w+) = #ttg\.blocked<\{sizePerThread = \[([\d, ]+)\], "
                      r"threadsPerWarp = \[([\d, ]+)\], warpsPerCTA = \[([\d, ]+)\]")


def _assert_tiles_owned_once(build, br, bd, label):
    """The streamed kernels update each matrix tile in place (load, then store the same
    addresses, no barrier between): every [BR, BD] fp32 tile load and store must use one
    layout that gives each element to exactly one thread (no replica may read an element
    another thread has already overwritten)."""
    ttgir = build.asm["ttgir"]
    layouts = {name: [[int(x) for x in part.split(",")] for part in parts]
               for name, *parts in _BLOCKED.findall(ttgir)}
    used = set(re.findall(rf"tt\.(?:load|store) .*: tensor<{br}x{bd}x!tt\.ptr<f32>, #(\w+)>", ttgir))
    assert len(used) == 1, f"{label}: tile loads and stores use the layouts {used}"
    (name,) = used
    spt, tpw, wpc = layouts[name]
    covered = [a * b * c for a, b, c in zip(spt, tpw, wpc)]
    assert covered[0] <= br and covered[1] <= bd, (
        f"{label}: layout {name} covers {covered} > the [{br}, {bd}] tile (replicated)")


def _delta_lstm_sm90_builds(C):
    """The register kernels at the preset head dims 16 and 32 (Atari defaults); the streamed
    kernels at 48 and 64, each checked for tiles owned once."""
    def io(dtype):
        io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK", "DV", "DBETA")}
        io.update(RESET="*i8", START="*i32")
        return io

    for d, dtype in ((16, "bf16"), (32, "bf16"), (32, "fp32")):
        assert not C._streams(d)
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        yield (f"forward kernel for d={d} ({dtype})",
               compile_sm90(C._forward_kernel, io(dtype), dict(D=d, BD=bd, STORE=True, REPS=1e-6), fwd_warps,
                            LAUNCH_INTS), None)
        yield (f"backward kernel for d={d} ({dtype})",
               compile_sm90(C._backward_kernel, io(dtype),
                            dict(D=d, BD=bd, FULL=True, WRITE_REBUILT=False, REPS=1e-6), bwd_warps,
                            LAUNCH_INTS), None)
    for d, dtype in ((48, "fp32"), (48, "bf16"), (64, "fp32"), (64, "bf16")):
        assert C._streams(d)
        bd, fwd_rows, fwd_warps, bwd_rows, bwd_warps = C._streamed_sizes(d)
        for name, kernel, rows, constexprs, warps in (
                ("forward", C._forward_streamed_kernel, fwd_rows, dict(STORE=True), fwd_warps),
                ("backward", C._backward_streamed_kernel, bwd_rows, dict(FULL=True), bwd_warps)):
            label = f"streamed {name} kernel for d={d} ({dtype})"
            build = compile_sm90(kernel, io(dtype), dict(D=d, BD=bd, BR=rows, REPS=1e-6, **constexprs), warps,
                                 LAUNCH_INTS)
            yield (label, build, functools.partial(_assert_tiles_owned_once, br=rows, bd=bd, label=label))


DELTA_LSTM = Rule(
    name="delta_lstm",
    inputs=("q", "k", "v", "beta", "W0", "c0", "y0"),
    outputs=("y", "W_T", "c_T", "y_T"),
    n_steps=4,
    n_state=3,
    make_inputs=_delta_lstm_inputs,
    paths=(
        Path("registers", d=16, taken=lambda K: not K._streams(16), reversal_steps=30),
        # the streamed kernels of head dims 33..64, forced at d = 10 in row tiles of 4 (forward)
        # and 8 (backward): several tiles and a partly masked last tile
        Path("streamed", d=10, patch=dict(STREAM_ABOVE=0, STREAMED={16: (4, 1, 8, 2)}),
             taken=lambda K: K._streams(10), reversal_steps=12),
    ),
    option_groups={"defaults": ({},)},
    shapes=tuple(
        # d = 12 (masked lanes), the largest register d = 32, and the streamed kernels at their
        # real head dims: d = 40 (masked lanes and rows) and the largest, 64
        Shape(f"d={d}", T=3 if d <= 40 else 2, B=2, H=2 if d == 12 else 1, d=d, reset="alternating",
              taken=lambda K, d=d: K._streams(d) == (d > 32))
        for d in (12, 32, 40, 64)),
    extreme=_delta_lstm_extreme,
    extreme_options=(({}, True),),
    rebuild=_delta_lstm_rebuild,
    max_head_dim=64,
    bad_options=(),
    accepted_sizes=(dict(d=33), dict(d=48)),  # the streamed kernels
    refused_sizes=(),
    mismatch=(1, "k has shape"),
    error="no Triton Delta LSTM kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 48, 64)),
    sm90_builds=_delta_lstm_sm90_builds,
)

pytest_generate_tests = parametrize_for(DELTA_LSTM)
