"""Every rule's CPU path (``fwrl/kernels/<rule>/cpu.py``) against its PyTorch reference (``naive.py``).

One table of rules; each is checked the same way:

- float64, forward and the gradient of every input (each output weighted by its own random
  tensor, so every output's gradient path counts), with episode starts nowhere, at step 0, in
  the middle (one row once, another on consecutive steps) and everywhere, in both grad modes,
  over one step, a short unroll and one longer than a chunk: equal to 1e-9;
- float32 against the float64 reference, to float32 round-off;
- without autograd (acting: one step, and several) the same outputs as with it;
- a sequence cut in two calls, the state carried, equals one call;
- the dispatch: CPU tensors take the CPU path by default and the reference under
  ``FWRL_KERNELS=reference``.

Beyond the table, the gated delta rule's hand-derived backward (which the public function takes in
grad mode step and on one step; full over several steps learns in chunked form) over whole sequences
in both grad modes, gradcheck and gates that decay to nothing; the RDN's hand-derived backward: the feature maps the table leaves out, a loss on
some outputs with the gradient of some inputs, and gradcheck; the SRWM's likewise: both input maps at
SR-DeltaNet's shape, a loss on some outputs with the gradient of some inputs, and gradcheck.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

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
from fwrl.kernels.feature_maps import feature_dim
from fwrl.kernels.gated_delta_rule import gated_delta_rule
from fwrl.kernels.gated_delta_rule.cpu import _GatedDeltaRule, gated_delta_rule_cpu
from fwrl.kernels.gated_delta_rule.naive import gated_delta_rule_reference
from fwrl.kernels.rdn import rdn
from fwrl.kernels.rdn.cpu import rdn_cpu
from fwrl.kernels.rdn.naive import rdn_reference
from fwrl.kernels.srwm import srwm
from fwrl.kernels.srwm.cpu import srwm_cpu
from fwrl.kernels.srwm.naive import srwm_reference

RESETS = ("none", "start", "mid", "everywhere")
LENGTHS = (1, 6, 70)  # one step (acting), an unroll, more than one chunk of the chunked form


def resets(T: int, B: int, pattern: str) -> torch.Tensor:
    """[T, B] episode starts: none, start (step 0), mid (row 0 once, row 1 on three consecutive
    steps) or everywhere."""
    reset = torch.zeros(T, B, dtype=torch.bool)
    if pattern == "start":
        reset[0] = True
    elif pattern == "mid":
        reset[T // 2, 0] = True
        reset[T // 2: T // 2 + 3, 1 % B] = True
    elif pattern == "everywhere":
        reset[:] = True
    return reset


@dataclass(frozen=True)
class Rule:
    """A rule's reference, CPU path and public function, and how to make its inputs.

    ``inputs(T, B, generator)`` returns the float64 tensors before ``reset``; ``state`` names the
    positions of the inputs that are the carried state, in the order the rule returns its final
    state (after the per-step outputs). ``options`` are the keyword variants checked."""

    name: str
    reference: Callable[..., Any]
    cpu: Callable[..., Any]
    public: Callable[..., Any]
    inputs: Callable[[int, int, torch.Generator], tuple[torch.Tensor | None, ...]]
    state: tuple[int, ...]
    options: tuple[dict, ...] = field(default_factory=lambda: ({},))


def _delta_rule_inputs(T, B, g, H=2, D=4, F=None, beta=True):
    F = D if F is None else F
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return (n(T, B, H, D), n(T, B, H, D), n(T, B, H, D), n(T, B, H) if beta else None, n(B, H, D, F, scale=0.5))


def _gated_delta_rule_inputs(T, B, g, H=2, D=4):
    """q, k, v, beta, the log-decays g = -softplus(N(0, 2^2)) (alpha from ~0 to ~1) and S0."""
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return (n(T, B, H, D), n(T, B, H, D), n(T, B, H, D), n(T, B, H), -torch.nn.functional.softplus(n(T, B, H, scale=2.0)),
            n(B, H, D, D, scale=0.5))


def _rdn_inputs(T, B, g, H=2, d=4, F=None):
    F = d if F is None else F
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return (n(T, B, H, d), n(T, B, H, d), n(T, B, H, d), n(T, B, H), *(n(H, d, d, scale=d ** -0.5) for _ in range(3)),
            n(H, d, scale=d ** -0.5), n(B, H, d, F, scale=0.3), n(B, H, d, scale=0.5))


def _srwm_inputs(T, B, g, H=2, D=4, Dy=None):
    Dy = D if Dy is None else Dy
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    offsets = tuple(n(B, H, rows, D, scale=0.1) for rows in (Dy, D, D, 4))
    return (n(T, B, H, D), n(H, Dy, D, scale=D ** -0.5), n(H, D, D, scale=D ** -0.5), n(H, D, D, scale=D ** -0.5),
            n(H, 4, D, scale=D ** -0.5), offsets)


def _delta_rnn_inputs(T, B, g, H=2, d=4, F=None):
    F = d if F is None else F
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return (*(n(T, B, H, d) for _ in range(3)), n(T, B, H), n(T, B, H, d), n(T, B, H, d), n(T, B, H),
            n(B, H, d, F, scale=0.3), n(B, H, d, d, scale=0.3), n(B, H, d, scale=0.5))


def _delta_lstm_inputs(T, B, g, H=2, d=4):
    n = lambda *shape, scale=1.0: scale * torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    return (n(T, B, H, d), n(T, B, H, 6, d), n(T, B, H, 6, d), n(T, B, H, 6), n(B, H, 6, d, d, scale=0.3),
            n(B, H, d, scale=0.5), n(B, H, d, scale=0.5))


RULES = [
    Rule("delta_rule", delta_rule_reference, delta_rule_cpu, delta_rule, _delta_rule_inputs, state=(4,),
         options=tuple({"rule": r, "feature_map": f} for r in ("delta", "sum")
                       for f in ("elu1_sumnorm", "softmax", "dpfp-1"))),
    Rule("gated_delta_rule", gated_delta_rule_reference, gated_delta_rule_cpu, gated_delta_rule,
         _gated_delta_rule_inputs, state=(5,), options=tuple({"feature_map": f} for f in ("l2norm", "elu1_sumnorm"))),
    Rule("rdn", rdn_reference, rdn_cpu, rdn, _rdn_inputs, state=(8, 9),
         options=tuple({"feature_map": f} for f in ("softmax", "elu1_sumnorm", "dpfp-1"))),
    Rule("srwm", srwm_reference, srwm_cpu, srwm, _srwm_inputs, state=(5,),
         options=({"input_map": "softmax"}, {"input_map": "identity"})),
    Rule("delta_rnn", delta_rnn_reference, delta_rnn_cpu, delta_rnn, _delta_rnn_inputs, state=(7, 8, 9),
         options=tuple({"feature_map": f} for f in ("softmax", "elu1_sumnorm", "dpfp-1"))),
    Rule("delta_lstm", delta_lstm_reference, delta_lstm_cpu, delta_lstm, _delta_lstm_inputs, state=(4, 5, 6)),
    # more rules: one Rule(...) each, above this line
]
IDS = [rule.name for rule in RULES]


def _inputs(rule: Rule, options: dict, T: int, B: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    if rule.name == "delta_rule":  # the sum rule has no beta; dpfp-1 doubles the key features
        return _delta_rule_inputs(T, B, g, F=8 if options.get("feature_map") == "dpfp-1" else None,
                                  beta=options.get("rule", "delta") == "delta")
    if rule.name == "delta_rnn":  # dpfp-1 doubles W's key features
        return _delta_rnn_inputs(T, B, g, F=8 if options.get("feature_map") == "dpfp-1" else None)
    if rule.name == "rdn":  # dpfp-1 doubles the key features
        return _rdn_inputs(T, B, g, F=8 if options.get("feature_map") == "dpfp-1" else None)
    return rule.inputs(T, B, g)


def _outputs(result) -> list[torch.Tensor]:
    """The flat list of a rule's returned tensors (per-step outputs, then the final state)."""
    flat = []
    for x in result if isinstance(result, (tuple, list)) else (result,):
        flat.extend(_outputs(x) if isinstance(x, (tuple, list)) else [x])
    return flat


