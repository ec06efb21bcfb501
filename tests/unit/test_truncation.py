"""Time limits are not the end of the world: V-trace bootstraps where an episode was cut,
from the value of the cut episode's final observation, while the core still resets there.

Also the factored policy of MultiDiscrete action spaces (one categorical per dimension).
"""

import threading

import pytest
import torch

from fwrl.agents import policy
from fwrl.agents.inference import InferenceLoop
from fwrl.agents.losses import impala_loss, vtrace_returns
from fwrl.agents.model import AgentNet
from fwrl.agents.rollouts import RolloutSpec, RolloutStore
from fwrl.envs.local_workers import LocalWorkerPool
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import PoolSettings

R, G = 1.0, 0.9  # constant reward per step, discount


def _batch(T: int, cut: int, bootstrap: float) -> tuple[dict, dict]:
    """One column of T+1 rows, reward R everywhere; the episode is cut at row ``cut`` (done and
    truncated there), on-policy, every value R / (1 - G)."""
    value = R / (1 - G)
    batch = {
        "reward": torch.full((T + 1, 1), R), "done": torch.zeros(T + 1, 1, dtype=torch.bool),
        "truncated": torch.zeros(T + 1, 1, dtype=torch.bool), "bootstrap_value": torch.zeros(T + 1, 1),
        "action": torch.zeros(T + 1, 1, dtype=torch.int64), "policy_logits": torch.zeros(T + 1, 1, 2),
    }
    batch["done"][cut] = batch["truncated"][cut] = True
    batch["bootstrap_value"][cut] = bootstrap
    outputs = {"policy_logits": torch.zeros(T + 1, 1, 2), "baseline": torch.full((T + 1, 1), value)}
    return outputs, batch


def test_targets_before_a_cut_bootstrap_from_the_final_observation():
    T, cut = 8, 4  # the transition leaving obs 3 into obs 4 is the last of the cut episode
    value = R / (1 - G)
    outputs, batch = _batch(T, cut, bootstrap=value)
    vs = vtrace_returns(outputs, batch, discount=G).vs[:, 0]
    torch.testing.assert_close(vs, torch.full((T,), value))  # as if the episode went on
    # treated as the end of the world: the targets before the cut are the truncated sums
    ended = vtrace_returns(outputs, batch, discount=G, bootstrap_truncation=False).vs[:, 0]
    expected = [sum(R * G**k for k in range(cut - s)) for s in range(cut)]
    torch.testing.assert_close(ended[:cut], torch.tensor(expected))
    assert ended[cut - 1] == pytest.approx(R)  # not r / (1 - g)
    # after the cut both are the same (the next episode bootstraps from the rollout's end)
    torch.testing.assert_close(vs[cut:], ended[cut:])
    # a terminated episode (done, not truncated) never bootstraps
    batch["truncated"][cut] = False
    torch.testing.assert_close(vtrace_returns(outputs, batch, discount=G).vs[:, 0], ended)


def test_loss_uses_the_bootstrap_only_where_truncated():
    outputs, batch = _batch(8, 4, bootstrap=123.0)
    with_cut, _ = impala_loss(outputs, batch, discount=G)
    batch["truncated"][:] = False
    without, _ = impala_loss(outputs, batch, discount=G)
    assert with_cut.item() != pytest.approx(without.item())
    batch["bootstrap_value"][:] = 0.0  # no longer read
    assert impala_loss(outputs, batch, discount=G)[0].item() == pytest.approx(without.item())


