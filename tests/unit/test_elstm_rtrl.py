"""eLSTM core (Paper 004, Eq. 5-7) and its exact RTRL gradients (Eq. 8-12, PAPERS.md §3).

Everything in float64 at tiny shapes. The derived sensitivity recursions are
proved against autograd BPTT; the learner's autograd Function is proved
against the forward-mode reference; the core is checked in both modes.
"""

from __future__ import annotations

import pytest
import torch

from fwrl.errors import FwrlError
from fwrl.kernels.elstm_rtrl import naive, recurrence
from fwrl.memory_modules import build_core
from fwrl.memory_modules.elstm import ELSTMCore

T, B, D, H = 7, 3, 5, 4
F64 = torch.float64


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def make_params(gen: torch.Generator, std: float = 0.6) -> dict[str, torch.Tensor]:
    # larger than the 0.1 init so that every term (w_z, w_f paths) matters
    shapes = {"W_z": (H, D), "W_f": (H, D), "w_z": (H,), "w_f": (H,), "b_z": (H,), "b_f": (H,)}
    return {k: (torch.randn(s, generator=gen, dtype=F64) * std).requires_grad_() for k, s in shapes.items()}


def make_done(resets: bool, steps: int = T) -> torch.Tensor:
    done = torch.zeros(steps, B, dtype=torch.bool)
    if resets:
        done[2, 0] = True
        done[4, 1] = True
        done[4, 2] = True
    return done