def _leaf(x, dtype):
    """A fresh leaf that requires grad (a tuple of them for a tuple input, such as the SRWM's offsets)."""
    if isinstance(x, tuple):
        return tuple(_leaf(part, dtype) for part in x)
    return None if x is None else x.detach().to(dtype or x.dtype).requires_grad_()


def _run(fn, inputs, reset, weights, dtype=None, **kwargs) -> list[torch.Tensor | None]:
    """The outputs of ``fn`` and the gradients of sum_i <out_i, weight_i> for every input (None: no
    gradient reaches it; a tuple input counts as its parts)."""
    leaves = [_leaf(x, dtype) for x in inputs]
    flat = [x for x in _outputs(leaves)]
    outs = _outputs(fn(*leaves, reset, **kwargs))
    loss = sum((o.double() * w).sum() for o, w in zip(outs, weights))
    grads = iter(torch.autograd.grad(loss, [x for x in flat if x is not None], allow_unused=True))
    return [o.detach() for o in outs] + [None if x is None else next(grads) for x in flat]


def _weights(rule: Rule, options: dict, T: int, B: int) -> list[torch.Tensor]:
    with torch.no_grad():
        outs = _outputs(rule.reference(*_inputs(rule, options, T, B), resets(T, B, "none"), **options))
    g = torch.Generator().manual_seed(99)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]


