"""The rollout store by hand: worker lives, state copied only where a rollout starts, the queue's
batches, pages handed back by gather and discard, and the store's size (acting through worker
processes into it, replayed: ``tests/e2e/test_acting_into_the_store.py``)."""

import threading

import torch

from fwrl.agents.model import AgentNet
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollout_queue import RolloutQueue
from fwrl.agents.rollouts import Rollout, RolloutSpec, RolloutStore, store_capacity
from fwrl.envs.step_record import StepRecord


# ----------------------------------------------------------------------------- the store by hand

def _env(v: float, k: int = 1, done: bool = False) -> dict[str, torch.Tensor]:
    return {"obs": torch.full((k, 1), float(v)), "reward": torch.zeros(k), "done": torch.full((k,), done),
            "episode_return": torch.zeros(k), "episode_step": torch.zeros(k, dtype=torch.int32),
            "task": torch.zeros(k, dtype=torch.int32), "truncated": torch.zeros(k, dtype=torch.bool),
            "bootstrap_value": torch.zeros(k)}


def _agent(k: int = 1) -> dict[str, torch.Tensor]:
    return {"action": torch.zeros(k, dtype=torch.int64), "policy_logits": torch.zeros(k, 2),
            "baseline": torch.zeros(k)}


def test_new_worker_life_drops_partial_rollout():
    store = RolloutStore(RolloutSpec(3, 1, StepRecord.of((1,), "float32"), 2), 1, torch.device("cpu"),
                         {"s": torch.zeros(1, 1)})
    state = {"s": torch.zeros(1, 1)}
    out: list[Rollout] = []
    for v in range(2):
        store.record([0], [0], _env(v), state, _agent(), 0, out.append)
    # the worker restarts: life 1; its first obs starts a fresh rollout
    for v in range(10, 14):
        store.record([0], [1], _env(v, done=(v == 10)), state, _agent(), 0, out.append)
    assert store.dropped_steps == 2
    assert len(out) == 1 and out[0].life == 1
    assert store.export(out[0]).tensors["obs"].flatten().tolist() == [10.0, 11.0, 12.0, 13.0]


def test_state_is_copied_only_when_a_rollout_starts():
    """Only slots starting a rollout have their state copied into the store, and what is copied
    is the state before that row's obs."""
    k = 2
    store = RolloutStore(RolloutSpec(3, k, StepRecord.of((1,), "float32"), 2), 2, torch.device("cpu"),
                         {"s": torch.zeros(1, 1)})
    out: list[Rollout] = []
    copies = []
    for step in range(8):
        state = {"s": torch.full((2 * k, 1), float(step))}
        before = store.state_copies
        store.record([0, 1], [0, 0], _env(step, 2 * k), state, _agent(2 * k), step, out.append)
        copies.append(store.state_copies - before)
    # rows 0 (start), 3 (T: the next rollout starts) and 6 (T again): both workers' K slots each
    assert copies == [4, 0, 0, 4, 0, 0, 4, 0]
    data = store.export(out[0])
    assert data.initial_state["s"].flatten().tolist() == [0.0, 0.0]
    assert store.export(out[2]).initial_state["s"].flatten().tolist() == [3.0, 3.0]  # before obs 3


def _three_finished_rollouts():
    """(store, queue, stop, free pages before) after three workers of K 3 each finished one rollout
    (T 2) whose rewards and initial state are the worker's number."""
    spec = RolloutSpec(2, 3, StepRecord.of((1,), "float32"), 2)
    store = RolloutStore(spec, 3, torch.device("cpu"), {"h": torch.zeros(1, 5)},
                         capacity=store_capacity(3, 3, 4, 4))
    stop = threading.Event()
    q = RolloutQueue(maxsize=4)
    free = store.free_pages
    for w in range(3):
        for row in range(3):
            env = _env(w, 3)
            env["reward"][:] = w
            store.record([w], [0], env, {"h": torch.full((3, 5), float(w))}, _agent(3), 0, lambda r: q.put(r, stop))
    return store, q, stop, free


def test_queue_batches_exact_columns_and_gather_hands_pages_back():
    store, q, stop, free = _three_finished_rollouts()
    assert store.free_pages == free - 3
    batch = store.gather(q.get_batch(4, stop))
    assert batch.tensors["reward"].shape == (3, 4) and batch.initial_state["h"].shape == (4, 5)
    assert batch.tensors["reward"][0].tolist() == [0, 0, 0, 1]
    assert store.free_pages == free - 2  # worker 0's page is fully read; worker 1's is split
    batch = store.gather(q.get_batch(4, stop))
    assert batch.tensors["reward"][0].tolist() == [1, 1, 2, 2]
    assert batch.initial_state["h"][:, 0].tolist() == [1, 1, 2, 2]
    assert store.free_pages == free - 1  # worker 2's last column waits in the queue
    stop.set()
    assert q.get_batch(4, stop) is None


def test_discard_hands_pages_back_unread_like_gather():
    """``discard`` (``fwrl bench throughput --acting-only``) frees a page once every one of its
    columns is gathered or discarded, as ``gather`` does, and the learner counts the discarded
    columns as agent steps without an update."""
    from fwrl.agents.learner import Learner, LearnerSettings

    store, q, stop, free = _three_finished_rollouts()
    model = AgentNet((1,), 2, "lstm", {"hidden_size": 5}, stem="mlp")
    learner = Learner(model, PolicyWeights(model), torch.optim.SGD(model.parameters(), lr=0.1), None,
                      LearnerSettings(), store)
    before = [p.detach().clone() for p in model.parameters()]
    assert learner.discard(q.get_batch(4, stop)) == {}
    assert store.free_pages == free - 2  # worker 0's page is free; worker 1's is split: one column left
    store.gather(q.get_batch(4, stop))  # worker 1's last column gathered, worker 2's page split again
    assert store.free_pages == free - 1
    assert learner.stats.agent_steps == 4 * 2 and learner.stats.updates == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_store_bytes_is_what_the_store_allocates():
    """The preflight's memory estimate (``store_bytes``) counts exactly the store's tensors."""
    from fwrl.agents.rollouts import store_bytes

    record = StepRecord.of((3, 5, 5), "uint8", 2)
    spec = RolloutSpec(7, 4, record, 6, ())
    model = AgentNet((3, 5, 5), 6, "delta_net", dict(hidden_size=8, num_heads=2, head_dim=4, ff_dim=8),
                     stem="minatar", extra_size=2)
    template = model.initial_state(1)
    store = RolloutStore(spec, 3, torch.device("cpu"), template, capacity=store_capacity(3, 4, 5, 3))
    allocated = sum(t.nbytes for t in store.tensors.values()) + sum(t.nbytes for t in store.initial_state.values())
    assert store_bytes(spec, store.capacity, template) == allocated
    assert store_bytes(spec, store.capacity, model.initial_state(1, "meta")) == allocated  # shapes only
