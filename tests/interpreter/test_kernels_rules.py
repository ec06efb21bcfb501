"""The fused Triton kernels of every fast-weight rule against their float64 PyTorch references.

One table, :data:`RULES`, holds one :class:`Rule` per kernel (``fwrl/kernels/<rule>/``): how to
make its inputs at a shape (float64, in the reference's argument order: the per-step inputs
first, the initial state last), its output names, its paths (the ways its kernels run, e.g. the
Delta LSTM's register and streamed kernels), its option groups, its odd/largest head-dim cases,
how to push its inputs to extremes, how to rebuild its initial state by reversal, what
``supports`` must refuse, its CUDA shapes and its shipped sm_90 builds. The upstream gradients
of a case are drawn at the shapes the reference returns, so the table holds no gradient makers.

The shared tests (the first section) run over the table, parametrized by rule (and path, option
group, grad mode): values, final state and every input gradient match the reference; odd and
largest head dims, with partial losses; a sequence split in two calls equals one call; reversal
rebuilds the initial state; extreme inputs stay finite; low-precision inputs; the one-step
inference path and determinism; ``supports`` gives reasons and the public function dispatches;
CUDA matches the reference (skipped without a GPU); the shipped configurations compile for
sm_90 without spills (compile only, ``needs_compiling_triton``). Checks that only one rule has
follow in a section per rule at the end: they use the same table and helpers, so they live here
rather than in modules of their own. (The module's name matches ``tests/*/test_kernels_*.py``,
whose CUDA and sm_90 tests ``benchmarks/gpu/suite.py`` runs on GPUs.)

The kernels run on CPU through the Triton interpreter: each rule's ``fused_recurrent`` is
loaded from a private copy of ``fwrl.kernels`` built for the interpreter, and the autouse
``_interpret`` fixture sets ``TRITON_INTERPRET=1`` per test (``kernel_harness.py``). Shapes are
tiny because the interpreter costs milliseconds per program per step.

To add a rule: write its ``<rule>_inputs`` (and ``_extreme``, ``_rebuild``, ``_sm90_builds``)
next to the others, add a ``Rule`` entry to :data:`RULES` and, for checks no other rule has, a
section of its own at the end. Every shared test then covers it.

Paper equations: the delta rule and sum rule, paper 001 Eq. 20-25; the gated delta rule, Gated
DeltaNet (Yang et al. 2025) Eq. 10; the Delta RNN, paper 000 Eq. 12; the Delta LSTM, paper 000 App. A.2 Eq. 36-40; the Recurrent Delta Net, paper 000
Eq. 15-18; the SRWM, paper 002 Eq. 5-8.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels import GRAD_MODES
from fwrl.kernels.delta_lstm import delta_lstm
from fwrl.kernels.delta_lstm.cpu import delta_lstm_cpu
from fwrl.kernels.delta_lstm.naive import delta_lstm_reference
from fwrl.kernels.delta_rnn import delta_rnn
from fwrl.kernels.delta_rnn.cpu import delta_rnn_cpu
from fwrl.kernels.delta_rnn.naive import delta_rnn_reference
from fwrl.kernels.delta_rule import delta_rule
from fwrl.kernels.delta_rule.cpu import delta_rule_cpu
from fwrl.kernels.delta_rule.naive import delta_rule_reference
from fwrl.kernels.gated_delta_rule import gated_delta_rule
from fwrl.kernels.gated_delta_rule.cpu import gated_delta_rule_cpu
from fwrl.kernels.gated_delta_rule.naive import gated_delta_rule_reference
from fwrl.kernels.rdn import rdn
from fwrl.kernels.rdn.cpu import rdn_cpu
from fwrl.kernels.rdn.naive import rdn_reference
from fwrl.kernels.srwm import srwm
from fwrl.kernels.srwm.cpu import srwm_cpu
from fwrl.kernels.srwm.naive import srwm_reference
import kernel_harness
from kernel_harness import (
    LAUNCH_INTS,
    assert_all_close,
    compile_sm90,
    launch_specialisation,
    load_kernel_module,
    needs_compiling_triton,
    registers,
    resets,
    run_with_grads,
    skip_without_sm90_toolchain,
    stack_and_local_bytes,
)

_interpret = kernel_harness._interpret  # the autouse fixture: TRITON_INTERPRET=1 in every test

# (T, reset pattern) of the reference comparisons: one and two steps with resets nowhere, at the
# start, inside and everywhere, and a longer sequence with resets inside (the backward replays
# the segments before them from the initial state or from zero): at T = 7, the shortest with
# this shape, both rows reset at step 3 (3 steps replayed from the initial state), row 1 again
# at 4 and 5 (one-step segments replayed from zero), and both carry on to step 6.
RESET_CASES = ((1, "none"), (1, "start"), (2, "none"), (2, "start"), (2, "mid"), (2, "everywhere"),
               (7, "mid"))
# Tolerances: the kernels (fp32) against the float64 reference (each rule's ``tolerance``, by
# default assert_all_close's atol 2e-5, rtol 1e-4); on a GPU at rollout shapes; outputs and
# gradients rounded once to a bf16/fp16 input dtype; a state kept in fp32 from rounded inputs.
CUDA_TOLERANCE = dict(atol=1e-4, rtol=1e-3)
ROUNDED_TOLERANCE = dict(atol=2e-2, rtol=2e-2)
STATE_TOLERANCE = dict(atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- the table's types


@dataclass(frozen=True)
class Path:
    """One way a rule's kernels run; every shared test runs on each path of a rule. ``d`` and
    ``sizes`` (other sizes of the rule's input maker) select it, ``kernel_options`` are keywords
    only the Triton function takes, ``patch`` sets attributes of the interpreted kernel module
    for the test, and ``taken(K)`` must then hold (it checks that the path is the one run)."""

    name: str
    d: int = 16
    sizes: Mapping = field(default_factory=dict)
    kernel_options: Mapping = field(default_factory=dict)
    patch: Mapping = field(default_factory=dict)
    taken: Callable[[ModuleType], bool] | None = None
    reversal_steps: int = 100  # updates undone by the reversal test


@dataclass(frozen=True)
class Shape:
    """An odd or largest head-dim case: sizes, resets, options (reference and kernel),
    Triton-only keywords, the losses it is checked under ("all", "y only": the final state
    gets no gradient, "state only": y gets none) and what must hold of the kernel module."""

    label: str
    T: int
    B: int
    H: int
    d: int
    sizes: Mapping = field(default_factory=dict)
    reset: str = "mid"
    options: Mapping = field(default_factory=dict)
    kernel_options: Mapping = field(default_factory=dict)
    losses: tuple[str, ...] = ("y only", "state only")
    taken: Callable[[ModuleType], bool] | None = None


@dataclass(frozen=True)
class Rule:
    """One kernel's row of the table (see the module docstring)."""

    name: str
    inputs: tuple[str, ...]  # argument names, in the reference's order (reset follows them)
    outputs: tuple[str, ...]  # y, then the final state (the outputs are flattened)
    n_steps: int  # the leading inputs indexed by time: sliced by calls, rounded to low precision
    n_state: int  # the trailing inputs that are the initial state; outputs[1:] are their finals
    make_inputs: Callable[..., list[torch.Tensor]]  # (T, B, H, d, generator, **sizes, **options)
    reference: Callable
    public: Callable  # fwrl.kernels.<rule>.<rule>, the dispatching function
    cpu: Callable
    paths: tuple[Path, ...]
    # options of the reference comparisons: per group (a test each), the settings are taken by
    # the reset cases in turn; tests of one setting take each group's first
    option_groups: Mapping[str, tuple[Mapping, ...]]
    shapes: tuple[Shape, ...]
    extreme: Callable[[list[torch.Tensor]], None]  # pushes (B = 2) inputs to extremes, in place
    extreme_options: tuple[tuple[Mapping, bool], ...]  # (options, compared: else finite only)
    rebuild: Callable[..., list[tuple[torch.Tensor, torch.Tensor]]]  # (K, inputs, reset, **opts)
    supports_inputs: tuple[int, ...]  # which inputs ``supports`` takes, in its order
    max_head_dim: int
    bad_options: tuple[tuple[Mapping, str], ...]  # (options, words of supports' reason)
    accepted_sizes: tuple[Mapping, ...]  # other sizes supports accepts
    refused_sizes: tuple[tuple[Mapping, str], ...]  # (sizes and options, words of the reason)
    mismatch: tuple[int, str]  # (supports argument cut to 8 features, words of the reason)
    error: str  # the FwrlError of FWRL_KERNELS=triton on inputs no kernel runs on (a regex)
    cuda_sizes: tuple[Mapping, ...]
    sm90_builds: Callable[[ModuleType], Iterator[tuple]]  # yields (label, build, check or None[, stack bytes allowed])
    low_precision: tuple[torch.dtype, ...] = (torch.bfloat16,)
    state_tuple: bool = False  # the state goes in and out as one tuple argument (the SRWM)
    split_exact: bool = True  # a sequence split in two calls gives bit-identical outputs
    tolerance: Mapping = field(default_factory=lambda: dict(atol=2e-5, rtol=1e-4))

    @property
    def K(self) -> ModuleType:
        """The interpreted ``fused_recurrent`` module."""
        return KERNELS[self.name]

    @property
    def triton(self) -> Callable:
        return getattr(self.K, f"{self.name}_triton")

    @property
    def names(self) -> tuple[str, ...]:
        return self.outputs + tuple(f"d{name}" for name in self.inputs)

    def first_options(self) -> list[tuple[str, Mapping]]:
        return [(group, settings[0]) for group, settings in self.option_groups.items()]


KERNELS = {name: load_kernel_module(name, interpret=True)
           for name in ("delta_rule", "gated_delta_rule", "delta_rnn", "delta_lstm", "rdn", "srwm")}


def _randn(g, *shape, scale=1.0):
    return scale * torch.randn(*shape, generator=g, dtype=torch.float64)


def _key_features(feature_map: str, d: int) -> int:
    """Features per key of ``feature_map`` (dpfp-n: 2 n d)."""
    return {"dpfp-1": 2, "dpfp-2": 4, "dpfp-3": 6}.get(feature_map, 1) * d


# --------------------------------------------------------------------------- delta / sum rule


def _delta_rule_inputs(T, B, H, d, g, *, dv=None, feature_map="elu1_sumnorm", **_):
    """q, k [T, B, H, d], v [T, B, H, dv], beta, W0 [B, H, dv, key features]."""
    dv = d if dv is None else dv
    return [_randn(g, T, B, H, d), _randn(g, T, B, H, d), _randn(g, T, B, H, dv), _randn(g, T, B, H),
            _randn(g, B, H, dv, _key_features(feature_map, d), scale=0.5)]


def _delta_rule_extreme(inputs):
    """Logits of +-80 (all-zero sum-normalised keys after elu + 1 of -80) and saturated betas."""
    q, k, _, beta, _ = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0


def _delta_rule_rebuild(K, inputs, reset, *, rule="delta", feature_map="elu1_sumnorm", **_):
    q, k, v, beta, W0 = inputs
    delta, code = rule == "delta", K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, records = K._forward(q, k, v, beta, W0, reset, delta=delta, fmap=code, store=True)
    *_, rebuilt = K._backward(q, k, v, beta, W0, records, WT, torch.zeros_like(y),
                              torch.zeros_like(WT), delta=delta, fmap=code, full=True, rebuild=True)
    return [(rebuilt, W0)]


# Shipped configurations: head dims of the presets and the supported range, split over 1
# program per (batch, head) and over the row blocks ``split`` gives (``--split`` of the
# benchmark, ``auto`` on small grids); (dim, split, rule, dtype). (64, 1, "delta", "fp32") is
# what the H100 timed at the large shape (split auto).
# The stack a backward build under the register cap may keep: on the H200 at 35e8e0f, Triton
# 3.6 kept 24 B of stack (no local memory) in the fp32 backward at head dim 64 under cap 128,
# and that binary ran fwd+bwd 1.43x faster than the uncapped one at (256, 101, 8, 64)
# (benchmarks/results/gpu/kernels-h200-35e8e0f). Anything more, or any stack without a cap,
# fails.
DELTA_RULE_CAPPED_STACK_BYTES = 32
DELTA_RULE_COMPILE_CASES = [(16, 1, "delta", "bf16"), (32, 1, "delta", "bf16"), (32, 2, "delta", "bf16"),
                            (64, 1, "sum", "fp32"), (64, 1, "delta", "fp32"), (64, 2, "delta", "bf16"),
                            (64, 4, "delta", "fp32"), (128, 1, "delta", "fp32"), (128, 8, "delta", "bf16")]


def _delta_rule_io(dtype):
    io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "Y", "DY", "DQ", "DK_", "DV_")}
    io.update(RESET="*i8", START="*i32")
    return io