def _assert_same(ref, got, atol, rtol, label):
    assert len(ref) == len(got), label
    for i, (r, x) in enumerate(zip(ref, got)):
        if r is None or x is None:  # no gradient reaches this input on one side: zero on the other
            other = x if r is None else r
            assert other is None or not other.abs().max() > 0, f"{label}: entry {i}: a gradient on one side only"
            continue
        assert torch.isfinite(x).all(), f"{label}: entry {i} is not finite"
        torch.testing.assert_close(x.double(), r.double(), atol=atol, rtol=rtol, msg=lambda m: f"{label}: entry {i}: {m}")


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@pytest.mark.parametrize("grad_mode", GRAD_MODES)
@pytest.mark.parametrize("T", LENGTHS)
def test_cpu_path_matches_the_reference_in_float64(rule, grad_mode, T):
    B = 3
    for options in rule.options:
        weights = _weights(rule, options, T, B)
        for pattern in RESETS:
            inputs, reset = _inputs(rule, options, T, B), resets(T, B, pattern)
            ref = _run(rule.reference, inputs, reset, weights, grad_mode=grad_mode, **options)
            got = _run(rule.cpu, inputs, reset, weights, grad_mode=grad_mode, **options)
            _assert_same(ref, got, 1e-9, 1e-9, f"{rule.name} {options} {grad_mode} T {T} resets {pattern}")


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_cpu_path_in_float32_is_the_reference_to_round_off(rule):
    T, B = 21, 4
    for options in rule.options:
        weights = _weights(rule, options, T, B)
        inputs, reset = _inputs(rule, options, T, B, seed=1), resets(T, B, "mid")
        ref = _run(rule.reference, inputs, reset, weights, **options)
        got = _run(rule.cpu, inputs, reset, weights, dtype=torch.float32, **options)
        _assert_same(ref, got, 2e-4, 1e-4, f"{rule.name} {options} float32")


