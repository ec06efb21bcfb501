"""What every rule's kernel tests share (``tests/interpreter/test_kernels_<rule>.py``, one file per rule).

Each rule's file holds its row of the table, a :class:`Rule` (``fwrl/kernels/<rule>/``): how to make its
inputs at a shape (float64, in the reference's argument order: the per-step inputs first, the initial state
last), its output names, its paths (the ways its kernels run, e.g. the Delta LSTM's register and streamed
kernels), its option groups, its odd/largest head-dim cases, how to push its inputs to extremes, how to
rebuild its initial state by reversal, what ``supports`` must refuse, its CUDA shapes and its shipped sm_90
builds; the checks only that rule has follow it. The upstream gradients of a case are drawn at the shapes
the reference returns, so the table holds no gradient makers.

This module holds the table's types, the helpers and the shared tests, which each rule's file imports and
parametrizes for its rule (``pytest_generate_tests = parametrize_for(RULE)``): values, final state and every
input gradient match the reference; odd and largest head dims, with partial losses; a sequence split in two
calls equals one call; reversal rebuilds the initial state; extreme inputs stay finite; low-precision inputs;
the one-step inference path and determinism; ``supports`` gives reasons and the public function dispatches;
CUDA matches the reference (skipped without a GPU); the shipped configurations compile for sm_90 without
spills (compile only, ``needs_compiling_triton``). (The rule files' names match ``tests/*/test_kernels_*.py``,
whose CUDA and sm_90 tests ``benchmarks/gpu/suite.py`` runs on GPUs.)

The kernels run on CPU through the Triton interpreter: each rule's ``fused_recurrent`` is loaded from a
private copy of ``fwrl.kernels`` built for the interpreter, and the autouse ``_interpret`` fixture (each rule
file imports it) sets ``TRITON_INTERPRET=1`` per test (``kernel_harness.py``). Shapes are tiny because the
interpreter costs milliseconds per program per step.

To add a rule: a ``tests/interpreter/test_kernels_<rule>.py`` with its ``Rule`` (and its ``rule_inputs``,
``_extreme``, ``_rebuild``, ``_sm90_builds``), the shared tests imported and ``pytest_generate_tests``, as
the other rule files have them (``from kernel_rule_tests import *`` takes the shared tests, ``__all__``);
every shared test then covers it.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels import GRAD_MODES
from fwrl.kernels.dispatch import kernel_inputs
from kernel_harness import (
    LAUNCH_INTS,
    assert_all_close,
    compile_sm90,
    load_kernel_module,
    needs_compiling_triton,
    resets,
    run_with_grads,
    skip_without_sm90_toolchain,
    stack_and_local_bytes,
)

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
    paths: tuple[Path, ...]
    # options of the reference comparisons: per group (a test each), the settings are taken by
    # the reset cases in turn; tests of one setting take each group's first
    option_groups: Mapping[str, tuple[Mapping, ...]]
    shapes: tuple[Shape, ...]
    extreme: Callable[[list[torch.Tensor]], None]  # pushes (B = 2) inputs to extremes, in place
    extreme_options: tuple[tuple[Mapping, bool], ...]  # (options, compared: else finite only)
    rebuild: Callable[..., list[tuple[torch.Tensor, torch.Tensor]]]  # (K, inputs, reset, **opts)
    max_head_dim: int
    bad_options: tuple[tuple[Mapping, str], ...]  # (options, words of supports' reason)
    accepted_sizes: tuple[Mapping, ...]  # other sizes supports accepts
    refused_sizes: tuple[tuple[Mapping, str], ...]  # (sizes and options, words of the reason)
    mismatch: tuple[int, str]  # (input cut to 8 features, words of supports' reason)
    error: str  # the FwrlError of FWRL_KERNELS=triton on inputs no kernel runs on (a regex)
    cuda_sizes: tuple[Mapping, ...]
    sm90_builds: Callable[[ModuleType], Iterator[tuple]]  # yields (label, build, check or None[, stack bytes allowed])
    low_precision: tuple[torch.dtype, ...] = (torch.bfloat16,)
    state_tuple: bool = False  # the state goes in and out as one tuple argument (the SRWM)
    split_exact: bool = True  # a sequence split in two calls gives bit-identical outputs
    tolerance: Mapping = field(default_factory=lambda: dict(atol=2e-5, rtol=1e-4))

    @property
    def package(self) -> ModuleType:
        """``fwrl.kernels.<rule>``: its ``RULE`` (the reference, the CPU path) and its public function."""
        return importlib.import_module(f"fwrl.kernels.{self.name}")

    @property
    def reference(self) -> Callable:
        return self.package.RULE.reference

    @property
    def cpu(self) -> Callable:
        return self.package.RULE.cpu

    @property
    def public(self) -> Callable:
        """``fwrl.kernels.<rule>.<rule>``, the dispatching function."""
        return getattr(self.package, self.name)

    @property
    def K(self) -> ModuleType:
        """The interpreted ``fused_recurrent`` module."""
        return _interpreted(self.name)

    @property
    def triton(self) -> Callable:
        return getattr(self.K, f"{self.name}_triton")

    @property
    def names(self) -> tuple[str, ...]:
        return self.outputs + tuple(f"d{name}" for name in self.inputs)

    def first_options(self) -> list[tuple[str, Mapping]]:
        return [(group, settings[0]) for group, settings in self.option_groups.items()]



@functools.cache
def _interpreted(name: str) -> ModuleType:
    """Rule ``name``'s ``fused_recurrent`` built for the interpreter (loaded once)."""
    return load_kernel_module(name, interpret=True)


