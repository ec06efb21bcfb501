"""The IMPALA loss on hand-made batches, and the optimiser / LR schedule."""

from __future__ import annotations

import math

import pytest
import torch

from fwrl.agents.losses import impala_loss
from fwrl.agents.optim import clip_grad_norm, linear_decay_lr, linear_decay_scheduler, make_optimizer
from fwrl.errors import FwrlError

T, B, A = 3, 2, 3


def make_batch(seed: int = 0):
    """A [T+1, B] rollout and learner outputs whose every step differs."""
    g = torch.Generator().manual_seed(seed)
    batch = {
        "reward": torch.tensor([[9.0, -9.0], [0.5, 3.0], [-2.0, 0.25], [1.5, -0.75]], dtype=torch.float64),
        "done": torch.tensor([[False, True], [False, False], [True, False], [False, False]]),
        "action": torch.tensor([[2, 1], [0, 2], [1, 1], [2, 0]]),
        "policy_logits": torch.randn(T + 1, B, A, generator=g, dtype=torch.float64),
        "baseline": torch.randn(T + 1, B, generator=g, dtype=torch.float64),
    }
    learner = {
        "policy_logits": torch.randn(T + 1, B, A, generator=g, dtype=torch.float64).requires_grad_(),
        "baseline": torch.randn(T + 1, B, generator=g, dtype=torch.float64).requires_grad_(),
    }
    return learner, batch


def log_softmax_list(logits):
    m = max(logits)
    z = m + math.log(sum(math.exp(x - m) for x in logits))
    return [x - z for x in logits]


def expected_loss(learner, batch, discount=0.99, baseline_cost=0.5, entropy_cost=0.01, clip=1.0):
    """The loss computed by hand with loops: learner step t pairs with batch step t+1.

    Returns (total, pg, baseline, entropy, advantages, targets), the last two keyed by (t, b).
    """
    learner = {k: v.detach() for k, v in learner.items()}
    pg = base = ent = 0.0
    advantages, targets = {}, {}
    for b in range(B):
        V = [float(learner["baseline"][t, b]) for t in range(T + 1)]  # V[T] bootstraps
        logp = [log_softmax_list([float(x) for x in learner["policy_logits"][t, b]]) for t in range(T)]
        mu = [log_softmax_list([float(x) for x in batch["policy_logits"][t + 1, b]]) for t in range(T)]
        a = [int(batch["action"][t + 1, b]) for t in range(T)]
        r = [max(-clip, min(clip, float(batch["reward"][t + 1, b]))) for t in range(T)]
        gamma = [0.0 if bool(batch["done"][t + 1, b]) else discount for t in range(T)]
        ratio = [math.exp(logp[t][a[t]] - mu[t][a[t]]) for t in range(T)]
        rho = [min(1.0, x) for x in ratio]
        delta = [rho[t] * (r[t] + gamma[t] * V[t + 1] - V[t]) for t in range(T)]
        vs = []
        for s in range(T):
            v = V[s]
            for t in range(s, T):
                w = 1.0
                for i in range(s, t):
                    w *= gamma[i] * rho[i]
                v += w * delta[t]
            vs.append(v)
        vs.append(V[T])
        for t in range(T):
            adv = rho[t] * (r[t] + gamma[t] * vs[t + 1] - V[t])
            advantages[t, b] = adv
            targets[t, b] = vs[t]
            pg += -logp[t][a[t]] * adv
            base += baseline_cost * 0.5 * (vs[t] - V[t]) ** 2
            ent += entropy_cost * sum(math.exp(lp) * lp for lp in logp[t])
    return pg + base + ent, pg, base, ent, advantages, targets


def test_loss_equals_hand_computed_terms():
    learner, batch = make_batch()
    total, stats = impala_loss(learner, batch)
    exp_total, exp_pg, exp_base, exp_ent, _, _ = expected_loss(learner, batch)
    assert total.item() == pytest.approx(exp_total, rel=1e-9)
    assert stats["pg_loss"] == pytest.approx(exp_pg, rel=1e-9)
    assert stats["baseline_loss"] == pytest.approx(exp_base, rel=1e-9)
    assert stats["entropy_loss"] == pytest.approx(exp_ent, rel=1e-9)
    assert stats["total_loss"] == pytest.approx(exp_total, rel=1e-9)
    assert all(isinstance(v, float) for v in stats.values())


