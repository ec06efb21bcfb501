"""Rollout assembly: overlap row, initial core state, resets on done, worker lives.

The strongest check: re-running the model over an assembled rollout from its
recorded initial state reproduces, row by row, the behaviour logits that
inference computed while acting (row t+1 holds the output for obs t). That
only holds if row 0 repeats the previous rollout's last row, the initial state
is the state before row 0, and the core resets where ``done`` says so.
"""

import threading

import pytest
import torch

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.model import AgentNet
from fwrl.agents.rollouts import Rollout, RolloutAssembler, RolloutQueue, RolloutSpec, collate
from fwrl.envs.local_workers import LocalWorkerPool

T = 6


def _collect(core: str, core_options: dict, n: int, env="memory:cue_delay?delay=2&num_cues=3", backend=None):
    """``n`` rollouts of acting with the model through a pool of ``backend`` (default: local)."""
    torch.manual_seed(0)
    pool = backend.pool(env, 2, 2, seed=5) if backend is not None else LocalWorkerPool(env, 2, 2, seed=5)
    model = AgentNet((4,), 3, core, core_options, stem="mlp")
    assembler = RolloutAssembler(RolloutSpec(T, 2, (4,), torch.float32, 3), 2)
    loop = InferenceLoop(model, pool, assembler, torch.device("cpu"), threading.Lock())
    rollouts: list[Rollout] = []
    pool.start()
    try:
        while len(rollouts) < n:
            loop.step(5.0, on_rollout=rollouts.append)
    finally:
        pool.close()
    return model, rollouts


@pytest.mark.parametrize("core,opts", [
    ("lstm", {"hidden_size": 16}),
    ("delta_net", {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16}),
])
def test_replay_from_initial_state_matches_acting(core, opts, backend):
    model, rollouts = _collect(core, opts, 8, backend=backend)
    saw_inner_reset = False
    for r in rollouts:
        saw_inner_reset |= bool(r.tensors["done"][1:].any())
        with torch.no_grad():
            out, _ = model({k: r.tensors[k] for k in ("obs", "reward", "done")}, r.initial_state)
        torch.testing.assert_close(out["policy_logits"][:-1], r.tensors["policy_logits"][1:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["baseline"][:-1], r.tensors["baseline"][1:], rtol=1e-5, atol=1e-5)
    assert saw_inner_reset, "episodes of 4 steps must end inside rollouts of 6"


def test_overlap_row_and_shapes():
    _, rollouts = _collect("lstm", {"hidden_size": 8}, 6)
    by_worker: dict[int, list[Rollout]] = {}
    for r in rollouts:
        assert r.tensors["obs"].shape == (T + 1, 2, 4)
        by_worker.setdefault(r.worker, []).append(r)
    pairs = 0
    for seq in by_worker.values():
        for prev, nxt in zip(seq, seq[1:]):
            for key in prev.tensors:
                torch.testing.assert_close(nxt.tensors[key][0], prev.tensors[key][-1])
            pairs += 1
    assert pairs >= 2


def test_first_rollout_starts_fresh_and_actions_match_rewards():
    _, rollouts = _collect("lstm", {"hidden_size": 8}, 2, env="memory:cue_delay?delay=0&num_cues=3")
    first = rollouts[0]
    assert first.tensors["done"][0].all(), "the very first obs starts an episode"
    for name, value in first.initial_state.items():
        assert torch.count_nonzero(value) == 0, name
    # delay=0: obs 0 shows the cue, obs 1 is the query; the action recorded at the
    # row after the query is rewarded iff it equals the cue.
    t = first.tensors
    for row in range(T + 1):
        for col in range(2):
            if t["done"][row, col] and row >= 2 and not t["done"][row - 1, col]:
                cue = int(t["obs"][row - 2, col, :3].argmax())
                assert t["reward"][row, col].item() == float(t["action"][row, col].item() == cue)


def test_new_worker_life_drops_partial_rollout():
    spec = RolloutSpec(3, 1, (1,), torch.float32, 2)
    asm = RolloutAssembler(spec, 1)
    state = {"s": torch.zeros(1, 1)}
    env = lambda v, done=False: {  # noqa: E731
        "obs": torch.full((1, 1), float(v)), "reward": torch.zeros(1), "done": torch.tensor([done]),
        "episode_return": torch.zeros(1), "episode_step": torch.zeros(1, dtype=torch.int32),
        "task": torch.zeros(1, dtype=torch.int32)}
    agent = {"action": torch.zeros(1, dtype=torch.int64), "policy_logits": torch.zeros(1, 2), "baseline": torch.zeros(1)}
    for v in range(2):
        assert asm.add_env_output(0, 0, env(v), state) is None
        asm.add_agent_output(0, agent)
    # the worker restarts: life 1; its first obs starts a fresh rollout
    out = []
    for v in range(10, 14):
        r = asm.add_env_output(0, 1, env(v, done=(v == 10)), state)
        if r is not None:
            out.append(r)
        asm.add_agent_output(0, agent)
    assert asm.dropped_steps == 2
    assert len(out) == 1 and out[0].life == 1
    assert out[0].tensors["obs"].flatten().tolist() == [10.0, 11.0, 12.0, 13.0]


def test_queue_batches_exact_columns_and_collate():
    spec = RolloutSpec(2, 3, (1,), torch.float32, 2)
    stop = threading.Event()
    q = RolloutQueue(maxsize=4)
    for w in range(3):
        tensors = spec.empty()
        tensors["reward"][:] = w
        q.put(Rollout(tensors, {"h": torch.full((3, 5), float(w))}, w, 0), stop)
    pieces = q.get_batch(4, stop)
    batch, state = collate(pieces, torch.device("cpu"))
    assert batch["reward"].shape == (3, 4) and state["h"].shape == (4, 5)
    assert batch["reward"][0].tolist() == [0, 0, 0, 1]
    pieces = q.get_batch(4, stop)
    batch, state = collate(pieces, torch.device("cpu"))
    assert batch["reward"][0].tolist() == [1, 1, 2, 2] and state["h"][:, 0].tolist() == [1, 1, 2, 2]
    stop.set()
    assert q.get_batch(4, stop) is None
