"""Several learners on torch.distributed (gloo on the CPU, two rank processes): the sum of the ranks'
gradients is one learner's gradient on the union of their batches; stop votes. The rank bookkeeping
(no processes) is tests/unit/test_multi_learner.py's."""

import os
import socket

import torch
import torch.multiprocessing as mp

from fwrl.agents.distributed import LearnerGroup, Ranks
from fwrl.agents.learner import Learner
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Batch
from fwrl.settings.config import TrainConfig

T, B = 5, 2  # per rank
# The ranks and the single learner compute in float64: the ranks sum their gradients after each
# backward, the single learner inside its matrix products, so the two differ by the rounding of
# those sums in another order, amplified by RMSProp (its step is lr g / (sqrt(v) + eps): a relative
# error of g is the same relative error of a step of up to ~0.1 at the first update). In float32
# that was 1.08e-6 on an AVX-512 CPU (against an atol of 1e-6); float64's unit round-off is 2^29
# (5e8) times smaller, so the same amplification gives ~1e-14. TOLERANCE leaves four orders of
# magnitude above that for any CPU's summation order, and the mean-gradient learner (a real
# difference: half the gradient) is ~1e-2 away, eight orders above it.
TOLERANCE = 1e-10
DTYPE = torch.float64


def _model() -> AgentNet:
    torch.manual_seed(0)
    return AgentNet((4,), 3, "lstm", {"hidden_size": 8}, stem="mlp").to(DTYPE)


def _batch(seed: int, columns: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "obs": torch.randn(T + 1, columns, 4, generator=g, dtype=DTYPE),
        "reward": torch.randn(T + 1, columns, generator=g, dtype=DTYPE),
        "done": torch.rand(T + 1, columns, generator=g) < 0.2, "action": torch.randint(3, (T + 1, columns), generator=g),
        "policy_logits": torch.randn(T + 1, columns, 3, generator=g, dtype=DTYPE),
        "baseline": torch.zeros(T + 1, columns, dtype=DTYPE),
    }
    state = {"h": torch.randn(columns, 1, 8, generator=g, dtype=DTYPE),
             "c": torch.randn(columns, 1, 8, generator=g, dtype=DTYPE)}
    return Batch(tensors, state, [[0] * (T + 1)], [columns])


def _largest_difference(a: dict, b: dict) -> tuple[float, str]:
    """The largest absolute difference between two state dicts' floating tensors, and where."""
    return max(((a[n] - b[n]).abs().max().item(), n) for n in a if a[n].is_floating_point())


def _union(a: Batch, b: Batch) -> Batch:
    return Batch({k: torch.cat([a.tensors[k], b.tensors[k]], 1) for k in a.tensors},
                 {k: torch.cat([a.initial_state[k], b.initial_state[k]], 0) for k in a.initial_state},
                 a.versions, [a.widths[0] + b.widths[0]])


def _learner(model: AgentNet, group=None, world: int = 1) -> Learner:
    config = TrainConfig(learning_rate=1e-2, grad_norm_clip=40.0)
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate)
    scheduler = linear_decay_scheduler(optimizer, 10_000, T * B * world)
    return Learner(model, PolicyWeights(_model()), optimizer, scheduler, config.learner_settings(), None, group=group)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, out: str, steps: int, stop_rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    group = LearnerGroup(Ranks(rank, world, rank), torch.device("cpu"), timeout=60)
    model = _model()
    learner = _learner(model, group, world)
    results = []
    for step in range(steps):
        if rank == stop_rank and step == steps - 1:
            learner.vote_stop()
            results.append(None)
            continue
        results.append(learner.update_batch(_batch(100 * step + rank, B)))
    group.check_same_weights(model)
    torch.save({"state": model.state_dict(), "stepped": [r is not None for r in results],
                "agent_steps": learner.stats.agent_steps}, f"{out}/rank{rank}.pt")
    group.close()


def _run_ranks(tmp_path, steps: int, stop_rank: int = -1) -> list[dict]:
    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path), steps, stop_rank), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]


def test_two_ranks_step_like_one_learner_on_the_union_of_their_batches(tmp_path):
    ranks = _run_ranks(tmp_path, steps=3)
    single = _model()
    learner = _learner(single, world=2)  # same schedule: T x B x 2 agent steps per update
    for step in range(3):
        learner.update_batch(_union(_batch(100 * step, B), _batch(100 * step + 1, B)))
    for r in ranks:
        assert r["stepped"] == [True, True, True] and r["agent_steps"] == 3 * T * B * 2
        assert r["state"]["core.lstm.weight_ih_l0"].dtype == DTYPE
        difference, where = _largest_difference(r["state"], single.state_dict())
        assert difference <= TOLERANCE, f"rank weights differ from the single learner's by {difference:.3g} in {where}"
    # and the same check fails a real difference: a learner stepping on the mean of the two
    # gradients ends far outside the tolerance
    difference, where = _largest_difference(ranks[0]["state"], _mean_gradient_weights())
    assert difference > 1e6 * TOLERANCE, f"the mean-gradient learner is only {difference:.3g} away ({where})"


def _mean_gradient_weights() -> dict:
    """The weights after the same three updates on the mean of the two ranks' gradients."""
    from fwrl.agents.losses import impala_loss

    model = _model()
    learner = _learner(model, world=2)
    for step in range(3):
        union = _union(_batch(100 * step, B), _batch(100 * step + 1, B))
        outputs, _ = model(union.tensors, union.initial_state)
        loss, _ = impala_loss(outputs, union.tensors)
        learner.optimizer.zero_grad()
        (loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(learner.params, 40.0)
        learner.optimizer.step()
        learner.scheduler.step()
    return model.state_dict()


def test_a_stop_vote_stops_every_rank_after_the_same_update(tmp_path):
    ranks = _run_ranks(tmp_path, steps=3, stop_rank=1)
    for r in ranks:
        assert r["stepped"] == [True, True, False] and r["agent_steps"] == 2 * T * B * 2
    for name, value in ranks[0]["state"].items():
        torch.testing.assert_close(ranks[1]["state"][name], value)