def test_entropy_stat_is_the_mean_entropy_per_step_whatever_the_cost():
    learner, batch = make_batch()
    by_hand = 0.0
    for b in range(B):
        for t in range(T):
            logp = log_softmax_list([float(x) for x in learner["policy_logits"][t, b].detach()])
            by_hand -= sum(math.exp(lp) * lp for lp in logp)
    by_hand /= T * B
    for cost in (0.01, 0.0):
        _, stats = impala_loss(learner, batch, entropy_cost=cost)
        assert stats["entropy"] == pytest.approx(by_hand, rel=1e-9)
    assert 0.0 < by_hand <= math.log(learner["policy_logits"].shape[-1])


def test_loss_costs_and_discount_are_used():
    learner, batch = make_batch(3)
    kwargs = dict(discount=0.9, baseline_cost=0.25, entropy_cost=0.1)
    total, _ = impala_loss(learner, batch, **kwargs)
    assert total.item() == pytest.approx(expected_loss(learner, batch, **kwargs)[0], rel=1e-9)


def test_alignment_drops_first_batch_step_and_last_learner_step():
    learner, batch = make_batch(1)
    total, _ = impala_loss(learner, batch)
    # The same numbers paired without the shift (learner t with batch t) give a different loss,
    # so the hand-computed match above pins the alignment.
    shifted = {k: torch.cat([v[1:], v[-1:]]) for k, v in batch.items()}
    exp_shifted = expected_loss(learner, shifted)[0]
    assert total.item() != pytest.approx(exp_shifted, rel=1e-6)
    # Step 0 of the batch and step T of the learner logits do not enter the loss at all...
    changed_batch = {k: v.clone() for k, v in batch.items()}
    changed_batch["reward"][0] = 0.3
    changed_batch["done"][0] = ~changed_batch["done"][0]
    changed_batch["action"][0] = (changed_batch["action"][0] + 1) % A
    changed_batch["policy_logits"][0] += 5.0
    changed_learner = dict(learner)
    changed_learner["policy_logits"] = learner["policy_logits"].detach().clone()
    changed_learner["policy_logits"][-1] += 5.0
    total2, _ = impala_loss(changed_learner, changed_batch)
    assert total2.item() == pytest.approx(total.item(), rel=1e-12)
    # ...while the learner baseline at step T is the bootstrap value.
    changed_learner["baseline"] = learner["baseline"].detach().clone()
    changed_learner["baseline"][-1] += 1.0
    total3, _ = impala_loss(changed_learner, changed_batch)
    assert total3.item() != pytest.approx(total.item(), rel=1e-6)
    assert total3.item() == pytest.approx(expected_loss(changed_learner, changed_batch)[0], rel=1e-9)


def test_rewards_are_clipped():
    learner, batch = make_batch(2)
    total, _ = impala_loss(learner, batch)
    clipped = dict(batch, reward=batch["reward"].clamp(-1.0, 1.0))
    total_clipped, _ = impala_loss(learner, clipped)
    assert total.item() == pytest.approx(total_clipped.item(), rel=1e-12)
    unclipped, _ = impala_loss(learner, batch, reward_clip=None)
    assert unclipped.item() != pytest.approx(total.item(), rel=1e-6)
    assert unclipped.item() == pytest.approx(expected_loss(learner, batch, clip=math.inf)[0], rel=1e-9)


def test_policy_gradient_treats_targets_as_constants():
    learner, batch = make_batch(4)
    total, _ = impala_loss(learner, batch, baseline_cost=0.0, entropy_cost=0.0)
    total.backward()
    # vs and the advantages depend on the learner's baseline; no gradient may flow there.
    assert torch.count_nonzero(learner["baseline"].grad) == 0
    # d/dlogits of sum -log pi(a) * adv = (softmax - onehot(a)) * adv, with adv a constant.
    _, _, _, _, advantages, _ = expected_loss(learner, batch)
    probs = torch.softmax(learner["policy_logits"].detach(), -1)
    expected = torch.zeros_like(probs)
    for t in range(T):
        for b in range(B):
            onehot = torch.nn.functional.one_hot(batch["action"][t + 1, b], A).to(probs.dtype)
            expected[t, b] = (probs[t, b] - onehot) * advantages[t, b]
    torch.testing.assert_close(learner["policy_logits"].grad, expected)