def random_sens(gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {k: torch.randn(v.shape, generator=gen, dtype=F64)
            for k, v in naive.initial_sensitivities(B, H, D, dtype=F64).items()}


def make_cores(seed: int = 0) -> tuple[ELSTMCore, ELSTMCore]:
    torch.manual_seed(seed)
    rtrl = build_core("elstm", D, {"hidden_size": str(H), "grad": "rtrl"}).double()
    bptt = build_core("elstm", D, {"hidden_size": H, "grad": "bptt"}).double()
    bptt.load_state_dict(rtrl.state_dict())
    with torch.no_grad():  # larger recurrent weights than the init, so all terms matter
        for core in (rtrl, bptt):
            for name, p in core.recurrent_parameters().items():
                p.mul_(5.0)
    return rtrl, bptt


# ---------------------------------------------------------------- derivation proofs


@pytest.mark.parametrize("resets", [False, True])
def test_reference_rtrl_equals_bptt_whole_sequence(resets):
    """sum_t delta_t . dc_t/dtheta (forward-mode sensitivities) == autograd BPTT."""
    gen = torch.Generator().manual_seed(1)
    params = make_params(gen)
    x = torch.randn(T, B, D, generator=gen, dtype=F64)
    c0 = torch.zeros(B, H, dtype=F64)
    done = make_done(resets)
    target = torch.randn(T, B, H, generator=gen, dtype=F64)

    def loss_of(c_all):  # sum_t L_t(c_t), each L_t depends on c_t only directly
        return (torch.tanh(c_all) * target).sum() + 0.5 * (c_all**2).sum()

    c_bptt = recurrence.elstm_scan(x, c0, *params.values(), done)
    g_bptt = torch.autograd.grad(loss_of(c_bptt), list(params.values()))

    c_ref = c_bptt.detach().requires_grad_()
    (delta,) = torch.autograd.grad(loss_of(c_ref), c_ref)
    c_rtrl, _, g_rtrl = naive.rtrl_reference(
        x, c0, naive.initial_sensitivities(B, H, D, dtype=F64), params, done, delta
    )
    torch.testing.assert_close(c_rtrl, c_bptt.detach(), rtol=0, atol=1e-13)
    for key, g in zip(params, g_bptt):
        assert rel_err(g_rtrl[key], g) < 1e-6, key


def test_printed_eq9_factor_is_not_exact(monkeypatch):
    """Eq. 9/12 as printed (d = f + w_f fhat, no w_z path) disagree with BPTT: the test above can fail."""
    gen = torch.Generator().manual_seed(2)
    params = make_params(gen)
    x = torch.randn(T, B, D, generator=gen, dtype=F64)
    c0 = torch.zeros(B, H, dtype=F64)
    done = make_done(False)
    c_bptt = recurrence.elstm_scan(x, c0, *params.values(), done)
    (g_bptt,) = torch.autograd.grad(c_bptt.sum(), [params["W_f"]])

    def printed(c_prev, z, f, w_z, w_f):
        a = (1 - f) * (1 - z * z)
        b = (c_prev - z) * f * (1 - f)
        return a, b, f + b * w_f

    monkeypatch.setattr(naive, "local_derivatives", printed)
    _, _, g = naive.rtrl_reference(x, c0, naive.initial_sensitivities(B, H, D, dtype=F64), params, done,
                                   torch.ones(T, B, H, dtype=F64))
    assert rel_err(g["W_f"], g_bptt) > 1e-3


@pytest.mark.parametrize("resets", [False, True])
def test_function_equals_forward_mode_reference(resets):
    """The learner's Function (reverse accumulation) == forward-mode RTRL, carried sensitivities included."""
    gen = torch.Generator().manual_seed(3)
    params = make_params(gen)
    x = torch.randn(T, B, D, generator=gen, dtype=F64, requires_grad=True)
    c0 = torch.randn(B, H, generator=gen, dtype=F64)
    sens0 = random_sens(gen)
    done = make_done(resets)
    delta = torch.randn(T, B, H, generator=gen, dtype=F64)

    c_ref, sens_ref, g_ref = naive.rtrl_reference(x.detach(), c0, sens0, params, done, delta)
    c_fn, sens_fn = recurrence.elstm_rtrl(x, c0, sens0, params, done)
    torch.testing.assert_close(c_fn, c_ref.detach(), rtol=0, atol=1e-13)
    for key in naive.SENSITIVITY_KEYS:
        torch.testing.assert_close(sens_fn[key], sens_ref[key].detach(), rtol=1e-12, atol=1e-13)
    grads = torch.autograd.grad((c_fn * delta).sum(), [x, *params.values()])
    for key, g in zip(params, grads[1:]):
        assert rel_err(g, g_ref[key]) < 1e-10, key

    # x gets the one-step Jacobian: autograd through each step with c_{t-1} detached
    c_prev = c0
    one_step = []
    for t in range(T):
        c_prev = c_prev * (~done[t]).to(F64)[:, None]
        c_t, _, _ = naive.elstm_cell(x[t], c_prev.detach(), *params.values())
        one_step.append(c_t)
        c_prev = c_t
    (g_x,) = torch.autograd.grad((torch.stack(one_step) * delta).sum(), [x])
    torch.testing.assert_close(grads[0], g_x, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("steps", [1, T])
@pytest.mark.parametrize("resets", [False, True])
def test_acting_without_autograd_advances_like_the_forward_mode_reference(resets, steps):
    """Acting (no autograd) advances c and the sensitivities by the forward-mode recursions: the same
    values as the reference and as the learner's Function, resets included."""
    gen = torch.Generator().manual_seed(5)
    params = make_params(gen)
    x = torch.randn(steps, B, D, generator=gen, dtype=F64)
    c0, sens0 = torch.randn(B, H, generator=gen, dtype=F64), random_sens(gen)
    done = make_done(resets)[:steps]
    if steps == 1 and resets:
        done[0, 0] = True
    c_ref, sens_ref, _ = naive.rtrl_reference(x, c0, sens0, params, done)
    with torch.no_grad():
        c_act, sens_act = recurrence.elstm_rtrl(x, c0, sens0, params, done)
    c_fn, sens_fn = recurrence.elstm_rtrl(x, c0, sens0, {k: v.requires_grad_() for k, v in params.items()}, done)
    torch.testing.assert_close(c_act, c_ref, rtol=0, atol=1e-13)
    torch.testing.assert_close(c_act, c_fn.detach(), rtol=0, atol=1e-13)
    for key in naive.SENSITIVITY_KEYS:
        torch.testing.assert_close(sens_act[key], sens_ref[key], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(sens_act[key], sens_fn[key].detach(), rtol=1e-12, atol=1e-13)


def test_rtrl_keeps_no_per_step_sensitivities_for_backward():
    """Saved for backward: O(T*B*H + B*H*D), never the T sensitivity tensors Z_t [B, H, D]."""
    gen = torch.Generator().manual_seed(4)
    Tl, Dl = 16, 32
    params = {k: v.detach().requires_grad_() for k, v in make_params(gen).items()}
    params["W_z"] = torch.randn(H, Dl, dtype=F64, requires_grad=True)
    params["W_f"] = torch.randn(H, Dl, dtype=F64, requires_grad=True)
    x = torch.randn(Tl, B, Dl, dtype=F64, requires_grad=True)
    sens0 = naive.initial_sensitivities(B, H, Dl, dtype=F64)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        c, _ = recurrence.elstm_rtrl(x, torch.zeros(B, H, dtype=F64), sens0, params,
                                     torch.zeros(Tl, B, dtype=torch.bool))
    assert saved, "the hooks saw nothing; the check would be vacuous"
    # x, W_z, W_f, (a, b, d, c_{t-1}) per step, initial Z, F and the four vectors
    claimed = Tl * B * Dl + 2 * H * Dl + 4 * Tl * B * H + 2 * B * H * Dl + 4 * B * H
    assert sum(saved) <= claimed
    assert claimed < Tl * B * H * Dl  # what keeping Z_t for every t alone would cost
    c.sum().backward()  # and backward still works from what was saved
    assert params["W_z"].grad is not None and x.grad is not None


@pytest.mark.parametrize("resets", [False, True])
def test_function_in_blocks_equals_forward_mode_reference(monkeypatch, resets):
    """The reverse pass split into blocks of 3 steps (7 = 1 + 3 + 3, resets on both sides of a
    block boundary) gives the same values and gradients."""
    monkeypatch.setattr(recurrence, "CHUNK_STEPS", 3)
    test_function_equals_forward_mode_reference(resets)


def test_core_in_blocks_carries_segments_exactly(monkeypatch):
    monkeypatch.setattr(recurrence, "CHUNK_STEPS", 2)
    test_core_rtrl_segments_equal_bptt_over_both_segments()


class StorageMeter:
    """Bytes autograd saves for backward, each storage once (as benchmarks/r2ac_memory.py counts)."""

    def __init__(self):
        self.nbytes: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        self.nbytes[storage.data_ptr()] = storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def bytes_except(self, *tensors: torch.Tensor) -> int:
        skip = {t.untyped_storage().data_ptr() for t in tensors}
        return sum(n for ptr, n in self.nbytes.items() if ptr not in skip)


@pytest.mark.parametrize("resets", [False, True])
def test_recomputed_derivatives_equal_the_scan(resets):
    """Backward's vectorised recomputation of (a, b, d_eff, c_prev) == the sequential scan's."""
    gen = torch.Generator().manual_seed(10)
    params = {k: v.detach() for k, v in make_params(gen).items()}
    x = torch.randn(T, B, D, generator=gen, dtype=F64)
    c0 = torch.randn(B, H, generator=gen, dtype=F64)
    done = make_done(resets)
    done[0, 1] = resets  # a reset at step 0 drops c0 for that row
    c_all, *scanned = recurrence.elstm_scan(x, c0, *params.values(), done, with_derivatives=True)
    recomputed = recurrence.recompute_derivatives(x, c_all, c0, *params.values(), done)
    for name, want, got in zip(("a", "b", "d_eff", "c_prev"), scanned, recomputed):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=name)


def test_rtrl_function_saves_nothing_per_step_beyond_x_and_its_output():
    """Issue 4: apart from x and its own output c (storages the output gate keeps anyway)
    and the [T, B] bool reset mask, what the Function saves is constant in T."""
    gen = torch.Generator().manual_seed(11)
    params = {k: v.detach().requires_grad_() for k, v in make_params(gen).items()}
    extra = {}
    for steps in (5, 13):
        x = torch.randn(steps, B, D, generator=gen, dtype=F64, requires_grad=True)
        meter = StorageMeter()
        with meter.hooks():
            c, _ = recurrence.elstm_rtrl(x, torch.randn(B, H, dtype=F64), random_sens(gen), params,
                                         make_done(True, steps))
        assert x.untyped_storage().data_ptr() in meter.nbytes
        assert c.untyped_storage().data_ptr() in meter.nbytes
        extra[steps] = meter.bytes_except(x, c)
        c.sum().backward()  # and backward works from what was saved
    assert extra[5] > 2 * B * H * D * 8  # the initial sensitivities Z, F are in it
    assert extra[13] - extra[5] == 8 * B  # only the reset mask grows: 1 byte per step and row


def test_rtrl_core_saves_per_step_only_x_c_and_the_gate():
    """The eLSTM core (rtrl) keeps per step x_t, c_t, the output gate o_t (its own backward)
    and the reset bit; a, b, d, c_{t-1} and an [x; c] copy are not kept (issue 4)."""
    torch.manual_seed(12)
    core = build_core("elstm", D, {"hidden_size": H, "grad": "rtrl"}).double()
    gen = torch.Generator().manual_seed(12)
    total, extra = {}, {}
    for steps in (5, 13):
        x = torch.randn(steps, B, D, generator=gen, dtype=F64, requires_grad=True) * 1.0
        state = {k: torch.randn(v.shape, generator=gen, dtype=F64)
                 for k, v in core.initial_state(B).items()}
        meter = StorageMeter()
        with meter.hooks():
            y, new_state = core(x, state, make_done(True, steps))
        total[steps] = sum(meter.nbytes.values())
        extra[steps] = meter.bytes_except(x, new_state["c"])  # new c is a view of the c sequence
        y.sum().backward()
    per_step = (total[13] - total[5]) / 8
    assert per_step == B * (D + 2 * H) * 8 + B  # x_t, c_t, o_t in float64, done bool
    assert (extra[13] - extra[5]) / 8 == B * H * 8 + B  # o_t and the reset bit


# ---------------------------------------------------------------- the core


@pytest.mark.parametrize("resets", [False, True])
def test_core_rtrl_equals_bptt_on_whole_sequence(resets):
    rtrl, bptt = make_cores()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(T, B, D, generator=gen, dtype=F64)
    done = make_done(resets)
    target = torch.randn(T, B, H, generator=gen, dtype=F64)
    y_r, s_r = rtrl(x, rtrl.initial_state(B), done)
    y_b, s_b = bptt(x, bptt.initial_state(B), done)
    torch.testing.assert_close(y_r, y_b, rtol=0, atol=1e-14)  # same forward values
    torch.testing.assert_close(s_r["c"], s_b["c"], rtol=0, atol=1e-14)
    ((y_r - target) ** 2).sum().backward()
    ((y_b - target) ** 2).sum().backward()
    grads_b = dict(bptt.named_parameters())
    for name, p in rtrl.named_parameters():
        assert rel_err(p.grad, grads_b[name].grad) < 1e-6, name


def test_core_rtrl_segments_equal_bptt_over_both_segments():
    """Segment 2's RTRL gradients (state carried from segment 1) == BPTT over 1+2 of segment 2's loss."""
    rtrl, bptt = make_cores(seed=6)
    gen = torch.Generator().manual_seed(6)
    T1, T2 = 5, 6
    x = torch.randn(T1 + T2, B, D, generator=gen, dtype=F64)
    done = torch.zeros(T1 + T2, B, dtype=torch.bool)
    done[1, 0] = True  # episode start inside segment 1
    done[T1 + 2, 1] = True  # and inside segment 2
    target = torch.randn(T2, B, H, generator=gen, dtype=F64)

    with torch.no_grad():  # the actors' pass over segment 1
        _, state = rtrl(x[:T1], rtrl.initial_state(B), done[:T1])
    assert state["Z"].abs().sum() > 0
    y2, _ = rtrl(x[T1:], state, done[T1:])
    ((y2 - target) ** 2).sum().backward()

    y_full, _ = bptt(x, bptt.initial_state(B), done)
    ((y_full[T1:] - target) ** 2).sum().backward()
    grads_b = dict(bptt.named_parameters())
    for name, p in rtrl.named_parameters():
        assert rel_err(p.grad, grads_b[name].grad) < 1e-6, name

    # plain truncated BPTT over segment 2 alone misses the carried part
    bptt.zero_grad()
    y_tr, _ = bptt(x[T1:], {"c": state["c"]}, done[T1:])
    ((y_tr - target) ** 2).sum().backward()
    assert rel_err(bptt.W_z.grad, rtrl.W_z.grad) > 1e-4


@pytest.mark.parametrize("mode", ["bptt", "rtrl"])
def test_one_call_equals_single_steps(mode):
    torch.manual_seed(7)
    core = build_core("elstm", D, {"hidden_size": H, "grad": mode}).double()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(T, B, D, generator=gen, dtype=F64)
    done = make_done(True)
    done[0, 1] = True
    state0 = core.initial_state(B)
    state0 = {k: torch.randn(v.shape, generator=gen, dtype=F64) for k, v in state0.items()}
    with torch.no_grad():
        y_all, s_all = core(x, state0, done)
        state, ys = state0, []
        for t in range(T):
            y, state = core(x[t : t + 1], state, done[t : t + 1])
            ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_all, rtol=1e-12, atol=1e-13)
    assert set(state) == set(s_all)
    for key in s_all:
        torch.testing.assert_close(state[key], s_all[key], rtol=1e-12, atol=1e-13)


def test_reset_at_step_zero_ignores_carried_state():
    torch.manual_seed(8)
    core = build_core("elstm", D, {"hidden_size": H, "grad": "rtrl"}).double()
    x = torch.randn(3, B, D, dtype=F64)
    done = torch.zeros(3, B, dtype=torch.bool)
    done[0] = True
    junk = {k: torch.randn_like(v) for k, v in core.initial_state(B).items()}
    with torch.no_grad():
        y1, s1 = core(x, junk, done)
        y2, s2 = core(x, core.initial_state(B), done)
    torch.testing.assert_close(y1, y2)
    for key in s1:
        torch.testing.assert_close(s1[key], s2[key])


def test_optimiser_update_matches_hand_computed_update():
    """A tiny stem + eLSTM(rtrl) + head, one RMSProp step, against gradients computed independently."""
    torch.manual_seed(9)
    stem = torch.nn.Linear(6, D).double()
    core = build_core("elstm", D, {"hidden_size": H, "grad": "rtrl"}).double()
    head = torch.nn.Linear(H, 2).double()
    gen = torch.Generator().manual_seed(9)
    obs = torch.randn(T, B, 6, generator=gen, dtype=F64)
    done = make_done(True)
    target = torch.randn(T, B, 2, generator=gen, dtype=F64)
    with torch.no_grad():
        _, state = core(torch.randn(4, B, D, generator=gen, dtype=F64), core.initial_state(B),
                        torch.zeros(4, B, dtype=torch.bool))
    modules = torch.nn.ModuleList([stem, core, head])
    before = {n: p.detach().clone() for n, p in modules.named_parameters()}

    # expected gradients: one-step graph (c_{t-1} detached) for everything but the
    # recurrent parameters, forward-mode RTRL for those
    rec = core.recurrent_parameters()
    x = stem(obs)
    c_prev, cs = state["c"], []
    for t in range(T):
        c_prev = c_prev * (~done[t]).to(F64)[:, None]
        c_t, _, _ = naive.elstm_cell(x[t], c_prev.detach(), *rec.values())
        cs.append(c_t)
        c_prev = c_t
    c_all = torch.stack(cs)
    c_leaf = c_all.detach().requires_grad_()
    y = torch.sigmoid(core.out_gate(torch.cat([x, c_leaf], -1))) * c_leaf
    loss = ((head(y) - target) ** 2).sum()
    recurrent_names = {"1." + k for k in naive.PARAM_KEYS}
    others = [(n, p) for n, p in modules.named_parameters() if n not in recurrent_names]
    g_direct = torch.autograd.grad(loss, [c_leaf] + [p for _, p in others], retain_graph=True)
    delta = g_direct[0]
    expected = {n: g.clone() for (n, _), g in zip(others, g_direct[1:])}
    # the stem also reaches the loss through c_t's one-step input Jacobian
    g_via_c = torch.autograd.grad((c_all * delta).sum(), list(stem.parameters()))
    for (n, _), g in zip(stem.named_parameters(), g_via_c):
        expected["0." + n] += g
    _, _, g_rec = naive.rtrl_reference(x.detach(), state["c"], {k: state[k] for k in naive.SENSITIVITY_KEYS},
                                       {k: v.detach() for k, v in rec.items()}, done, delta)
    for k, g in g_rec.items():
        expected["1." + k] = g

    opt = torch.optim.RMSprop(modules.parameters(), lr=0.01, alpha=0.99, eps=0.01)
    opt.zero_grad()
    y_core, _ = core(stem(obs), state, done)
    ((head(y_core) - target) ** 2).sum().backward()
    opt.step()
    assert set(expected) == set(before)
    for n, p in modules.named_parameters():
        g = expected[n]
        square_avg = (1 - 0.99) * g * g
        by_hand = before[n] - 0.01 * g / (square_avg.sqrt() + 0.01)
        torch.testing.assert_close(p.detach(), by_hand, rtol=1e-9, atol=1e-12, msg=n)


# ---------------------------------------------------------------- config and state


def test_config_state_and_init():
    core = build_core("elstm", 257, {})
    assert core.grad_mode == "bptt" and core.output_size == 256
    assert set(core.initial_state(2)) == {"c"}
    for name in naive.PARAM_KEYS:
        std = getattr(core, name).detach().std().item()
        assert 0.07 < std < 0.13, name  # N(0, 0.1) init
    rtrl = build_core("elstm", 9, {"hidden_size": "3", "grad": "rtrl"})
    shapes = {k: tuple(v.shape) for k, v in rtrl.initial_state(2).items()}
    assert shapes == {"c": (2, 3), "Z": (2, 3, 9), "F": (2, 3, 9), "s_wz": (2, 3),
                      "s_wf": (2, 3), "s_bz": (2, 3), "s_bf": (2, 3)}
    assert all(v.abs().sum() == 0 for v in rtrl.initial_state(2).values())


def test_bad_options_are_user_errors():
    with pytest.raises(FwrlError, match="'tbptt'.*bptt, rtrl"):
        build_core("elstm", 8, {"grad": "tbptt"})
    with pytest.raises(FwrlError, match="num_layers=2"):
        build_core("elstm", 8, {"num_layers": "2"})
    with pytest.raises(FwrlError, match="hidden_size"):
        build_core("elstm", 8, {"hidden_size": "0"})