def _delta_rule_sm90_builds(C):
    """The forward/backward kernels under the register cap their launches pass
    (``register_cap_for``), at the values a launch at the benchmark's large shape passes (every
    head dim here marked divisible by 16), and the feature-map backward of head dim 128 split
    8 ways (N = T * B * H rows)."""
    for dim, split, rule, dtype in DELTA_RULE_COMPILE_CASES:
        bk, bv, fwd_warps, bwd_warps = C._block_sizes(dim, dim, split)
        common = dict(BK=bk, BV=bv, FMAP=1, DELTA=rule == "delta", EPS=1e-5)
        ints = dict(LAUNCH_INTS, DK=dim, DV=dim)
        cap = C.register_cap_for(dim, dim)
        label = f"kernel for head dim {dim}, split {split} ({rule}, {dtype}, register cap {cap})"
        yield (f"forward {label}", compile_sm90(C._forward_kernel, _delta_rule_io(dtype),
                                               dict(common, STORE=True), fwd_warps, ints, cap), None)
        backward = dict(common, FULL=True, FUSE_FMAP=bv >= dim, WRITE_REBUILT=False)
        yield (f"backward {label}", compile_sm90(C._backward_kernel, _delta_rule_io(dtype), backward,
                                                bwd_warps, ints, cap), None,
               DELTA_RULE_CAPPED_STACK_BYTES if cap else 0)
    rows = LAUNCH_INTS["T"] * LAUNCH_INTS["B"] * LAUNCH_INTS["H"]
    yield ("feature-map backward kernel for head dim 128 split 8",
           compile_sm90(C._feature_map_backward_kernel, {"X": "*bf16", "DX": "*bf16"},
                        dict(BD=128, FMAP=1, EPS=1e-5), 1, dict(N=rows, NV=8, D=128)), None)


DELTA_RULE = Rule(
    name="delta_rule",
    inputs=("q", "k", "v", "beta", "W0"),
    outputs=("y", "W_T"),
    n_steps=4,
    n_state=1,
    make_inputs=_delta_rule_inputs,
    reference=delta_rule_reference,
    public=delta_rule,
    cpu=delta_rule_cpu,
    paths=(Path("registers", taken=lambda K: K._block_sizes(16, 16)[1] >= 16),),
    option_groups={f"{rule}-{fmap}": (dict(rule=rule, feature_map=fmap),)
                   for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")},
    shapes=(
        *(Shape(f"H=2-{grad_mode}", T=5, B=2, H=2, d=16, options=dict(grad_mode=grad_mode))
          for grad_mode in GRAD_MODES),
        *(Shape(f"dk=20-dv=24-{rule}", T=4, B=1, H=2, d=20, sizes=dict(dv=24), options=dict(rule=rule),
                losses=("all",)) for rule in ("delta", "sum")),
        # dpfp-1 is applied outside the kernel (it doubles the key features: W0 is [16, 16])
        Shape("dpfp-1", T=3, B=1, H=1, d=8, sizes=dict(dv=16), options=dict(feature_map="dpfp-1"),
              losses=("all",)),
    ),
    extreme=_delta_rule_extreme,
    extreme_options=tuple((dict(rule=rule, feature_map=fmap), True)
                          for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")),
    rebuild=_delta_rule_rebuild,
    supports_inputs=(0, 1, 2),
    max_head_dim=128,
    bad_options=((dict(rule="oja"), "rule"), (dict(feature_map="relu"), "feature map")),
    accepted_sizes=(),
    refused_sizes=((dict(d=32, feature_map="dpfp-3"), "192"),),  # 6 * 32 key features
    mismatch=(1, "match"),
    error=r"FWRL_KERNELS=triton but .*delta.rule kernel",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64, 128)),
    sm90_builds=_delta_rule_sm90_builds,
    low_precision=(torch.bfloat16, torch.float16),
)