@pytest.mark.parametrize("rule", RULES, ids=IDS)
@pytest.mark.parametrize("T", (1, 6))
def test_cpu_path_without_autograd_gives_the_same_outputs(rule, T):
    B = 3
    for options in rule.options:
        inputs, reset = _inputs(rule, options, T, B, seed=2), resets(T, B, "mid" if T > 1 else "start")
        reset[0, 1] = False  # one row resets at step 0, the others carry
        with torch.no_grad():
            acting = _outputs(rule.cpu(*inputs, reset, **options))
        learning = _run(rule.cpu, inputs, reset, _weights(rule, options, T, B), **options)[:len(acting)]
        _assert_same(learning, acting, 1e-12, 1e-12, f"{rule.name} {options} T {T} without autograd")


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_cpu_path_carries_its_state_across_calls(rule):
    T, B, cut = 9, 3, 4
    for options in rule.options:
        inputs, reset = _inputs(rule, options, T, B, seed=3), resets(T, B, "mid")
        whole = _outputs(rule.cpu(*inputs, reset, **options))
        steps = [i for i, x in enumerate(inputs)
                 if i not in rule.state and isinstance(x, torch.Tensor) and x.shape[0] == T]
        first = [x[:cut] if i in steps else x for i, x in enumerate(inputs)]
        first_out = _outputs(rule.cpu(*first, reset[:cut], **options))
        sizes = [len(inputs[i]) if isinstance(inputs[i], tuple) else 1 for i in rule.state]  # flattened state
        per_step = len(first_out) - sum(sizes)
        second = [x[cut:] if i in steps else x for i, x in enumerate(inputs)]
        carried = iter(first_out[per_step:])
        for position, size in zip(rule.state, sizes):  # a tuple state (the SRWM's offsets) goes back as one
            parts = tuple(next(carried) for _ in range(size))
            second[position] = parts if isinstance(inputs[position], tuple) else parts[0]
        second_out = _outputs(rule.cpu(*second, reset[cut:], **options))
        joined = [torch.cat([a, b]) for a, b in zip(first_out[:per_step], second_out[:per_step])]
        _assert_same(whole, joined + second_out[per_step:], 1e-12, 1e-12, f"{rule.name} {options} carried")


@pytest.mark.parametrize("rule", RULES, ids=IDS)
def test_cpu_tensors_take_the_cpu_path_unless_the_reference_is_asked_for(rule, monkeypatch):
    import fwrl.kernels.dispatch as dispatch

    options = rule.options[0]
    inputs, reset = _inputs(rule, options, 3, 2), resets(3, 2, "none")
    calls = []
    monkeypatch.setattr(dispatch, "_announce", lambda layer, kernel, backend, x, why="": calls.append(backend))
    for backend, expected in (("auto", "cpu"), ("cpu", "cpu"), ("reference", "reference")):
        monkeypatch.setenv("FWRL_KERNELS", backend)
        calls.clear()
        rule.public(*inputs, reset, **options)
        assert calls == [expected], f"FWRL_KERNELS={backend}: ran {calls}, expected {expected}"


def test_acting_step_maps_adjacent_query_and_key_slices_in_one_call():
    """The slow net's [q | k | v | beta] slices of one tensor (adjacent q and k: phi maps them in one
    call) give the same step as separate tensors, and as the reference."""
    g = torch.Generator().manual_seed(4)
    B, H, D = 3, 2, 4
    p = torch.randn(1, B, H, 3 * D + 1, generator=g, dtype=torch.float64)
    W0 = torch.randn(B, H, D, D, generator=g, dtype=torch.float64)
    reset = torch.tensor([[True, False, False]])
    slices = p[..., :D], p[..., D:2 * D], p[..., 2 * D:3 * D], p[..., 3 * D]
    with torch.no_grad():
        adjacent = delta_rule_cpu(*slices, W0, reset)
        separate = delta_rule_cpu(*(x.clone() for x in slices), W0, reset)
        reference = delta_rule_reference(*slices, W0, reset)
    for a, s_, r in zip(adjacent, separate, reference):
        torch.testing.assert_close(a, s_, rtol=0, atol=1e-15)
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12)


