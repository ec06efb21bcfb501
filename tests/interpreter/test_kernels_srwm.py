"""The fused Triton kernel of the SRWM (paper 002 Eq. 5-8) against its float64 PyTorch reference.

``SRWM``, this rule's row of the table (``kernel_rule_tests.Rule``), and the shared tests
(``kernel_rule_tests``) run on it, then the checks only this rule has.
"""

from __future__ import annotations

import pytest
import torch

import kernel_harness
from kernel_harness import LAUNCH_INTS, compile_sm90
from kernel_rule_tests import *  # noqa: F403  the shared tests (SHARED_TESTS), run on this rule: pytest_generate_tests
from kernel_rule_tests import Path, Rule, Shape, parametrize_for, randn

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test


def _srwm_inputs(T, B, H, d, g, *, dy=None, **_):
    """x, the slow weights W_y [H, dy, d], W_q, W_k [H, d, d], w_b [H, 4, d] (std 1/sqrt(d), as
    in the core) and non-zero offsets [B, ...] of each."""
    dy = d if dy is None else dy
    x = randn(g, T, B, H, d)
    slow = [randn(g, H, rows, d) / d**0.5 for rows in (dy, d, d, 4)]
    return [x, *slow, *(randn(g, B, *w.shape, scale=0.3) for w in slow)]


def _srwm_extreme(inputs):
    """Input logits of +-80, saturated rates (sigmoid of +-400 times the softmaxed x, which
    sums to one: beta_y, beta_q -> 1, beta_k, beta_b -> 0) and peaked q, k."""
    x, w_b = inputs[0], inputs[4]
    x[:, 0] = 80.0 * torch.sign(x[:, 0])
    x[::2, 1] = -80.0
    w_b[0, :2] = 400.0
    w_b[0, 2:] = -400.0


def _srwm_rebuild(K, inputs, reset, *, input_map="softmax", split_rows=None, **_):
    """S + O_0 (on the split path: every chunk of W^y and the core rows)."""
    x, S, O0 = inputs[0], torch.cat(inputs[1:5], dim=1), tuple(inputs[5:])
    fmap = K.KERNEL_INPUT_MAPS[input_map]
    y, OT, records = K._forward(x, S, O0, reset, fmap=fmap, store=True, split_rows=split_rows)
    *_, rebuilt = K._backward(x, S, O0, records, OT, torch.zeros_like(y),
                              tuple(torch.zeros_like(o) for o in OT), fmap=fmap, full=True, rebuild=True,
                              split_rows=split_rows)
    return [(rebuilt, S + torch.cat(O0, dim=2))]


def _srwm_sm90_builds(C):
    """The register kernels: SRWM and SR-DeltaNet at the preset head dim 16, both at d = 32
    (SR-DeltaNet's Dy = 3d + 1 = 97), SR-DeltaNet at d = 20 (the one block shape, 32 x 64,
    that needs fewer forward warps) and the SRWM at its largest head dim, 64. The split path
    (fused_recurrent_split) as the dispatch takes it: SR-DeltaNet at d = 64 (Dy = 193) and
    d = 40 (Dy = 121), and shapes beyond WARPS at head dims 16 and 24 (padded Dy of 256), with
    the default rows per program."""
    def io(dtype):
        io = {n: f"*{dtype}" for n in ("X", "Y", "DX", "DYOUT")}
        io.update(RESET="*i8", START="*i32")
        return io

    backward = dict(FULL=True, WRITE_REBUILT=False)
    for d, dy, dtype in ((16, 16, "bf16"), (16, 49, "fp32"), (32, 32, "bf16"), (32, 97, "bf16"),
                         (32, 97, "fp32"), (20, 61, "bf16"), (64, 64, "bf16"), (64, 64, "fp32")):
        bd, by, fwd_warps, bwd_warps = C._block_sizes(d, dy)
        sizes = dict(D=d, DY=dy, NREC=C._num_records(d, dy), BD=bd, BY=by, FMAP=2)
        label = f"kernel for d={d}, Dy={dy} ({dtype})"
        yield (f"forward {label}", compile_sm90(C._forward_kernel, io(dtype), dict(sizes, STORE=True),
                                               fwd_warps, LAUNCH_INTS), None)
        yield (f"backward {label}", compile_sm90(C._backward_kernel, io(dtype), dict(sizes, **backward),
                                                bwd_warps, LAUNCH_INTS), None)
    P = C.split_forward.__globals__  # the fused_recurrent_split module of the same package copy
    for d, dy, dtype in ((64, 193, "fp32"), (64, 193, "bf16"), (40, 121, "bf16"), (16, 200, "fp32"),
                         (24, 200, "bf16")):
        rows = C._split_rows(d, dy, None)
        assert rows == C.SPLIT_ROWS, f"d={d}, Dy={dy} does not take the split path"
        bd, core_warps, y_warps = P["split_config"](d, rows)
        sizes = dict(D=d, DY=dy, NREC=C._num_records(d, dy), BD=bd, FMAP=2)
        for name, kernel, constexprs, warps in (
                ("core forward", P["_core_forward_kernel"], sizes, core_warps[0]),
                ("core backward", P["_core_backward_kernel"], dict(sizes, **backward), core_warps[1]),
                ("W^y forward", P["_y_forward_kernel"], dict(sizes, BC=rows), y_warps[0]),
                ("W^y backward", P["_y_backward_kernel"], dict(sizes, BC=rows, **backward), y_warps[1])):
            # the W^y backward runs one launch per chunk: its index, a run-time int
            ints = dict(LAUNCH_INTS, CHUNK=3) if "CHUNK" in kernel.arg_names else LAUNCH_INTS
            yield (f"split {name} kernel for d={d}, Dy={dy} ({dtype}, {warps} warps)",
                   compile_sm90(kernel, io(dtype), constexprs, warps, ints), None)