def randn(g, *shape, scale=1.0):
    return scale * torch.randn(*shape, generator=g, dtype=torch.float64)


def key_features(feature_map: str, d: int) -> int:
    """Features per key of ``feature_map`` (dpfp-n: 2 n d)."""
    return {"dpfp-1": 2, "dpfp-2": 4, "dpfp-3": 6}.get(feature_map, 1) * d


def sm90_pairs(C, name, cases, io_names, constexprs, label):
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


# The fast RNNs' (Delta RNN, RDN) feature maps: the option group of the matching test, and the maps
# the extreme-input test runs (True: compared with the reference, not only finite).
FAST_RNN_FEATURE_MAPS = {"feature_maps": tuple(dict(feature_map=f) for f in ("softmax", "elu1_sumnorm", "identity"))}
FAST_RNN_EXTREME_OPTIONS = ((dict(feature_map="softmax"), True), (dict(feature_map="elu1_sumnorm"), True))

# --------------------------------------------------------------------------- helpers


def reset_pattern(T: int, B: int, pattern: str) -> torch.Tensor:
    """``kernel_harness.resets``, and ``alternating``: row b resets where t + b is odd (row 0
    at t = 1 only when T = 3: the backward replays the one-step segment before it)."""
    if pattern == "alternating":
        t, b = torch.meshgrid(torch.arange(T), torch.arange(B), indexing="ij")
        return (t + b) % 2 == 1
    return resets(T, B, pattern)


def rule_inputs(rule: Rule, T: int, B: int, H: int, /, d: int, *, seed: int, **sizes_and_options):
    return rule.make_inputs(T, B, H, d, torch.Generator().manual_seed(seed), **sizes_and_options)


def _flatten(outputs) -> Iterator[torch.Tensor]:
    if isinstance(outputs, (tuple, list)):
        for o in outputs:
            yield from _flatten(o)
    else:
        yield outputs


def _reference_layout(rule: Rule, inputs_and_reset: list) -> list:
    """The flat inputs and reset as the reference takes them (the SRWM's state as one tuple)."""
    *args, reset = inputs_and_reset
    if rule.state_tuple:
        args[-rule.n_state:] = [tuple(args[-rule.n_state:])]
    return [*args, reset]


