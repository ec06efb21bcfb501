"""V-trace against an independent implementation of IMPALA Eq. 1.

The reference below evaluates the definition literally: for every s, the sum
over t = s..T-1 of (prod_{i<t} gamma_i c_i) * delta_t, with V(x_T) the
bootstrap value. It never uses the backward recursion of the product code.
"""

from __future__ import annotations

import math

import pytest
import torch

from fwrl.agents import vtrace


def _clip(x: float, threshold: float | None) -> float:
    return x if threshold is None else min(threshold, x)


def vtrace_by_definition(log_rhos, discounts, rewards, values, bootstrap, rho_bar=1.0, pg_rho_bar=1.0,
                         c_bar=1.0, lam=1.0):
    """IMPALA Eq. 1 and the Sec. 4.2 advantage, as explicit sums and products (python floats)."""
    T, B = log_rhos.shape
    vs = torch.zeros(T, B, dtype=torch.float64)
    adv = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        V = [float(values[t, b]) for t in range(T)] + [float(bootstrap[b])]
        ratio = [math.exp(float(log_rhos[t, b])) for t in range(T)]
        gamma = [float(discounts[t, b]) for t in range(T)]
        r = [float(rewards[t, b]) for t in range(T)]
        delta = [_clip(ratio[t], rho_bar) * (r[t] + gamma[t] * V[t + 1] - V[t]) for t in range(T)]
        v = []
        for s in range(T):
            total = V[s]
            for t in range(s, T):
                weight = 1.0
                for i in range(s, t):
                    weight *= gamma[i] * lam * _clip(ratio[i], c_bar)
                total += weight * delta[t]
            v.append(total)
        v.append(V[T])
        for s in range(T):
            vs[s, b] = v[s]
            adv[s, b] = _clip(ratio[s], pg_rho_bar) * (r[s] + gamma[s] * v[s + 1] - V[s])
    return vs, adv


def random_inputs(T, B, seed):
    g = torch.Generator().manual_seed(seed)
    log_rhos = torch.rand(T, B, generator=g, dtype=torch.float64) * 3.0 - 1.5  # ratios on both sides of 1
    done = torch.rand(T, B, generator=g) < 0.2
    discounts = torch.where(done, 0.0, 0.9 + 0.1 * torch.rand(T, B, generator=g, dtype=torch.float64))
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    return log_rhos, discounts, rewards, values, bootstrap


@pytest.mark.parametrize("T,B,seed", [(1, 1, 0), (5, 3, 1), (12, 4, 2), (20, 2, 3)])
@pytest.mark.parametrize("thresholds", [(1.0, 1.0, 1.0, 1.0), (2.0, 0.5, 0.8, 0.9), (None, None, None, 1.0)])
def test_matches_definition(T, B, seed, thresholds):
    rho_bar, pg_rho_bar, c_bar, lam = thresholds
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(T, B, seed)
    assert (log_rhos > 0).any() or T * B < 3
    out = vtrace.from_importance_weights(
        log_rhos, discounts, rewards, values, bootstrap,
        clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar, clip_c_threshold=c_bar, lambda_=lam,
    )
    vs, adv = vtrace_by_definition(log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, c_bar, lam)
    torch.testing.assert_close(out.vs, vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, adv, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.log_rhos, log_rhos)


def test_episode_end_cuts_the_trace():
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(6, 2, 7)
    discounts[2] = 0.0
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    changed = rewards.clone()
    changed[3:] += 10.0
    bootstrap_changed = bootstrap + 10.0
    out2 = vtrace.from_importance_weights(log_rhos, discounts, changed, values, bootstrap_changed)
    torch.testing.assert_close(out.vs[:3], out2.vs[:3])
    assert not torch.allclose(out.vs[3:], out2.vs[3:])