def _gated_hand_backward(q, k, v, beta, g, S0, reset, *, feature_map="l2norm", grad_mode="full"):
    """The gated delta rule through its hand-derived backward (``_GatedDeltaRule``) at any T, with the
    maps and sigmoid the CPU path applies before it."""
    from fwrl.kernels.feature_maps import apply_feature_map

    T, B, H, D = q.shape
    N = B * H
    if grad_mode == "step":
        S0 = S0.detach()
    keep = (~reset).to(S0.dtype).view(T, B, 1).expand(T, B, H).reshape(T, N)
    y, ST = _GatedDeltaRule.apply(apply_feature_map(feature_map, q).reshape(T, N, D),
                                  apply_feature_map(feature_map, k).reshape(T, N, D), v.reshape(T, N, -1),
                                  torch.sigmoid(beta).reshape(T, N, 1), g.reshape(T, N), S0.reshape(N, *S0.shape[2:]),
                                  keep, grad_mode == "full")
    return y.view(*v.shape), ST.view(S0.shape)


@pytest.mark.parametrize("feature_map", ("l2norm", "elu1_sumnorm"))
@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_gated_delta_rule_hand_backward_over_whole_sequences(feature_map, grad_mode):
    """The gated delta rule's hand-derived backward over T > 1 (the public function learns there in
    chunked form in grad mode full) against the reference in float64 to 1e-10, resets at step 0 and
    mid-way."""
    inputs = _gated_delta_rule_inputs(7, 3, torch.Generator().manual_seed(14))
    _check_starts_at_step_0_and_mid_way(gated_delta_rule_reference, _gated_hand_backward, inputs,
                                        {"feature_map": feature_map, "grad_mode": grad_mode}, "gated_delta_rule",
                                        tolerance=1e-10)


@pytest.mark.parametrize("path", ("chunked", "hand"))
def test_gated_delta_rule_cpu_backward_passes_gradcheck(path):
    """Finite differences of the gated delta rule's CPU path (chunked form: grad mode full over several
    steps; hand-derived: every T) agree with its backward, resets at step 0 and on consecutive steps."""
    leaves = [x.requires_grad_() for x in _gated_delta_rule_inputs(4, 2, torch.Generator().manual_seed(15), H=1, D=3)]
    reset = torch.tensor([[True, False], [False, True], [False, True], [True, False]])
    fn = gated_delta_rule_cpu if path == "chunked" else _gated_hand_backward
    assert torch.autograd.gradcheck(lambda *xs: fn(*xs, reset), leaves)


@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_gated_delta_rule_with_gates_that_decay_to_nothing(grad_mode):
    """Log-decays of -800 (alpha underflows to 0: the state is forgotten) and of 0 (alpha = 1: the delta
    rule) on alternate steps: finite, and the reference's values and gradients, on the public function
    (chunked form in full) and the hand-derived backward."""
    T, B = 70, 2
    q, k, v, beta, g, S0 = _gated_delta_rule_inputs(T, B, torch.Generator().manual_seed(16))
    g = torch.where(torch.arange(T).view(T, 1, 1) % 2 == 0, torch.full_like(g, -800.0), torch.zeros_like(g))
    inputs, reset = (q, k, v, beta, g, S0), resets(T, B, "mid")
    weights = [torch.randn(x.shape, generator=torch.Generator().manual_seed(17), dtype=torch.float64) for x in (v, S0)]
    ref = _run(gated_delta_rule_reference, inputs, reset, weights, grad_mode=grad_mode)
    for fn in (gated_delta_rule_cpu, _gated_hand_backward):
        _assert_same(ref, _run(fn, inputs, reset, weights, grad_mode=grad_mode), 1e-10, 1e-10, f"{fn.__name__} {grad_mode}")


def test_gated_delta_rule_in_short_chunks_of_many_matrices():
    """With many matrices (B x H >= 128) the chunked form cuts a sequence into chunks of at most 32 steps
    (41 steps: 20 and 21): values and gradients the reference's in float64 to 1e-10, resets mid-way."""
    T, B = 41, 64
    inputs = _gated_delta_rule_inputs(T, B, torch.Generator().manual_seed(18))
    _check_starts_at_step_0_and_mid_way(gated_delta_rule_reference, gated_delta_rule_cpu, inputs, {},
                                        "gated_delta_rule", tolerance=1e-10)