# --------------------------------------------------------------------------- gated delta rule


def _gated_delta_rule_inputs(T, B, H, d, g, *, dv=None, feature_map="l2norm", **_):
    """q, k [T, B, H, d], v [T, B, H, dv], beta, the log-decays -softplus(N(0, 1)) (alpha from ~0.05
    to ~1), S0 [B, H, dv, d]. With the identity feature map the keys are scaled by 0.2."""
    dv = d if dv is None else dv
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [_randn(g, T, B, H, d), _randn(g, T, B, H, d, scale=k_scale), _randn(g, T, B, H, dv), _randn(g, T, B, H),
            -torch.nn.functional.softplus(_randn(g, T, B, H)), _randn(g, B, H, dv, d, scale=0.5)]


def _gated_delta_rule_extreme(inputs):
    """Logits of +-80, saturated betas, and gates that forget everything (log-decay -80: alpha = 2e-35,
    which the backward never divides by) on alternate steps, none (0) on the others."""
    q, k, _, beta, g, _ = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    beta[::2] = 80.0
    beta[1::2] = -80.0
    g[::2] = -80.0
    g[1::2] = 0.0


def _gated_delta_rule_rebuild(K, inputs, reset, *, feature_map="l2norm", **_):
    """S0 undone from S_T by division alone (one chunk, no budget): with log-decays scaled by 0.01
    (alpha >= ~0.95), so the round-off grows by at most e^(sum of the decays undone)."""
    q, k, v, beta, g, S0 = inputs
    g = 0.01 * g
    code = K.FMAP_CODES[feature_map]
    y, ST, records = K._forward(q, k, v, beta, g, S0, reset, fmap=code, store=True, anchor_every=q.shape[0] + 1)
    *_, rebuilt = K._backward(q, k, v, beta, g, S0, records, ST, torch.zeros_like(y), torch.zeros_like(ST),
                              fmap=code, full=True, rebuild=True, budget=float("inf"))
    return [(rebuilt, S0)]


# (dim, split, dtype) of the sm_90 builds: the head dims of the presets and the supported range, one
# program per (batch, head) and split; the l2norm map (the core's default).
GATED_DELTA_RULE_COMPILE_CASES = [(16, 1, "bf16"), (32, 1, "bf16"), (32, 1, "fp32"), (64, 1, "fp32"), (64, 1, "bf16"),
                                  (64, 2, "bf16"), (128, 1, "fp32"), (128, 8, "bf16")]
# The stack the backward at head dim 64 keeps under the register cap it takes from the delta rule's
# kernel (fused_recurrent.MAXNREG): 8 bytes on sm_90 with Triton 3.9 (uncapped: none; the delta rule's
# capped backward is allowed 32, DELTA_RULE_CAPPED_STACK_BYTES). Anything more, or any stack without
# a cap, fails.
GATED_DELTA_RULE_CAPPED_STACK_BYTES = 8


def _gated_delta_rule_io(dtype):
    io = {n: f"*{dtype}" for n in ("Q", "K", "V", "BETA", "G", "Y", "DY", "DQ", "DK_", "DV_")}
    io.update(RESET="*i8")
    return io


def _gated_delta_rule_sm90_builds(C):
    """The forward and backward kernels under the register cap their launches pass, at the values a
    launch at the benchmark's large shape passes (anchors every ANCHOR_EVERY steps, the default decay
    budget), and the feature-map backward of head dim 128 split 8 ways."""
    for dim, split, dtype in GATED_DELTA_RULE_COMPILE_CASES:
        bk, bv, fwd_warps, bwd_warps = C._block_sizes(dim, dim, split)
        common = dict(BK=bk, BV=bv, FMAP=C.FMAP_CODES["l2norm"], EPS=C._eps(C.FMAP_CODES["l2norm"]))
        ints = dict(LAUNCH_INTS, DK=dim, DV=dim, CHUNK=C.ANCHOR_EVERY)
        cap = C.register_cap_for(dim, dim)
        label = f"kernel for head dim {dim}, split {split} ({dtype}, register cap {cap})"
        yield (f"forward {label}", compile_sm90(C._forward_kernel, _gated_delta_rule_io(dtype),
                                               dict(common, STORE=True), fwd_warps, ints, cap), None)
        backward = dict(common, FULL=True, FUSE_FMAP=bv >= dim, WRITE_REBUILT=False)
        yield (f"backward {label}", compile_sm90(C._backward_kernel, _gated_delta_rule_io(dtype), backward, bwd_warps,
                                                dict(ints, BUDGET=C.DECAY_BUDGET), cap), None,
               GATED_DELTA_RULE_CAPPED_STACK_BYTES if cap else 0)
    rows = LAUNCH_INTS["T"] * LAUNCH_INTS["B"] * LAUNCH_INTS["H"]
    yield ("feature-map backward kernel for head dim 128 split 8",
           compile_sm90(C._feature_map_backward_kernel, {"X": "*bf16", "DX": "*bf16"},
                        dict(BD=128, FMAP=C.FMAP_CODES["l2norm"], EPS=1e-6), 1, dict(N=rows, NV=8, D=128)), None)


GATED_DELTA_RULE = Rule(
    name="gated_delta_rule",
    inputs=("q", "k", "v", "beta", "g", "S0"),
    outputs=("y", "S_T"),
    n_steps=5,
    n_state=1,
    make_inputs=_gated_delta_rule_inputs,
    reference=gated_delta_rule_reference,
    public=gated_delta_rule,
    cpu=gated_delta_rule_cpu,
    paths=(
        # one chunk at these T: S_{t-1} by division, replays at the episode starts
        Path("divide", taken=lambda K: K.ANCHOR_EVERY == 16 and K.DECAY_BUDGET == 4.0),
        # anchors every 3 steps (loaded at each chunk's start) and a budget of 0.5 (alpha >= 0.61 on
        # the steps undone by division): replays wherever the decays are strong
        Path("anchors-and-replays", patch=dict(ANCHOR_EVERY=3, DECAY_BUDGET=0.5), reversal_steps=12,
             taken=lambda K: K.ANCHOR_EVERY == 3),
    ),
    option_groups={"l2norm": (dict(feature_map="l2norm"),),
                   "other-maps": tuple(dict(feature_map=f) for f in ("elu1_sumnorm", "softmax", "identity"))},
    shapes=(
        *(Shape(f"H=2-{grad_mode}", T=5, B=2, H=2, d=16, options=dict(grad_mode=grad_mode)) for grad_mode in GRAD_MODES),
        Shape("dk=20-dv=24", T=4, B=1, H=2, d=20, sizes=dict(dv=24), losses=("all",)),
        # the largest head dim: four row blocks (the feature-map backward kernel adds their d phi)
        Shape("d=128", T=3, B=1, H=1, d=128, reset="alternating", losses=("all",),
              taken=lambda K: K._block_sizes(128, 128)[1] == 32),
    ),
    extreme=_gated_delta_rule_extreme,
    extreme_options=((dict(feature_map="l2norm"), True), (dict(feature_map="elu1_sumnorm"), True)),
    rebuild=_gated_delta_rule_rebuild,
    supports_inputs=(0, 1, 2),
    max_head_dim=128,
    bad_options=((dict(feature_map="dpfp-1"), "feature map"),),
    accepted_sizes=(dict(dv=24),),
    refused_sizes=((dict(d=16, dv=129), "value 129"),),
    mismatch=(1, "match"),
    error=r"FWRL_KERNELS=triton but no Triton gated delta rule kernel",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64, 128)),
    sm90_builds=_gated_delta_rule_sm90_builds,
    low_precision=(torch.bfloat16, torch.float16),
)


# --------------------------------------------------------------------------- Delta RNN