def test_from_logits_matches_importance_weights_and_definition():
    T, B, A = 7, 3, 5
    g = torch.Generator().manual_seed(11)
    behaviour = torch.randn(T, B, A, generator=g, dtype=torch.float64)
    target = torch.randn(T, B, A, generator=g, dtype=torch.float64, requires_grad=True)
    actions = torch.randint(A, (T, B), generator=g)
    _, discounts, rewards, values, bootstrap = random_inputs(T, B, 12)
    values.requires_grad_(True)
    out = vtrace.from_logits(behaviour, target, actions, discounts, rewards, values, bootstrap)

    expected_target = torch.log_softmax(target.detach(), -1)
    expected_behaviour = torch.log_softmax(behaviour, -1)
    for t in range(T):
        for b in range(B):
            a = int(actions[t, b])
            assert out.target_action_log_probs[t, b] == pytest.approx(float(expected_target[t, b, a]))
            assert out.behaviour_action_log_probs[t, b] == pytest.approx(float(expected_behaviour[t, b, a]))
    log_rhos = out.target_action_log_probs - out.behaviour_action_log_probs
    torch.testing.assert_close(out.log_rhos, log_rhos)
    vs, adv = vtrace_by_definition(log_rhos, discounts, rewards, values.detach(), bootstrap)
    torch.testing.assert_close(out.vs, vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, adv, rtol=1e-10, atol=1e-10)
    # Targets are constants of the loss.
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad


@pytest.mark.parametrize("T,B", [(1, 2), (9, 3)])
def test_on_policy_targets_are_n_step_returns(T, B):
    A = 4
    g = torch.Generator().manual_seed(T)
    logits = torch.randn(T, B, A, generator=g, dtype=torch.float64)
    actions = torch.randint(A, (T, B), generator=g)
    _, discounts, rewards, values, bootstrap = random_inputs(T, B, 100 + T)
    out = vtrace.from_logits(logits, logits.clone(), actions, discounts, rewards, values, bootstrap)
    for b in range(B):
        for s in range(T):
            ret, factor = 0.0, 1.0
            for t in range(s, T):
                ret += factor * float(rewards[t, b])
                factor *= float(discounts[t, b])
            ret += factor * float(bootstrap[b])
            assert float(out.vs[s, b]) == pytest.approx(ret, abs=1e-10)
            next_v = float(out.vs[s + 1, b]) if s + 1 < T else float(bootstrap[b])
            expected_adv = float(rewards[s, b]) + float(discounts[s, b]) * next_v - float(values[s, b])
            assert float(out.pg_advantages[s, b]) == pytest.approx(expected_adv, abs=1e-10)


def test_shape_mismatch_is_reported():
    log_rhos, discounts, rewards, values, bootstrap = random_inputs(4, 2, 0)
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap[:1])
    with pytest.raises(ValueError, match="rewards"):
        vtrace.from_importance_weights(log_rhos, discounts, rewards[:3], values, bootstrap)


@pytest.mark.parametrize("closed_form_max", [vtrace.CLOSED_FORM_MAX_ENTRIES, 0])
def test_the_closed_form_and_the_recursion_both_match_the_definition(monkeypatch, closed_form_max):
    """At an unroll as long as the Atari presets' (T = 50) the sum of Eq. 1 taken at once (the
    default where every gamma c <= 1) and the backward recursion (past the closed form's size:
    ``CLOSED_FORM_MAX_ENTRIES`` 0) give the definition's targets; the two agree in float32 too."""
    monkeypatch.setattr(vtrace, "CLOSED_FORM_MAX_ENTRIES", closed_form_max)
    inputs = random_inputs(50, 2, 21)
    out = vtrace.from_importance_weights(*inputs)
    vs, adv = vtrace_by_definition(*inputs)
    torch.testing.assert_close(out.vs, vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, adv, rtol=1e-10, atol=1e-10)
    single = [x.float() for x in random_inputs(50, 32, 22)]
    closed = vtrace._discounted_sums(single[0], single[1], closed_form=True)
    recursion = vtrace._discounted_sums(single[0], single[1], closed_form=False)
    torch.testing.assert_close(closed, recursion, rtol=1e-5, atol=1e-5)


def test_the_closed_form_takes_a_few_ops_where_the_recursion_takes_four_a_step():
    """What the closed form is for: on a GPU each op is a kernel launch of the learner's update."""
    log_rhos, discounts, rewards, values, bootstrap = (x.float() for x in random_inputs(50, 32, 23))
    with torch.profiler.profile() as prof:
        vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap)
    top = [e for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    assert len(top) < 60, sorted(e.name for e in top)  # the recursion: 330
