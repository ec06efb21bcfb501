"""Several learners on torch.distributed (gloo on the CPU): the sum of the ranks' gradients is one
learner's gradient on the union of their batches; stop votes; rank bookkeeping."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from fwrl.agents.distributed import LearnerGroup, Ranks, ranks_from_env, share
from fwrl.agents.learner import Learner
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Batch
from fwrl.settings.config import TrainConfig

T, B = 5, 2  # per rank


def _model() -> AgentNet:
    torch.manual_seed(0)
    return AgentNet((4,), 3, "lstm", {"hidden_size": 8}, stem="mlp")


def _batch(seed: int, columns: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "obs": torch.randn(T + 1, columns, 4, generator=g), "reward": torch.randn(T + 1, columns, generator=g),
        "done": torch.rand(T + 1, columns, generator=g) < 0.2, "action": torch.randint(3, (T + 1, columns), generator=g),
        "policy_logits": torch.randn(T + 1, columns, 3, generator=g), "baseline": torch.zeros(T + 1, columns),
    }
    state = {"h": torch.randn(columns, 1, 8, generator=g), "c": torch.randn(columns, 1, 8, generator=g)}
    return Batch(tensors, state, [[0] * (T + 1)], [columns])


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
        for name, value in single.state_dict().items():
            torch.testing.assert_close(r["state"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    # and it is not the mean: a learner stepping on the mean of the two gradients ends elsewhere
    assert any(not torch.allclose(ranks[0]["state"][n], v, atol=1e-4)
               for n, v in _mean_gradient_weights().items())


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


def test_ranks_from_launchers_and_shares():
    assert ranks_from_env({}) == Ranks(0, 1, 0)
    assert ranks_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "node1"}
    assert ranks_from_env(slurm) == Ranks(5, 8, 1)
    assert ranks_from_env({**slurm, "MASTER_ADDR": ""} | {"SLURM_NTASKS": "1"}) == Ranks()
    assert [share(10, Ranks(r, 4)) for r in range(4)] == [3, 3, 2, 2]
    assert sum(share(7, Ranks(r, 3)) for r in range(3)) == 7
    with pytest.raises(AssertionError):
        assert share(1, Ranks(1, 2)) >= 1  # too few workers for the ranks: the caller must refuse it