def _delta_rnn_inputs(T, B, H, d, g, *, feature_map="softmax", **_):
    """q, k, v, beta, kr, vr, betar, W0 [B, H, d, key features], R0 [B, H, d, d], h0. With the
    identity feature map the keys are scaled by 0.2 (the delta rule is then contractive)."""
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [_randn(g, T, B, H, d), _randn(g, T, B, H, d, scale=k_scale), _randn(g, T, B, H, d),
            _randn(g, T, B, H), _randn(g, T, B, H, d), _randn(g, T, B, H, d), _randn(g, T, B, H),
            _randn(g, B, H, d, _key_features(feature_map, d), scale=0.5),
            _randn(g, B, H, d, d, scale=0.5), _randn(g, B, H, d)]


def _delta_rnn_extreme(inputs):
    """Logits of +-80, saturated betas and a peaked recurrent softmax at step 0."""
    q, k, _, beta, kr, _, betar, _, _, h0 = inputs
    q[:, 0] = 80.0 * torch.sign(q[:, 0])
    k[:, 0] = -80.0
    k[2:4, 1] = 80.0
    kr[:, 1] = 80.0 * torch.sign(kr[:, 1])
    beta[::2] = 80.0
    beta[1::2] = -80.0
    betar[::2] = -80.0
    betar[1::2] = 80.0
    h0[0] = 80.0


def _delta_rnn_rebuild(K, inputs, reset, *, feature_map="softmax", **_):
    """W0 and R0, undone from W_T, R_T."""
    fmap = K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, RT, hT, records = K._forward(*inputs, reset, fmap=fmap, store=True)
    *_, rebuilt_W, rebuilt_R = K._backward(
        *inputs[:9], records, WT, RT, torch.zeros_like(y), torch.zeros_like(WT),
        torch.zeros_like(RT), torch.zeros_like(hT), fmap=fmap, full=True, rebuild=True)
    return [(rebuilt_W, inputs[7]), (rebuilt_R, inputs[8])]


def _sm90_pairs(C, name, cases, io_names, constexprs, label):
    """Forward and backward builds at the benchmark's large shape (T, B, H of LAUNCH_INTS; the
    head dims constant): ``constexprs(C, case)`` gives (forward, backward) constants and warps."""
    for case in cases:
        dtype = case[-1]
        io = {n: f"*{dtype}" for n in io_names}
        io.update(RESET="*i8", START="*i32")
        (fwd, fwd_warps), (bwd, bwd_warps) = constexprs(C, case)
        yield (f"{name} forward kernel for {label(case)}",
               compile_sm90(C._forward_kernel, io, fwd, fwd_warps, LAUNCH_INTS), None)
        yield (f"{name} backward kernel for {label(case)}",
               compile_sm90(C._backward_kernel, io, bwd, bwd_warps, LAUNCH_INTS), None)


def _delta_rnn_sm90_builds(C):
    """d = 16 and 32 with softmax keys, dpfp-1 keys at d = 32, and the largest head dim, 64;
    (d, key features, dtype)."""
    def constexprs(C, case):
        d, dk, _ = case
        bd, bk, fwd_warps, bwd_warps = C._block_sizes(d, dk)
        sizes = dict(D=d, DK=dk, BD=bd, BK=bk, FMAP=2, EPS=1e-5, REPS=1e-6)
        return (dict(sizes, STORE=True), fwd_warps), (dict(sizes, FULL=True, WRITE_REBUILT=False), bwd_warps)

    cases = [(16, 16, "bf16"), (32, 32, "fp32"), (32, 64, "bf16"), (32, 64, "fp32"), (64, 64, "bf16"),
             (64, 64, "fp32")]
    io = ("Q", "K", "V", "BETA", "KR", "VR", "BETAR", "Y", "DY", "DQ", "DK_", "DV", "DBETA", "DKR", "DVR",
          "DBETAR")
    yield from _sm90_pairs(C, "Delta RNN", cases, io, constexprs,
                           lambda c: f"d={c[0]}, key features {c[1]} ({c[2]})")


# The fast RNNs' (Delta RNN, RDN) feature maps: the option group of the matching test, and the maps
# the extreme-input test runs (True: compared with the reference, not only finite).
FAST_RNN_FEATURE_MAPS = {"feature_maps": tuple(dict(feature_map=f) for f in ("softmax", "elu1_sumnorm", "identity"))}
FAST_RNN_EXTREME_OPTIONS = ((dict(feature_map="softmax"), True), (dict(feature_map="elu1_sumnorm"), True))

DELTA_RNN = Rule(
    name="delta_rnn",
    inputs=("q", "k", "v", "beta", "kr", "vr", "betar", "W0", "R0", "h0"),
    outputs=("y", "W_T", "R_T", "h_T"),
    n_steps=7,
    n_state=3,
    make_inputs=_delta_rnn_inputs,
    reference=delta_rnn_reference,
    public=delta_rnn,
    cpu=delta_rnn_cpu,
    paths=(Path("registers"),),
    option_groups=FAST_RNN_FEATURE_MAPS,
    shapes=(
        Shape("d=12", T=5, B=2, H=2, d=12),
        Shape("d=12-dpfp-1", T=5, B=2, H=1, d=12, options=dict(feature_map="dpfp-1")),  # 24 key features
        # the largest head dim; the backward replays the one-step segment before t = 1 from W0, R0
        Shape("d=64", T=3, B=1, H=1, d=64, reset="alternating", losses=("all",)),
    ),
    extreme=_delta_rnn_extreme,
    extreme_options=FAST_RNN_EXTREME_OPTIONS,
    rebuild=_delta_rnn_rebuild,
    supports_inputs=(0, 1, 2, 4, 5),
    max_head_dim=64,
    bad_options=((dict(feature_map="relu"), "feature map"),),
    accepted_sizes=(),
    refused_sizes=((dict(d=32, feature_map="dpfp-2"), "128"),),  # 4 * 32 key features
    mismatch=(1, "match"),
    error="no Triton Delta RNN kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64)),
    sm90_builds=_delta_rnn_sm90_builds,
)


# --------------------------------------------------------------------------- Delta LSTM


def _delta_lstm_inputs(T, B, H, d, g, **_):
    """q, k, v, beta, W0, c0, y0 (six matrices per head, in naive.MATRICES' order)."""
    return [_randn(g, T, B, H, d), _randn(g, T, B, H, 6, d), _randn(g, T, B, H, 6, d), _randn(g, T, B, H, 6),
            _randn(g, B, H, 6, d, d, scale=0.5), _randn(g, B, H, d), _randn(g, B, H, d)]


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
    reference=delta_lstm_reference,
    public=delta_lstm,
    cpu=delta_lstm_cpu,
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
    supports_inputs=(0, 1, 2, 3, 4),
    max_head_dim=64,
    bad_options=(),
    accepted_sizes=(dict(d=33), dict(d=48)),  # the streamed kernels
    refused_sizes=(),
    mismatch=(1, "k has shape"),
    error="no Triton Delta LSTM kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 48, 64)),
    sm90_builds=_delta_lstm_sm90_builds,
)


# --------------------------------------------------------------------------- Recurrent Delta Net


def _rdn_inputs(T, B, H, d, g, *, feature_map="softmax", **_):
    """xq, xk, xv, xb, the recurrent weights Rq, Rk, Rv [H, d, d], rb [H, d] (std 1/sqrt(d)),
    W0 [B, H, d, d], h0. With the identity feature map the keys are scaled by 0.2."""
    r = d**-0.5
    k_scale = 0.2 if feature_map == "identity" else 1.0
    return [_randn(g, T, B, H, d), _randn(g, T, B, H, d, scale=k_scale), _randn(g, T, B, H, d),
            _randn(g, T, B, H), _randn(g, H, d, d, scale=r), _randn(g, H, d, d, scale=r),
            _randn(g, H, d, d, scale=r), _randn(g, H, d, scale=r), _randn(g, B, H, d, d, scale=0.5),
            _randn(g, B, H, d)]


def _rdn_extreme(inputs):
    """Pre-activations of +-80 and saturated betas."""
    xq, xk, _, xb = inputs[:4]
    xq[:, 0] = 80.0 * torch.sign(xq[:, 0])
    xk[:, 0] = -80.0
    xk[2:4, 1] = 80.0
    xb[::2] = 80.0
    xb[1::2] = -80.0