def test_acting_records_the_value_of_the_final_observation_and_resets_after_the_cut():
    """Through real workers: at every truncated row the store holds done (the core resets there:
    replaying the rollout reproduces the acting outputs after it) and the acting weights' value
    of the cut episode's final observation, computed from the state the episode left."""
    length = 5  # memory:time_limit: the final obs of a cut episode is the phase length mod 4, reward 1
    torch.manual_seed(0)
    pool = LocalWorkerPool(PoolSettings(f"memory:time_limit?length={length}", 2, 2, seed=3))
    model = AgentNet((4,), 2, "lstm", {"hidden_size": 8}, stem="mlp").eval()
    store = RolloutStore(RolloutSpec(6, 2, StepRecord.of((4,), "float32"), 2), 2, torch.device("cpu"), model.initial_state(1))
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), threading.Lock())
    rollouts = []
    pool.start()
    try:
        while len(rollouts) < 6:
            loop.step(5.0, on_rollout=lambda r: (rollouts.append(store.export(r)), store.release(r)))
    finally:
        pool.close()
    final_obs = torch.eye(4)[length % 4]
    checked = 0
    for r in rollouts:
        t = r.tensors
        assert torch.equal(t["truncated"] & ~t["done"], torch.zeros_like(t["done"]))  # truncated => done
        with torch.no_grad():
            out, _ = model({k: t[k] for k in ("obs", "reward", "done")}, r.initial_state)
        torch.testing.assert_close(out["baseline"][:-1], t["baseline"][1:], rtol=1e-5, atol=1e-5)
        for row, col in t["truncated"].nonzero().tolist():
            if row == 0:
                continue  # its state is the previous rollout's
            with torch.no_grad():
                _, state = model({k: t[k][:row, col:col + 1] for k in ("obs", "reward", "done")},
                                 {k: v[col:col + 1] for k, v in r.initial_state.items()})
                out, _ = model({"obs": final_obs.view(1, 1, 4), "reward": torch.ones(1, 1),
                                "done": torch.zeros(1, 1, dtype=torch.bool)}, state)
            assert t["bootstrap_value"][row, col].item() == pytest.approx(out["baseline"].item(), abs=1e-5)
            checked += 1
        rest = ~t["truncated"]
        assert (t["bootstrap_value"][rest] == 0).all()
    assert checked >= 4


# ----------------------------------------------------------------------------- MultiDiscrete

def test_factored_log_prob_and_entropy_match_a_direct_computation():
    torch.manual_seed(0)
    dims = (3, 2, 4)
    logits = torch.randn(5, 6, sum(dims))
    actions = torch.stack([torch.randint(d, (5, 6)) for d in dims], dim=-1)
    dists = [torch.distributions.Categorical(logits=part) for part in torch.split(logits, dims, dim=-1)]
    expected_lp = sum(d.log_prob(actions[..., i]) for i, d in enumerate(dists))
    expected_h = sum(d.entropy() for d in dists)
    torch.testing.assert_close(policy.log_prob(logits, actions, dims), expected_lp)
    torch.testing.assert_close(policy.entropy(logits, dims), expected_h)
    # one dimension: the plain categorical
    single = torch.distributions.Categorical(logits=logits[..., :3])
    torch.testing.assert_close(policy.log_prob(logits[..., :3], actions[..., 0]), single.log_prob(actions[..., 0]))
    torch.testing.assert_close(policy.entropy(logits[..., :3]), single.entropy())


def test_factored_sampling_and_the_loss_with_multi_discrete_actions():
    torch.manual_seed(0)
    dims = (3, 2)
    model = AgentNet((4,), sum(dims), "lstm", {"hidden_size": 8}, stem="mlp", action_dims=dims)
    T, B = 5, 3
    inputs = {"obs": torch.randn(T + 1, B, 4), "reward": torch.zeros(T + 1, B),
              "done": torch.zeros(T + 1, B, dtype=torch.bool)}
    out, _ = model(inputs, model.initial_state(B))
    assert out["action"].shape == (T + 1, B, 2)
    assert (out["action"][..., 0] < 3).all() and (out["action"][..., 1] < 2).all()
    batch = {**inputs, "action": out["action"].detach(), "policy_logits": out["policy_logits"].detach()}
    loss, _ = impala_loss(out, batch, action_dims=dims)
    loss.backward()
    assert model.policy.weight.grad is not None and model.policy.weight.grad.abs().sum() > 0
    greedy, _ = model(inputs, model.initial_state(B), greedy=True)
    logits = out["policy_logits"].detach()
    assert torch.equal(greedy["action"][..., 0], logits[..., :3].argmax(-1))
    assert torch.equal(greedy["action"][..., 1], logits[..., 3:].argmax(-1))