@pytest.mark.parametrize("feature_map", ("dpfp-2", "dpfp-3", "identity"))
@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_rdn_cpu_path_with_the_feature_maps_the_table_leaves_out(feature_map, grad_mode):
    """The RDN's hand-derived backward has its own phi' for each feature map: the maps not in RULES
    (dpfp with nu > 1, identity) against the reference in float64, resets at step 0 and mid-way."""
    T, B, d = 6, 3, 4
    options = {"feature_map": feature_map, "grad_mode": grad_mode}
    inputs = _rdn_inputs(T, B, torch.Generator().manual_seed(5), d=d, F=feature_dim(feature_map, d))
    _check_starts_at_step_0_and_mid_way(rdn_reference, rdn_cpu, inputs, options, "rdn")


def _check_starts_at_step_0_and_mid_way(reference, cpu, inputs, options: dict, name: str,
                                        tolerance: float = 1e-9) -> None:
    """``cpu`` against ``reference`` in float64, forward and every gradient (each output weighted by
    its own random tensor), with episodes starting at step 0 and mid-way, to ``tolerance``."""
    T, B = inputs[0].shape[:2]
    with torch.no_grad():
        outs = _outputs(reference(*inputs, resets(T, B, "none"), **options))
    g = torch.Generator().manual_seed(99)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    for pattern in ("start", "mid"):
        reset = resets(T, B, pattern)
        ref = _run(reference, inputs, reset, weights, **options)
        got = _run(cpu, inputs, reset, weights, **options)
        _assert_same(ref, got, tolerance, tolerance, f"{name} {options} resets {pattern}")


def test_rdn_cpu_gradient_of_some_outputs_and_some_inputs():
    """The backward of the RDN's CPU path skips what is not asked for: a loss on one output (or
    two) and the gradient of a few inputs only equal the reference's."""
    T, B = 5, 3
    inputs = _rdn_inputs(T, B, torch.Generator().manual_seed(6))
    reset = resets(T, B, "mid")
    with torch.no_grad():
        outs = _outputs(rdn_reference(*inputs, reset))
    g = torch.Generator().manual_seed(7)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    for grad_mode in GRAD_MODES:
        for used, wanted in (((0,), (0, 4)), ((1,), (8, 3)), ((2,), (9, 6)), ((1, 2), (1, 2, 7, 8, 9))):
            grads = []
            for fn in (rdn_reference, rdn_cpu):
                leaves = [x.detach().clone().requires_grad_(i in wanted) for i, x in enumerate(inputs)]
                out = fn(*leaves, reset, grad_mode=grad_mode)
                loss = sum((out[i] * weights[i]).sum() for i in used)
                grads.append(torch.autograd.grad(loss, [leaves[i] for i in wanted], allow_unused=True))
            _assert_same(*grads, 1e-9, 1e-9, f"rdn {grad_mode} outputs {used} inputs {wanted}")


@pytest.mark.parametrize("feature_map", ("softmax", "elu1_sumnorm", "dpfp-1"))
def test_rdn_cpu_backward_passes_gradcheck(feature_map):
    """Finite differences of the RDN's CPU path agree with its hand-derived backward (grad mode full:
    step's gradient is truncated by design), resets at step 0 and on consecutive steps."""
    T, B, d = 4, 2, 3
    inputs = _rdn_inputs(T, B, torch.Generator().manual_seed(8), H=1, d=d, F=feature_dim(feature_map, d))
    reset = torch.tensor([[True, False], [False, True], [False, True], [True, False]])
    leaves = [x.requires_grad_() for x in inputs]
    assert torch.autograd.gradcheck(lambda *xs: rdn_cpu(*xs, reset, feature_map=feature_map), leaves)