def _rdn_rebuild(K, inputs, reset, *, feature_map="softmax", **_):
    fmap = K.KERNEL_FEATURE_MAPS[feature_map]
    y, WT, hT, records = K._forward(*inputs, reset, fmap=fmap, store=True)
    *_, rebuilt = K._backward(*inputs, records, WT, y, torch.zeros_like(y), torch.zeros_like(WT),
                              torch.zeros_like(hT), fmap=fmap, full=True, rebuild=True)
    return [(rebuilt, inputs[8])]


def _rdn_sm90_builds(C):
    """The Atari defaults (d = 32 at hidden 128 / 4 heads and the larger config), d = 16 and
    the largest head dim, 64; s is recorded where y is rounded (fused_recurrent._keeps_s)."""
    def constexprs(C, case):
        d, dtype = case
        bd, fwd_warps, bwd_warps = C._block_sizes(d)
        sizes = dict(D=d, BD=bd, FMAP=2, KEEP_S=dtype != "fp32", EPS=1e-5)
        return (dict(sizes, STORE=True), fwd_warps), (dict(sizes, FULL=True, WRITE_REBUILT=False), bwd_warps)

    cases = [(16, "bf16"), (32, "fp32"), (32, "bf16"), (64, "bf16"), (64, "fp32")]
    io = ("XQ", "XK", "XV", "XB", "Y", "DY", "DXQ", "DXK", "DXV", "DXB")
    yield from _sm90_pairs(C, "RDN", cases, io, constexprs, lambda c: f"d={c[0]} ({c[1]})")


RDN = Rule(
    name="rdn",
    inputs=("xq", "xk", "xv", "xb", "Rq", "Rk", "Rv", "rb", "W0", "h0"),
    outputs=("y", "W_T", "h_T"),
    n_steps=4,
    n_state=2,
    make_inputs=_rdn_inputs,
    reference=rdn_reference,
    public=rdn,
    cpu=rdn_cpu,
    paths=(Path("registers"),),
    option_groups=FAST_RNN_FEATURE_MAPS,
    shapes=(
        Shape("d=12", T=5, B=2, H=2, d=12),
        # the largest head dim (registers laid out for d = 64); the backward replays the
        # one-step segment before the reset at t = 1
        Shape("d=64", T=3, B=1, H=1, d=64, reset="alternating", losses=("all",)),
    ),
    extreme=_rdn_extreme,
    extreme_options=FAST_RNN_EXTREME_OPTIONS,
    rebuild=_rdn_rebuild,
    supports_inputs=(0, 1, 2, 3, 4, 8),
    max_head_dim=64,
    bad_options=((dict(feature_map="dpfp-1"), "dpfp-1"),),
    accepted_sizes=(),
    refused_sizes=(),
    mismatch=(1, "match"),
    error="no Triton RDN kernel can run",
    cuda_sizes=tuple(dict(d=d) for d in (16, 32, 64)),
    sm90_builds=_rdn_sm90_builds,
)


# --------------------------------------------------------------------------- SRWM


def _srwm_inputs(T, B, H, d, g, *, dy=None, **_):
    """x, the slow weights W_y [H, dy, d], W_q, W_k [H, d, d], w_b [H, 4, d] (std 1/sqrt(d), as
    in the core) and non-zero offsets [B, ...] of each."""
    dy = d if dy is None else dy
    x = _randn(g, T, B, H, d)
    slow = [_randn(g, H, rows, d) / d**0.5 for rows in (dy, d, d, 4)]
    return [x, *slow, *(_randn(g, B, *w.shape, scale=0.3) for w in slow)]


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
    reference=srwm_reference,
    public=srwm,
    cpu=srwm_cpu,
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
    supports_inputs=(0, 1, 2, 3, 4),
    max_head_dim=64,
    bad_options=((dict(input_map="elu"), "input map"),),
    accepted_sizes=(dict(d=32, dy=97), dict(d=64, dy=193)),  # SR-DeltaNet; d = 64: the split path
    refused_sizes=((dict(d=65, dy=196), "at most 64"),),  # SR-DeltaNet at d = 65
    mismatch=(2, "W_q"),
    error="no Triton SRWM kernel can run",
    cuda_sizes=(dict(d=16), dict(d=16, dy=49), dict(d=32), dict(d=32, dy=97), dict(d=64), dict(d=64, dy=193)),
    sm90_builds=_srwm_sm90_builds,
    state_tuple=True,
    split_exact=False,  # the final offsets are W_T - S: rounded differently after two calls
)

RULES = (DELTA_RULE, GATED_DELTA_RULE, DELTA_RNN, DELTA_LSTM, RDN, SRWM)


# --------------------------------------------------------------------------- helpers


def _resets(T: int, B: int, pattern: str) -> torch.Tensor:
    """``kernel_harness.resets``, and ``alternating``: row b resets where t + b is odd (row 0
    at t = 1 only when T = 3: the backward replays the one-step segment before it)."""
    if pattern == "alternating":
        t, b = torch.meshgrid(torch.arange(T), torch.arange(B), indexing="ij")
        return (t + b) % 2 == 1
    return resets(T, B, pattern)


def _inputs(rule: Rule, T: int, B: int, H: int, /, d: int, *, seed: int, **sizes_and_options):
    return rule.make_inputs(T, B, H, d, torch.Generator().manual_seed(seed), **sizes_and_options)


def _flatten(outputs) -> Iterator[torch.Tensor]:
    if isinstance(outputs, (tuple, list)):
        for o in outputs:
            yield from _flatten(o)
    else:
        yield outputs


def _call(rule: Rule, fn: Callable, /, *inputs_and_reset, **kwargs) -> list[torch.Tensor]:
    """``fn`` (reference, Triton, CPU or public function) on the flat inputs, its outputs flat."""
    *args, reset = inputs_and_reset
    if rule.state_tuple:
        args[-rule.n_state:] = [tuple(args[-rule.n_state:])]
    return list(_flatten(fn(*args, reset, **kwargs)))


def _upstream(rule: Rule, inputs, reset, seed: int, losses: str = "all", /, **options) -> list:
    """Random gradients of the outputs (at the reference's output shapes); ``losses`` "y only"
    leaves the final state out of the loss, "state only" leaves y out."""
    with torch.no_grad():
        outs = _call(rule, rule.reference, *inputs, reset, **options)
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    if losses == "y only":
        return grads[:1] + [None] * (len(grads) - 1)
    if losses == "state only":
        return [None] + grads[1:]
    return grads


def _against_reference(rule: Rule, inputs, reset, *, seed: int, options: Mapping = {},
                       kernel_options: Mapping = {}, losses: str = "all", label: str = "", **tolerance):
    """The interpreted kernel's outputs and input gradients (fp32) match the reference's
    (float64) on the same inputs."""
    grads = _upstream(rule, inputs, reset, seed, losses, **options)
    ref = run_with_grads(functools.partial(_call, rule, rule.reference), inputs, reset, grads, **options)
    got = run_with_grads(functools.partial(_call, rule, rule.triton), inputs, reset, grads, torch.float32,
                         **options, **kernel_options)
    assert_all_close(rule.names, ref, got, label=f"{rule.name} {label}", **{**rule.tolerance, **tolerance})


def _take(rule: Rule, path: Path, monkeypatch) -> None:
    """Make the interpreted module run ``path`` for this test."""
    for name, value in path.patch.items():
        monkeypatch.setattr(rule.K, name, value)
    if path.taken is not None:
        assert path.taken(rule.K), f"{rule.name}: the {path.name} path is not the one taken"


def _params(*fields: str) -> list:
    """pytest params of (rule, path, group/options) combinations, with readable ids."""
    params = []
    for rule in RULES:
        for path in rule.paths:
            if fields == ("path",):
                params.append(pytest.param(rule, path, id=f"{rule.name}-{path.name}"))
            elif fields == ("path", "group"):
                params += [pytest.param(rule, path, group, id=f"{rule.name}-{path.name}-{group}")
                           for group in rule.option_groups]
            elif fields == ("path", "first options"):
                params += [pytest.param(rule, path, options, id=f"{rule.name}-{path.name}-{group}")
                           for group, options in rule.first_options()]
            elif fields == ("path", "dtype"):
                params += [pytest.param(rule, path, dtype, id=f"{rule.name}-{path.name}-{str(dtype)[6:]}")
                           for dtype in rule.low_precision]
    return params


BY_RULE = [pytest.param(rule, id=rule.name) for rule in RULES]