def _call(rule: Rule, fn: Callable, /, *inputs_and_reset, **kwargs) -> list[torch.Tensor]:
    """``fn`` (reference, Triton, CPU or public function) on the flat inputs, its outputs flat."""
    return list(_flatten(fn(*_reference_layout(rule, list(inputs_and_reset)), **kwargs)))


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


def against_reference(rule: Rule, inputs, reset, *, seed: int, options: Mapping = {},
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


def _params(rule: Rule, *fields: str) -> list:
    """pytest params of ``rule``'s (rule, path, group/options) combinations, with readable ids."""
    params = []
    if True:
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



# The shared tests' parameters for one rule, in the order they are applied (so the ids read
# rule-path-...-grad_mode, as the parametrize decorators of one table gave them).
PARAMETERS: dict[str, Callable[[Rule], list[tuple[str, list]]]] = {
    "test_matches_reference": lambda rule: [("rule,path,group", _params(rule, "path", "group")),
                                            ("grad_mode", list(GRAD_MODES))],
    "test_odd_and_largest_head_dims_and_partial_losses": lambda rule: [
        ("rule,shape", [pytest.param(rule, shape, id=f"{rule.name}-{shape.label}") for shape in rule.shapes])],
    "test_split_sequence_equals_one_call": lambda rule: [("rule,path,options", _params(rule, "path", "first options"))],
    "test_reversal_rebuilds_the_initial_state": lambda rule: [
        ("rule,path,options", _params(rule, "path", "first options"))],
    "test_extreme_inputs_stay_finite": lambda rule: [("rule,path", _params(rule, "path"))],
    "test_low_precision_inputs": lambda rule: [("rule,path,dtype", _params(rule, "path", "dtype"))],
    "test_inference_path_and_determinism": lambda rule: [("rule,path", _params(rule, "path"))],
    "test_supports_gives_reasons": lambda rule: [("rule", [pytest.param(rule, id=rule.name)])],
    "test_dispatch_on_cpu": lambda rule: [("rule", [pytest.param(rule, id=rule.name)])],
    "test_cuda_matches_reference": lambda rule: [("rule,sizes", [
        pytest.param(rule, sizes, id=f"{rule.name}-" + "-".join(f"{k}={v}" for k, v in sizes.items()))
        for sizes in rule.cuda_sizes])],
    "test_compiles_for_sm90_without_spills": lambda rule: [("rule", [pytest.param(rule, id=rule.name)])],
}
SHARED_TESTS = tuple(PARAMETERS)
# What a rule's file takes with ``from kernel_rule_tests import *``: the shared tests, to be collected there.
__all__ = list(SHARED_TESTS)


def parametrize_for(rule: Rule) -> Callable[[pytest.Metafunc], None]:
    """The ``pytest_generate_tests`` of ``rule``'s test file: the shared tests it imports run on
    ``rule`` (its own tests keep their decorators)."""
    def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
        for argnames, params in PARAMETERS.get(metafunc.function.__name__, lambda _: [])(rule):
            metafunc.parametrize(argnames, params)

    return pytest_generate_tests


# =========================================================================== shared tests


def test_matches_reference(rule, path, group, grad_mode, monkeypatch):
    """Values, final state and the gradient of every input, with resets nowhere, at the start,
    inside the sequence (the backward replays the segments before them) and at every step;
    the group's option settings taken by the reset cases in turn."""
    _take(rule, path, monkeypatch)
    settings = rule.option_groups[group]
    for i, (T, pattern) in enumerate(RESET_CASES):
        options = dict(settings[i % len(settings)], grad_mode=grad_mode)
        inputs = rule_inputs(rule, T, 2, 1, path.d, seed=T, **path.sizes, **options)
        against_reference(rule, inputs, reset_pattern(T, 2, pattern), seed=100 + T, options=options,
                           kernel_options=path.kernel_options, label=f"{path.name} T={T} resets={pattern} {options}")


def test_odd_and_largest_head_dims_and_partial_losses(rule, shape):
    """Masked lanes of non-power-of-two head dims, the largest supported head dims, two heads,
    and losses of y alone or of the final state alone (the other incoming gradient absent)."""
    if shape.taken is not None:
        assert shape.taken(rule.K), f"{rule.name} {shape.label}: not the kernels the case is about"
    inputs = rule_inputs(rule, shape.T, shape.B, shape.H, shape.d, seed=shape.d, **shape.sizes, **shape.options)
    reset = reset_pattern(shape.T, shape.B, shape.reset)
    for losses in shape.losses:
        against_reference(rule, inputs, reset, seed=7, options=shape.options,
                           kernel_options=shape.kernel_options, losses=losses, label=f"{shape.label} {losses}")


def test_split_sequence_equals_one_call(rule, path, options, monkeypatch):
    """Two calls, the second starting from the first's final state, give one call's outputs
    (bit for bit where ``split_exact``) and gradients. Row 0 resets two steps into the second
    call; row 1 carries the state through."""
    _take(rule, path, monkeypatch)
    T, T1 = 6, 2
    inputs = [t.float() for t in rule_inputs(rule, T, 2, 1, path.d, seed=8, **path.sizes, **options)]
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


def test_reversal_rebuilds_the_initial_state(rule, path, options, monkeypatch):
    """Undoing the path's ``reversal_steps`` updates (100, or fewer where the interpreter is
    slow) from the fp32 records gives back the initial state (relative 1e-5)."""
    _take(rule, path, monkeypatch)
    T = path.reversal_steps
    inputs = [t.float() for t in rule_inputs(rule, T, 1, 1, path.d, seed=21, **path.sizes, **options)]
    pairs = rule.rebuild(rule.K, inputs, torch.zeros(T, 1, dtype=torch.bool), **options, **path.kernel_options)
    for rebuilt, initial in pairs:
        assert (rebuilt - initial).abs().max() <= 1e-5 * initial.abs().max()


def test_extreme_inputs_stay_finite(rule, path, monkeypatch):
    """Inputs pushed to extremes (each rule's ``extreme``: logits of +-80, saturated rates):
    finite values and gradients that match the reference (atol 1e-4), or only finite ones
    where the settings make the values meaningless."""
    _take(rule, path, monkeypatch)
    T = 6
    reset = reset_pattern(T, 2, "mid")
    for options, compared in rule.extreme_options:
        inputs = rule_inputs(rule, T, 2, 1, path.d, seed=13, **path.sizes, **options)
        rule.extreme(inputs)
        if compared:
            against_reference(rule, inputs, reset, seed=2, options=options, kernel_options=path.kernel_options,
                               label=f"{path.name} {options}", atol=1e-4)
            continue
        grads = _upstream(rule, inputs, reset, 2, **options)
        got = run_with_grads(functools.partial(_call, rule, rule.triton), inputs, reset, grads, torch.float32,
                             **options, **path.kernel_options)
        for name, g in zip(rule.names, got):
            assert torch.isfinite(g).all(), f"{options}: {name} is not finite"


def test_low_precision_inputs(rule, path, dtype, monkeypatch):
    """Per-step inputs in bf16 (fp16) with the rest and the state in fp32, against the
    reference on the same rounded inputs: the state is fp32 from the same rounded inputs;
    y and the gradient of y (hence every input gradient) are rounded to the input dtype once."""
    _take(rule, path, monkeypatch)
    T, n = 5, rule.n_steps
    inputs = rule_inputs(rule, T, 2, 1, path.d, seed=4, **path.sizes)
    inputs[:n] = [t.to(dtype).double() for t in inputs[:n]]
    reset = reset_pattern(T, 2, "mid")
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


def test_inference_path_and_determinism(rule, path, monkeypatch):
    """One step without autograd (nothing recorded) matches the reference; two backward passes
    on the same inputs give bit-identical gradients."""
    _take(rule, path, monkeypatch)
    T, n = 3, rule.n_steps
    inputs = [t.float() for t in rule_inputs(rule, T, 2, 1, path.d, seed=5, **path.sizes)]
    reset = reset_pattern(T, 2, "mid")
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


def test_supports_gives_reasons(rule, monkeypatch):
    """``supports`` accepts the table's shapes and names what it refuses (options, head dims
    beyond the largest, feature-map sizes, dtypes, mismatched shapes, no CUDA outside the
    interpreter, a module built for GPUs on CPU tensors), reading a call's arguments by the
    reference's parameter names; the Triton function raises on the options supports refuses."""
    K = rule.K
    reset = torch.zeros(2, 1, dtype=torch.bool)

    def args(T=2, d=16, **sizes_and_options):
        return [t.float() for t in rule_inputs(rule, T, 1, 1, d, seed=0, **sizes_and_options)]

    def call(inputs, **options):
        """The call's arguments by name (``dispatch.kernel_inputs``), as dispatch hands them to supports."""
        layout = _reference_layout(rule, [*inputs, reset[:inputs[0].shape[0]]])
        return kernel_inputs(rule.reference, tuple(layout), options)

    x = args()
    assert K.supports(call(x)) is None  # the interpreter on CPU
    bad_options = ((dict(grad_mode="none"), "grad_mode"), *rule.bad_options)
    for options, words in bad_options:
        assert words in K.supports(call(x, **options)), options
    assert K.supports(call(args(1, rule.max_head_dim))) is None
    too_big = K.supports(call(args(1, rule.max_head_dim + 1)))
    assert f"at most {rule.max_head_dim}" in too_big and str(rule.max_head_dim + 1) in too_big
    for sizes in rule.accepted_sizes:
        assert K.supports(call(args(1, **sizes))) is None, sizes
    for sizes_and_options, words in rule.refused_sizes:
        options = {k: v for k, v in sizes_and_options.items() if k in ("feature_map", "input_map")}
        assert words in K.supports(call(args(1, **sizes_and_options), **options)), sizes_and_options
    assert "dtype" in K.supports(call([x[0].double(), *x[1:]]))
    position, words = rule.mismatch
    cut = list(x)
    cut[position] = cut[position][..., :8]
    assert words in K.supports(call(cut))
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "CUDA" in K.supports(call(x))
    compiled = load_kernel_module(rule.name, interpret=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "CUDA" in compiled.supports(call(x))  # built for GPUs: no CPU runs
    inputs = [t.float() for t in rule_inputs(rule, 2, 1, 1, 16, seed=0)]
    for options, _ in bad_options:
        (value,) = options.values()
        with pytest.raises(FwrlError, match=re.escape(repr(value))):
            _call(rule, rule.triton, *inputs, reset, **options)


def test_dispatch_on_cpu(rule, monkeypatch):
    """The public function: under ``FWRL_KERNELS=auto`` CPU tensors take the rule's CPU path
    (its outputs bit for bit, the reference's to round-off); under ``FWRL_KERNELS=triton``
    inputs no kernel runs on (CPU tensors outside the interpreter) raise the FwrlError."""
    monkeypatch.delenv("TRITON_INTERPRET")  # the public function imports the GPU build of the kernel
    inputs = [t.float() for t in rule_inputs(rule, 2, 1, 1, 16, seed=1)]
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
        inputs = rule_inputs(rule, T, B, H, seed=d, **sizes, **options)
        grads = _upstream(rule, inputs, reset, 1, **options)
        for grad_mode in GRAD_MODES:
            ref = run_with_grads(functools.partial(_call, rule, rule.reference), inputs, reset, grads,
                                 grad_mode=grad_mode, **options)
            got = run_with_grads(functools.partial(_call, rule, compiled), [t.cuda() for t in inputs], reset.cuda(),
                                 [g.cuda() for g in grads], torch.float32, grad_mode=grad_mode, **options)
            assert_all_close(rule.names, ref, [g.cpu() for g in got], **CUDA_TOLERANCE,
                             label=f"{rule.name} {sizes} {group} {grad_mode}")


@needs_compiling_triton
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