def test_baseline_gradient_is_regression_to_constant_targets():
    learner, batch = make_batch(5)
    total, _ = impala_loss(learner, batch, baseline_cost=0.5, entropy_cost=0.0)
    total.backward()
    # The pg term sends nothing to the baseline (test above), so this is the gradient of
    # 0.5 * cost * sum (vs - V)^2 with vs constant: cost * (V_t - vs_t), and 0 at the bootstrap
    # step (vs depends on it, but vs is a constant).
    _, _, _, _, _, targets = expected_loss(learner, batch)
    V = learner["baseline"].detach()
    expected = torch.zeros_like(V)
    for t in range(T):
        for b in range(B):
            expected[t, b] = 0.5 * (V[t, b] - targets[t, b])
    torch.testing.assert_close(learner["baseline"].grad, expected)


def test_missing_key_is_named():
    learner, batch = make_batch()
    del batch["done"]
    with pytest.raises(KeyError, match="done"):
        impala_loss(learner, batch)


def test_make_optimizer_defaults():
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.RMSprop)
    group = opt.param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"]) == (6e-4, 0.99, 0.01, 0.0)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_steps_and_saves_as_torchs_own(momentum):
    """fwrl's RMSprop (torch's without the torch.compile guards) takes the same steps as
    torch.optim.RMSprop, and each loads the other's state (checkpoints of either kind resume)."""
    torch.manual_seed(0)
    grads = [torch.randn(4, 3, dtype=torch.float64) for _ in range(5)]
    ours = torch.nn.Parameter(torch.ones(4, 3, dtype=torch.float64))
    theirs = torch.nn.Parameter(torch.ones(4, 3, dtype=torch.float64))
    opt = make_optimizer([ours], lr=1e-2, momentum=momentum)
    ref = torch.optim.RMSprop([theirs], lr=1e-2, alpha=0.99, eps=0.01, momentum=momentum)
    with torch.enable_grad():  # the step itself records no graph, as torch's does not
        for g in grads[:3]:
            for p, o in ((ours, opt), (theirs, ref)):
                p.grad = g.clone()
                o.step()
                o.zero_grad()
                assert p.grad is None
    assert ours.grad_fn is None and torch.equal(ours.detach(), theirs.detach())
    mine, torchs = make_optimizer([ours], lr=1e-2, momentum=momentum), torch.optim.RMSprop(
        [theirs], lr=1e-2, alpha=0.99, eps=0.01, momentum=momentum)
    mine.load_state_dict(ref.state_dict())  # each resumes from the other's state
    torchs.load_state_dict(opt.state_dict())
    for g in grads[3:]:
        for p, o in ((ours, mine), (theirs, torchs)):
            p.grad = g.clone()
            o.step()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=0)


def _bias_corrected_rmsprop_by_hand(grads, lr, alpha, eps):
    """The parameter after each update of Adam-style bias-corrected RMSProp (eps outside the root)."""
    p, v, out = torch.zeros_like(grads[0]), torch.zeros_like(grads[0]), []
    for n, g in enumerate(grads, start=1):
        v = alpha * v + (1 - alpha) * g * g
        p = p - lr * g / ((v / (1 - alpha ** n)).sqrt() + eps)
        out.append(p.clone())
    return out