# =========================================================================== shared tests


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("rule,path,group", _params("path", "group"))
def test_matches_reference(rule, path, group, grad_mode, monkeypatch):
    """Values, final state and the gradient of every input, with resets nowhere, at the start,
    inside the sequence (the backward replays the segments before them) and at every step;
    the group's option settings taken by the reset cases in turn."""
    _take(rule, path, monkeypatch)
    settings = rule.option_groups[group]
    for i, (T, pattern) in enumerate(RESET_CASES):
        options = dict(settings[i % len(settings)], grad_mode=grad_mode)
        inputs = _inputs(rule, T, 2, 1, path.d, seed=T, **path.sizes, **options)
        _against_reference(rule, inputs, _resets(T, 2, pattern), seed=100 + T, options=options,
                           kernel_options=path.kernel_options, label=f"{path.name} T={T} resets={pattern} {options}")


@pytest.mark.parametrize("rule,shape", [pytest.param(rule, shape, id=f"{rule.name}-{shape.label}")
                                        for rule in RULES for shape in rule.shapes])
def test_odd_and_largest_head_dims_and_partial_losses(rule, shape):
    """Masked lanes of non-power-of-two head dims, the largest supported head dims, two heads,
    and losses of y alone or of the final state alone (the other incoming gradient absent)."""
    if shape.taken is not None:
        assert shape.taken(rule.K), f"{rule.name} {shape.label}: not the kernels the case is about"
    inputs = _inputs(rule, shape.T, shape.B, shape.H, shape.d, seed=shape.d, **shape.sizes, **shape.options)
    reset = _resets(shape.T, shape.B, shape.reset)
    for losses in shape.losses:
        _against_reference(rule, inputs, reset, seed=7, options=shape.options,
                           kernel_options=shape.kernel_options, losses=losses, label=f"{shape.label} {losses}")


@pytest.mark.parametrize("rule,path,options", _params("path", "first options"))
def test_split_sequence_equals_one_call(rule, path, options, monkeypatch):
    """Two calls, the second starting from the first's final state, give one call's outputs
    (bit for bit where ``split_exact``) and gradients. Row 0 resets two steps into the second
    call; row 1 carries the state through."""
    _take(rule, path, monkeypatch)
    T, T1 = 6, 2
    inputs = [t.float() for t in _inputs(rule, T, 2, 1, path.d, seed=8, **path.sizes, **options)]
    reset = torch.zeros(T, 2, dtype=torch.bool)
    reset[T1 + 2, 0] = True
    grads = [g.float() for g in _upstream(rule, inputs, reset, 3, **options)]
    kwargs = dict(options, **path.kernel_options)

    def loss_of(outs):
        return sum((o * g).sum() for o, g in zip(outs, grads))

    leaves = [t.clone().requires_grad_() for t in inputs]
    whole = _call(rule, rule.triton, *leaves, reset, **kwargs)
    d_whole = torch.autograd.grad(loss_of(whole), leaves, allow_unused=True)
    leaves = [t.clone().requires_grad_() for t in inputs]
    n, first_state = rule.n_steps, len(inputs) - rule.n_state
    steps, params, state = leaves[:n], leaves[n:first_state], leaves[first_state:]
    y1, *state1 = _call(rule, rule.triton, *(t[:T1] for t in steps), *params, *state, reset[:T1], **kwargs)
    y2, *state2 = _call(rule, rule.triton, *(t[T1:] for t in steps), *params, *state1, reset[T1:], **kwargs)
    split = [torch.cat([y1, y2]), *state2]
    d_split = torch.autograd.grad(loss_of(split), leaves, allow_unused=True)
    exact = dict(atol=0, rtol=0) if rule.split_exact else dict(atol=1e-6, rtol=1e-5)
    for name, a, b in zip(rule.outputs, whole, split):
        torch.testing.assert_close(b, a, **exact, msg=lambda m: f"{name}: {m}")
    for name, a, b in zip(rule.names[len(rule.outputs):], d_whole, d_split):
        if a is None or b is None:  # beta under the sum rule
            assert a is None and b is None, name
            continue
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("rule,path,options", _params("path", "first options"))
def test_reversal_rebuilds_the_initial_state(rule, path, options, monkeypatch):
    """Undoing the path's ``reversal_steps`` updates (100, or fewer where the interpreter is
    slow) from the fp32 records gives back the initial state (relative 1e-5)."""
    _take(rule, path, monkeypatch)
    T = path.reversal_steps
    inputs = [t.float() for t in _inputs(rule, T, 1, 1, path.d, seed=21, **path.sizes, **options)]
    pairs = rule.rebuild(rule.K, inputs, torch.zeros(T, 1, dtype=torch.bool), **options, **path.kernel_options)
    for rebuilt, initial in pairs:
        assert (rebuilt - initial).abs().max() <= 1e-5 * initial.abs().max()


@pytest.mark.parametrize("rule,path", _params("path"))
def test_extreme_inputs_stay_finite(rule, path, monkeypatch):
    """Inputs pushed to extremes (each rule's ``extreme``: logits of +-80, saturated rates):
    finite values and gradients that match the reference (atol 1e-4), or only finite ones
    where the settings make the values meaningless."""
    _take(rule, path, monkeypatch)
    T = 6
    reset = _resets(T, 2, "mid")
    for options, compared in rule.extreme_options:
        inputs = _inputs(rule, T, 2, 1, path.d, seed=13, **path.sizes, **options)
        rule.extreme(inputs)
        if compared:
            _against_reference(rule, inputs, reset, seed=2, options=options, kernel_options=path.kernel_options,
                               label=f"{path.name} {options}", atol=1e-4)
            continue
        grads = _upstream(rule, inputs, reset, 2, **options)
        got = run_with_grads(functools.partial(_call, rule, rule.triton), inputs, reset, grads, torch.float32,
                             **options, **path.kernel_options)
        for name, g in zip(rule.names, got):
            assert torch.isfinite(g).all(), f"{options}: {name} is not finite"


@pytest.mark.parametrize("rule,path,dtype", _params("path", "dtype"))
def test_low_precision_inputs(rule, path, dtype, monkeypatch):
    """Per-step inputs in bf16 (fp16) with the rest and the state in fp32, against the
    reference on the same rounded inputs: the state is fp32 from the same rounded inputs;
    y and the gradient of y (hence every input gradient) are rounded to the input dtype once."""
    _take(rule, path, monkeypatch)
    T, n = 5, rule.n_steps
    inputs = _inputs(rule, T, 2, 1, path.d, seed=4, **path.sizes)
    inputs[:n] = [t.to(dtype).double() for t in inputs[:n]]
    reset = _resets(T, 2, "mid")
    grads = _upstream(rule, inputs, reset, 9)
    ref = run_with_grads(functools.partial(_call, rule, rule.reference), inputs, reset, grads)
    leaves = [t.to(dtype if i < n else torch.float32).requires_grad_() for i, t in enumerate(inputs)]
    outs = _call(rule, rule.triton, *leaves, reset, **path.kernel_options)
    assert [o.dtype for o in outs] == [dtype] + [torch.float32] * (len(outs) - 1)
    d = torch.autograd.grad(sum((o.double() * g).sum() for o, g in zip(outs, grads)), leaves)
    assert [t.dtype for t in d] == [dtype] * n + [torch.float32] * (len(leaves) - n)
    for name, r, g in zip(rule.names, ref, [*outs, *d]):
        tolerance = STATE_TOLERANCE if name in rule.outputs[1:] else ROUNDED_TOLERANCE
        torch.testing.assert_close(g.double(), r, **tolerance, msg=lambda m: f"{dtype} {name}: {m}")