SRWM = Rule(
    name="srwm",
    inputs=("x", "W_y", "W_q", "W_k", "w_b", "O_y", "O_q", "O_k", "O_b"),
    outputs=("y", "O_y_T", "O_q_T", "O_k_T", "O_b_T"),
    n_steps=1,
    n_state=4,
    make_inputs=_srwm_inputs,
    paths=(
        Path("registers", taken=lambda K: K._split_rows(16, 16, None) is None),
        # fused_recurrent_split (W^y's rows over programs), forced at d = 4 with Dy = 13
        # (SR-DeltaNet's 3d + 1) in chunks of 8 rows: two chunks (the second's partials added
        # to the first's), the last partly masked (5 of 8 rows)
        Path("split", d=4, sizes=dict(dy=13), kernel_options=dict(split_rows=8)),
    ),
    option_groups={"input_maps": (dict(input_map="softmax"), dict(input_map="identity"))},
    shapes=(
        # SR-DeltaNet's y-part (Dy = 3d + 1), odd head dim, two heads; on the split path at
        # d = 5: Dy = 16, two full chunks of 8 rows
        Shape("d=12-Dy=37", T=5, B=2, H=2, d=12, sizes=dict(dy=37)),
        Shape("split-d=5-Dy=16", T=5, B=2, H=2, d=5, sizes=dict(dy=16), kernel_options=dict(split_rows=8)),
        # SR-DeltaNet's SRWM at d = 32, the SRWM at its largest head dim, and SR-DeltaNet at
        # d = 64 and 40 (the split path, taken on its own); the backward replays row 0 from
        # S + O_0 at t = 1, row 1 from S at t = 2
        *(Shape(f"d={d}-Dy={dy}-{grad_mode}", T=3, B=2, H=1, d=d, sizes=dict(dy=dy), reset="alternating",
                options=dict(grad_mode=grad_mode), losses=("all",),
                taken=lambda K, d=d, dy=dy: K._split_rows(d, dy, None) == (
                    K.SPLIT_ROWS if dy == 3 * d + 1 and d > 32 else None))
          for d, dy, grad_mode in ((32, 97, "full"), (64, 64, "full"), (64, 193, "full"), (64, 193, "step"),
                                   (40, 121, "full"))),
    ),
    extreme=_srwm_extreme,
    # logits of +-80 times weights under the identity input map: only finiteness is meaningful
    extreme_options=((dict(input_map="softmax"), True), (dict(input_map="identity"), False)),
    rebuild=_srwm_rebuild,
    max_head_dim=64,
    bad_options=((dict(input_map="elu"), "input_map"),),
    accepted_sizes=(dict(d=32, dy=97), dict(d=64, dy=193)),  # SR-DeltaNet; d = 64: the split path
    refused_sizes=((dict(d=65, dy=196), "at most 64"),),  # SR-DeltaNet at d = 65
    mismatch=(2, "W_q"),
    error="no Triton SRWM kernel can run",
    cuda_sizes=(dict(d=16), dict(d=16, dy=49), dict(d=32), dict(d=32, dy=97), dict(d=64), dict(d=64, dy=193)),
    sm90_builds=_srwm_sm90_builds,
    state_tuple=True,
    split_exact=False,  # the final offsets are W_T - S: rounded differently after two calls
)

pytest_generate_tests = parametrize_for(SRWM)


# =========================================================================== only this rule


def test_srwm_split_path_choice():
    """The register path wherever WARPS has the block shape (SR-DeltaNet up to d = 32), the
    split path beyond (SPLIT_ROWS rows per program); a forced row count must be a power of two."""
    K = SRWM.K
    assert K._split_rows(32, 97, None) is None and K._split_rows(33, 100, None) == K.SPLIT_ROWS
    assert K._split_rows(16, 49, 4) == 4
    with pytest.raises(ValueError, match="power of two"):
        K._split_rows(16, 49, 3)