def _srwm_flat_inputs(T, B, seed, H=2, D=4, Dy=None) -> list[torch.Tensor]:
    """The SRWM's inputs with its offsets flattened: x, W_y, W_q, W_k, w_b, O_y, O_q, O_k, O_b."""
    *slow, offsets = _srwm_inputs(T, B, torch.Generator().manual_seed(seed), H=H, D=D, Dy=Dy)
    return [*slow, *offsets]


def _srwm_call(fn, flat, reset, **options) -> list[torch.Tensor]:
    """``fn`` on the flat inputs of :func:`_srwm_flat_inputs`: y, then the four final offsets."""
    return _outputs(fn(*flat[:5], tuple(flat[5:]), reset, **options))


@pytest.mark.parametrize("input_map", ("softmax", "identity"))
@pytest.mark.parametrize("grad_mode", GRAD_MODES)
def test_srwm_cpu_path_with_the_sr_delta_net_rows(input_map, grad_mode):
    """The SRWM's hand-derived backward with both input maps at SR-DeltaNet's shape (a y-part of
    3D + 1 rows, three heads) against the reference in float64, resets at step 0 and mid-way."""
    T, B, D = 7, 3, 4
    options = {"input_map": input_map, "grad_mode": grad_mode}
    inputs = _srwm_inputs(T, B, torch.Generator().manual_seed(10), H=3, D=D, Dy=3 * D + 1)
    _check_starts_at_step_0_and_mid_way(srwm_reference, srwm_cpu, inputs, options, "srwm")


@pytest.mark.parametrize("input_map", ("softmax", "identity"))
def test_srwm_cpu_gradient_of_some_outputs_and_some_inputs(input_map):
    """The backward of the SRWM's CPU path skips what is not asked for: a loss on one output (y or
    one final offset) or two and the gradient of a few inputs only (x, one slow matrix, one initial
    offset) equal the reference's, in both grad modes."""
    T, B = 6, 3
    flat = _srwm_flat_inputs(T, B, seed=11)
    reset = resets(T, B, "mid")
    with torch.no_grad():
        outs = _srwm_call(srwm_reference, flat, reset, input_map=input_map)
    g = torch.Generator().manual_seed(12)
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    cases = (((0,), (0,)), ((0,), (1, 5)), ((2,), (3, 7)), ((4,), (0, 4, 8)), ((1, 3), (2, 6)), ((0, 4), (4,)))
    for grad_mode in GRAD_MODES:
        for used, wanted in cases:
            grads = []
            for fn in (srwm_reference, srwm_cpu):
                leaves = [x.detach().clone().requires_grad_(i in wanted) for i, x in enumerate(flat)]
                out = _srwm_call(fn, leaves, reset, input_map=input_map, grad_mode=grad_mode)
                loss = sum((out[i] * weights[i]).sum() for i in used)
                grads.append(torch.autograd.grad(loss, [leaves[i] for i in wanted], allow_unused=True))
            assert any(x is not None and x.abs().max() > 0 for x in grads[1]), (grad_mode, used, wanted)
            _assert_same(*grads, 1e-9, 1e-9, f"srwm {input_map} {grad_mode} outputs {used} inputs {wanted}")


@pytest.mark.parametrize("input_map", ("softmax", "identity"))
def test_srwm_cpu_backward_passes_gradcheck(input_map):
    """Finite differences of the SRWM's CPU path agree with its hand-derived backward (grad mode
    full: step's gradient is truncated by design), resets at step 0 and on consecutive steps."""
    T, B = 4, 2
    flat = _srwm_flat_inputs(T, B, seed=13, H=1, D=3, Dy=2)
    reset = torch.tensor([[True, False], [False, True], [False, True], [True, False]])
    leaves = [x.requires_grad_() for x in flat]
    assert torch.autograd.gradcheck(lambda *xs: tuple(_srwm_call(srwm_cpu, list(xs), reset, input_map=input_map)),
                                    leaves)