@pytest.mark.parametrize("rule,path", _params("path"))
def test_inference_path_and_determinism(rule, path, monkeypatch):
    """One step without autograd (nothing recorded) matches the reference; two backward passes
    on the same inputs give bit-identical gradients."""
    _take(rule, path, monkeypatch)
    T, n = 3, rule.n_steps
    inputs = [t.float() for t in _inputs(rule, T, 2, 1, path.d, seed=5, **path.sizes)]
    reset = _resets(T, 2, "mid")
    with torch.no_grad():
        got = _call(rule, rule.triton, *(t[:1] for t in inputs[:n]), *inputs[n:], reset[:1], **path.kernel_options)
        ref = _call(rule, rule.reference, *(t[:1].double() for t in inputs[:n]), *(t.double() for t in inputs[n:]),
                    reset[:1])
    assert_all_close(rule.outputs, ref, got, atol=1e-6, rtol=1e-5, label=f"{rule.name} one step")
    results = []
    for _ in range(2):
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs = _call(rule, rule.triton, *leaves, reset, **path.kernel_options)
        loss = outs[0].sum() + outs[1].square().sum() + sum(o.sum() for o in outs[2:])
        results.append(torch.autograd.grad(loss, leaves))
    for name, a, b in zip(rule.names[len(rule.outputs):], *results):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("rule", BY_RULE)
def test_supports_gives_reasons(rule, monkeypatch):
    """``supports`` accepts the table's shapes and names what it refuses (options, head dims
    beyond the largest, feature-map sizes, dtypes, mismatched shapes, no CUDA outside the
    interpreter, a module built for GPUs on CPU tensors); the Triton function raises on the
    options supports refuses."""
    K = rule.K

    def args(T=2, d=16, **sizes_and_options):
        inputs = [t.float() for t in _inputs(rule, T, 1, 1, d, seed=0, **sizes_and_options)]
        return [inputs[i] for i in rule.supports_inputs]

    x = args()
    assert K.supports(*x) is None  # the interpreter on CPU
    bad_options = ((dict(grad_mode="none"), "grad_mode"), *rule.bad_options)
    for options, words in bad_options:
        assert words in K.supports(*x, **options), options
    assert K.supports(*args(1, rule.max_head_dim)) is None
    too_big = K.supports(*args(1, rule.max_head_dim + 1))
    assert f"at most {rule.max_head_dim}" in too_big and str(rule.max_head_dim + 1) in too_big
    for sizes in rule.accepted_sizes:
        assert K.supports(*args(1, **sizes)) is None, sizes
    for sizes_and_options, words in rule.refused_sizes:
        options = {k: v for k, v in sizes_and_options.items() if k in ("feature_map", "input_map")}
        assert words in K.supports(*args(1, **sizes_and_options), **options), sizes_and_options
    assert "dtype" in K.supports(x[0].double(), *x[1:])
    position, words = rule.mismatch
    cut = list(x)
    cut[position] = cut[position][..., :8]
    assert words in K.supports(*cut)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(*x)
    compiled = load_kernel_module(rule.name, interpret=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "CUDA" in compiled.supports(*x)  # built for GPUs: no CPU runs
    inputs = [t.float() for t in _inputs(rule, 2, 1, 1, 16, seed=0)]
    reset = torch.zeros(2, 1, dtype=torch.bool)
    for options, _ in bad_options:
        (value,) = options.values()
        with pytest.raises(FwrlError, match=re.escape(repr(value))):
            _call(rule, rule.triton, *inputs, reset, **options)


@pytest.mark.parametrize("rule", BY_RULE)
def test_dispatch_on_cpu(rule, monkeypatch):
    """The public function: under ``FWRL_KERNELS=auto`` CPU tensors take the rule's CPU path
    (its outputs bit for bit, the reference's to round-off); under ``FWRL_KERNELS=triton``
    inputs no kernel runs on (CPU tensors outside the interpreter) raise the FwrlError."""
    monkeypatch.delenv("TRITON_INTERPRET")  # the public function imports the GPU build of the kernel
    inputs = [t.float() for t in _inputs(rule, 2, 1, 1, 16, seed=1)]
    reset = torch.zeros(2, 1, dtype=torch.bool)
    monkeypatch.setenv("FWRL_KERNELS", "auto")
    got = _call(rule, rule.public, *inputs, reset)
    for name, a, b in zip(rule.outputs, got, _call(rule, rule.cpu, *inputs, reset)):
        assert torch.equal(a, b), f"{name}: auto did not take the CPU path"
    assert_all_close(rule.outputs, _call(rule, rule.reference, *inputs, reset), got, atol=1e-6, rtol=1e-5,
                     label=rule.name)
    monkeypatch.setenv("FWRL_KERNELS", "triton")
    with pytest.raises(FwrlError, match=rule.error):
        _call(rule, rule.public, *inputs, reset)


@needs_compiling_triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rule,sizes", [
    pytest.param(rule, sizes, id=f"{rule.name}-" + "-".join(f"{k}={v}" for k, v in sizes.items()))
    for rule in RULES for sizes in rule.cuda_sizes])
def test_cuda_matches_reference(rule, sizes, monkeypatch):
    """On a GPU: the compiled kernels at rollout-like shapes, random resets, both grad modes and
    each option group's first setting."""
    monkeypatch.delenv("TRITON_INTERPRET")
    compiled = getattr(load_kernel_module(rule.name, interpret=False), f"{rule.name}_triton")
    T, B, H = 51, 4, 2
    d = sizes["d"]
    reset = torch.rand(T, B, generator=torch.Generator().manual_seed(d)) < 0.1
    reset[0, 0] = True
    for group, options in rule.first_options():
        inputs = _inputs(rule, T, B, H, seed=d, **sizes, **options)
        grads = _upstream(rule, inputs, reset, 1, **options)
        for grad_mode in GRAD_MODES:
            ref = run_with_grads(functools.partial(_call, rule, rule.reference), inputs, reset, grads,
                                 grad_mode=grad_mode, **options)
            got = run_with_grads(functools.partial(_call, rule, compiled), [t.cuda() for t in inputs], reset.cuda(),
                                 [g.cuda() for g in grads], torch.float32, grad_mode=grad_mode, **options)
            assert_all_close(rule.names, ref, [g.cpu() for g in got], **CUDA_TOLERANCE,
                             label=f"{rule.name} {sizes} {group} {grad_mode}")


@needs_compiling_triton
@pytest.mark.parametrize("rule", BY_RULE)
def test_compiles_for_sm90_without_spills(rule):
    """Compile only (no GPU needed): every shipped configuration of the rule's kernels builds
    for sm_90 with the arguments a launch passes, without spilling registers (a build may name
    the stack bytes it is allowed, as a 4th item, where a register cap measured to pay keeps
    some: the delta rule's backward) (and passes the
    rule's own check of its build, where it has one). Every build is made before the test
    fails, so one run names every spilling build."""
    skip_without_sm90_toolchain()
    spills = []
    for label, build, check, *stack_allowed in rule.sm90_builds(load_kernel_module(rule.name, interpret=False)):
        stack, local = stack_and_local_bytes(build)
        if stack > sum(stack_allowed) or local:
            spills.append(f"{label}: stack {stack} B (allowed {sum(stack_allowed)}), local {local} B")
        if check is not None:
            check(build)
    assert not spills, f"{rule.name} builds that spill registers:\n" + "\n".join(spills)


# =========================================================================== delta rule only

_DR = DELTA_RULE.K


@pytest.mark.parametrize("dk,dv,split,rule,feature_map,T,H,reset", [
    (20, 24, 2, rule, fmap, 4, 2, "mid") for rule in ("delta", "sum") for fmap in ("elu1_sumnorm", "softmax")
] + [(64, 64, 4, "delta", "softmax", 3, 1, "alternating"), (32, 32, 8, "delta", "softmax", 3, 1, "alternating")])
def test_delta_rule_rows_split_over_programs(dk, dv, split, rule, feature_map, T, H, reset):
    """W's rows over ``split`` programs per (batch, head) (Dk != Dv odd sizes, a partly masked
    last block; 16 and 4 rows each at 64 and 32), the dq / dk partials (and the feature-map
    backward) added afterwards: the reference's values and gradients, with resets."""
    assert -(-dv // _DR._block_sizes(dk, dv, split)[1]) == split
    options = dict(rule=rule, feature_map=feature_map)
    inputs = _inputs(DELTA_RULE, T, 1, H, dk, seed=dk, dv=dv, **options)
    _against_reference(DELTA_RULE, inputs, _resets(T, 1, reset), seed=dk, options=options,
                       kernel_options=dict(split=split), label=f"dk={dk} dv={dv} split={split} {options}")


def test_delta_rule_auto_split_fills_the_sms(monkeypatch):
    """auto: the fewest programs per (batch, head) that give one per SM (132 on an H100),
    keeping at least 16 rows each; 1 off CUDA."""

    class H100:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: H100)
    cuda = torch.device("cuda")
    assert _DR.choose_split("auto", 32 * 4, 32, cuda) == 2  # 128 programs < 132
    assert _DR.choose_split("auto", 32 * 8, 32, cuda) == 1  # 256 already
    assert _DR.choose_split("auto", 8 * 2, 64, cuda) == 4  # 16 -> 64 programs, 16 rows each
    assert _DR.choose_split("auto", 32 * 4, 16, cuda) == 1  # 8 rows would be too few
    assert _DR.choose_split("auto", 32 * 4, 32, torch.device("cpu")) == 1
    assert _DR.choose_split(4, 32 * 8, 32, cuda) == 4
    with pytest.raises(Exception, match="split"):
        _DR.choose_split(3, 1, 32, cuda)