def test_bias_corrected_rmsprop_is_the_formula_and_resumes():
    torch.manual_seed(0)
    grads = [torch.randn(5, dtype=torch.float64) * s for s in (0.001, 3.0, 0.02, 1.0, 0.5, 7.0)]
    expected = _bias_corrected_rmsprop_by_hand(grads, lr=1e-2, alpha=0.99, eps=0.01)
    param = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt = make_optimizer([param], lr=1e-2, bias_correction=True)
    for g, want in zip(grads[:3], expected[:3]):
        param.grad = g.clone()
        opt.step()
        torch.testing.assert_close(param.detach(), want)
    assert opt.param_groups[0]["lr"] == 1e-2 and opt.param_groups[0]["eps"] == 0.01  # restored after each step
    # a resumed optimiser goes on with the same correction (its update count is in the state)
    param2 = torch.nn.Parameter(param.detach().clone())
    opt2 = make_optimizer([param2], lr=1e-2, bias_correction=True)
    opt2.load_state_dict(opt.state_dict())
    for g, want in zip(grads[3:], expected[3:]):
        param2.grad = g.clone()
        opt2.step()
        torch.testing.assert_close(param2.detach(), want)
    # the first step is about lr per coordinate (|g| >> eps), not the plain RMSprop's 10x
    plain = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt3 = make_optimizer([plain], lr=1e-2)
    plain.grad = grads[1].clone()
    opt3.step()
    corrected = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt4 = make_optimizer([corrected], lr=1e-2, bias_correction=True)
    corrected.grad = grads[1].clone()
    opt4.step()
    assert corrected.abs().max() < 1.01e-2 < 9e-2 < plain.abs().min()


def test_linear_decay_reaches_zero_at_total_steps():
    param = torch.nn.Parameter(torch.zeros(2))
    opt = make_optimizer([param], lr=1e-3)
    sched = linear_decay_scheduler(opt, total_steps=1000, steps_per_update=100)
    lrs = [sched.get_last_lr()[0]]
    for _ in range(12):
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    expected = [1e-3 * (1 - min(k * 100, 1000) / 1000) for k in range(13)]
    assert lrs == pytest.approx(expected, abs=1e-15)
    assert lrs[10] == 0.0 and lrs[12] == 0.0
    assert linear_decay_lr(1e-3, 250, 1000) == pytest.approx(7.5e-4)


def test_schedule_resumes_from_state_and_from_step_count():
    def run(updates, opt, sched, param):
        lrs = []
        for _ in range(updates):
            param.grad = torch.ones_like(param)
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        return lrs

    param = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer([param])
    sched = linear_decay_scheduler(opt, total_steps=5000, steps_per_update=250)
    uninterrupted = run(4, opt, sched, param)
    opt_state, sched_state = opt.state_dict(), sched.state_dict()
    uninterrupted += run(5, opt, sched, param)

    # Resume: a fresh optimiser and scheduler, state restored as from a checkpoint.
    param2 = torch.nn.Parameter(torch.zeros(3))
    opt2 = make_optimizer([param2])
    sched2 = linear_decay_scheduler(opt2, total_steps=5000, steps_per_update=250)
    opt2.load_state_dict(opt_state)
    sched2.load_state_dict(sched_state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(uninterrupted[3], abs=1e-15)
    assert run(5, opt2, sched2, param2) == pytest.approx(uninterrupted[4:], abs=1e-15)

    # Resume from the agent-step count alone.
    opt3 = make_optimizer([torch.nn.Parameter(torch.zeros(3))])
    linear_decay_scheduler(opt3, total_steps=5000, steps_per_update=250, agent_steps=4 * 250)
    assert opt3.param_groups[0]["lr"] == pytest.approx(uninterrupted[3], abs=1e-15)


def test_schedule_rejects_bad_totals():
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(FwrlError, match="total steps"):
        linear_decay_scheduler(opt, total_steps=0, steps_per_update=10)


def test_clip_grad_norm_scales_to_40():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.full((3,), 30.0)
    b.grad = torch.full((4,), 40.0)
    norm = clip_grad_norm([a, b])
    expected_norm = math.sqrt(3 * 900 + 4 * 1600)
    assert float(norm) == pytest.approx(expected_norm)
    clipped = math.sqrt(float((a.grad ** 2).sum() + (b.grad ** 2).sum()))
    assert clipped == pytest.approx(40.0, rel=1e-5)
    a.grad = torch.full((3,), 1.0)
    b.grad = None
    clip_grad_norm([a, b])
    torch.testing.assert_close(a.grad, torch.ones(3))