@pytest.mark.parametrize("rule", ["delta", "sum"])
def test_delta_rule_dpfp_of_zero_keys_stays_finite(rule):
    """dpfp of all-zero keys is all zero (sum-normalised: 0 / (0 + eps)), applied outside the
    kernel; only y in the loss."""
    T = 6
    options = dict(rule=rule, feature_map="dpfp-1")
    inputs = _inputs(DELTA_RULE, T, 2, 1, 16, seed=13, **options)
    inputs[1] = torch.zeros_like(inputs[1])
    _against_reference(DELTA_RULE, inputs, _resets(T, 2, "mid"), seed=2, options=options, losses="y only",
                       label="dpfp zero keys")


def test_delta_rule_backward_memory_follows_from_shapes():
    """What the forward keeps for backward has the same sizes whatever the resets (no
    pre-reset states sized by a count read from the device)."""
    T = 6
    inputs = [x.float() for x in _inputs(DELTA_RULE, T, 2, 1, 16, seed=6)]
    kept = {}
    for pattern in ("none", "mid", "everywhere"):
        *_, records = _DR._forward(*inputs, _resets(T, 2, pattern), delta=True, fmap=1, store=True)
        kept[pattern] = [tuple(r.shape) for r in records]
        assert sum(r.numel() for r in records) == T * 2 * (1 + 1 + 16)  # reset, start, r
    assert kept["none"] == kept["mid"] == kept["everywhere"]


def test_delta_rule_replay_starts():
    """Per (t, b): for a reset at t >= 1, the start of the segment that ends at t - 1 (the
    last reset before t, or 0); -1 elsewhere. Against the definition, on random resets."""
    reset = torch.rand(40, 5, generator=torch.Generator().manual_seed(0)) < 0.3
    reset[0, 0] = True
    expected = torch.full(reset.shape, -1, dtype=torch.int32)
    for b in range(reset.shape[1]):
        last = 0
        for t in range(reset.shape[0]):
            if t >= 1 and reset[t, b]:
                expected[t, b] = last
            if reset[t, b]:
                last = t
    assert torch.equal(_DR.replay_starts(reset), expected)


@needs_compiling_triton
def test_delta_rule_compile_checks_specialise_as_the_launcher():
    """The sm_90 checks compile the kernel a launch compiles: the harness's signature,
    constants and attributes equal those of Triton's own launcher path (the binder of
    ``JITFunction.run`` and ``_pack_args``) for the same argument values; DK, DV and B
    divisible by 16 are marked so, T = H = 1 become constants."""
    skip_without_sm90_toolchain()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature

    kernel = load_kernel_module("delta_rule", interpret=False)._backward_kernel
    target = GPUTarget("cuda", 90, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    io = {"Q": "*bf16", "RESET": "*i8", "START": "*i32"}
    dtypes = {"*bf16": torch.bfloat16, "*i8": torch.int8, "*i32": torch.int32}
    constexprs = dict(BK=64, BV=64, FMAP=1, DELTA=True, FULL=True, FUSE_FMAP=True, WRITE_REBUILT=False,
                      EPS=1e-5)
    for ints in (dict(LAUNCH_INTS, DK=64, DV=64), dict(T=1, B=3, H=1, DK=20, DV=48)):
        args = [ints[n] if n in ints else MockTensor(dtypes.get(io.get(n), torch.float32))
                for n in kernel.arg_names if n not in constexprs]
        launch = dict(constexprs, num_warps=8, enable_fp_fusion=True)  # as launch_options gives
        bound, specialization, options = binder(*args, **launch)
        _, signature, consts, attrs = kernel._pack_args(backend, launch, bound, specialization, options)
        ours = launch_specialisation(kernel, target, io, constexprs, ints)
        assert ours[0] == signature, ints
        assert {(kernel.arg_names.index(k),): v for k, v in ours[1].items()} == consts, ints
        assert ours[2] == attrs, ints
        divisible = {n for n in ints if attrs[(kernel.arg_names.index(n),)] == [["tt.divisibility", 16]]}
        assert divisible == ({"B", "DK", "DV"} if ints["T"] > 1 else {"DV"}), ints
        assert ("T" in ours[1]) == (ints["T"] == 1)


@needs_compiling_triton
def test_delta_rule_register_cap_reaches_the_compiled_kernel():
    """Launches cap registers at 128 from head dim 64 on (``register_cap_for``), and
    ``common.register_cap`` (``fwrl bench kernels --maxnreg``) changes the binary: the
    backward the H100 timed at the large shape (d = 64, split 1, fp32, 8 warps) takes 159
    registers by default and fits 128 without spilling (two programs per SM)."""
    skip_without_sm90_toolchain()
    C = load_kernel_module("delta_rule", interpret=False)
    assert [C.register_cap_for(d, d) for d in (16, 32, 64, 128)] == [None, None, 128, 128]
    common = C.launch_options.__globals__  # the common module of the same package copy
    bk, bv, _, bwd_warps = C._block_sizes(64, 64, 1)
    constexprs = dict(BK=bk, BV=bv, FMAP=1, DELTA=True, EPS=1e-5, FULL=True, FUSE_FMAP=True, WRITE_REBUILT=False)

    def backward():
        return compile_sm90(C._backward_kernel, _delta_rule_io("fp32"), constexprs, bwd_warps,
                            dict(LAUNCH_INTS, DK=64, DV=64))

    assert registers(backward()) > 128
    with common["register_cap"](128):
        capped = backward()
    assert registers(capped) <= 128 and stack_and_local_bytes(capped) == (0, 0)


# =========================================================================== RDN only


def test_rdn_rebuilt_s_in_chunks(monkeypatch):
    """With y in fp32, s_t is not recorded: the dR GEMM rebuilds it from y (h_0 at t = 0,
    zero after a reset) one chunk at a time. Chunks of one and of three steps (the last one
    short) give the reference's gradients, and the records hold 2d + 1 floats per step
    (3d + 1 with a bf16 y, which is rounded: s is recorded)."""
    K, T, d = RDN.K, 7, 16
    inputs = _inputs(RDN, T, 2, 2, d, seed=5)
    reset = _resets(T, 2, "mid")
    step_bytes = 2 * 2 * d * 4
    for steps in (1, 3):
        monkeypatch.setattr(K, "S_CHUNK_BYTES", steps * step_bytes)
        _against_reference(RDN, inputs, reset, seed=9, label=f"chunks of {steps} steps")
    *_, (_, _, rec) = K._forward(*(t.float() for t in inputs), reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 2 * d + 1)
    bf16 = [t.bfloat16() if i < RDN.n_steps else t.float() for i, t in enumerate(inputs)]
    *_, (_, _, rec) = K._forward(*bf16, reset, fmap=2, store=True)
    assert rec.shape == (T, 2, 2, 3 * d + 1), "a bf16 y is rounded: s is recorded"


# =========================================================================== SRWM only


def test_srwm_split_path_choice():
    """The register path wherever WARPS has the block shape (SR-DeltaNet up to d = 32), the
    split path beyond (SPLIT_ROWS rows per program); a forced row count must be a power of two."""
    K = SRWM.K
    assert K._split_rows(32, 97, None) is None and K._split_rows(33, 100, None) == K.SPLIT_ROWS
    assert K._split_rows(16, 49, 4) == 4
    with pytest.raises(ValueError, match="power of two"):
        K._split_rows(16, 49, 3)
