"""Acting through env worker processes into the rollout store, and replaying what was stored: the
overlap row, the initial core state, resets on done, worker lives, acting threads, policy versions,
and core state that stays where it is (the store by hand: ``tests/unit/test_rollouts.py``).

The strongest check: re-running the model over a stored rollout from its
recorded initial state reproduces, row by row, the behaviour logits that
inference computed while acting (row t+1 holds the output for obs t). That
only holds if row 0 repeats the previous rollout's last row, the initial state
is the state before row 0, and the core resets where ``done`` says so.
"""

import threading

import pytest
import torch
from torch.overrides import TorchFunctionMode
from rollout_replay import CUE, T, assert_replay_matches, collect

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.model import AgentNet
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Rollout, RolloutData, RolloutSpec, RolloutStore
from fwrl.envs.local_workers import LocalWorkerPool
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import PoolSettings

# worker 0 raises on every 9th step of each life: restarts in the middle of rollouts
RESTARTING = "chaos:cue_delay?delay=2&num_cues=3&raise_every=9&only_worker=0"

CORES = {
    "lstm": {"hidden_size": 16},
    "gru": {"hidden_size": 16},
    "delta_net": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "srwm": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "elstm": {"hidden_size": 8, "grad": "rtrl"},
}

def _piece(rollout: Rollout, start: int, stop: int):
    from fwrl.agents.rollouts import RolloutPiece

    return RolloutPiece(rollout, start, stop)


@pytest.mark.parametrize("core", sorted(CORES))
def test_replay_from_initial_state_matches_acting(core):
    """With episode ends inside rollouts and worker restarts in the middle of them."""
    model, rollouts, store, loop = collect(core, CORES[core], 8, env=RESTARTING,
                                            until=lambda rs: any(r.worker == 0 and r.life > 0 for r in rs))
    assert assert_replay_matches(model, rollouts), "episodes of 4 steps must end inside rollouts of 6"
    assert loop.restarts_seen >= 1 and store.dropped_steps > 0
    assert {r.life for r in rollouts if r.worker == 0} >= {0, 1}, "rollouts of two lives of worker 0"


# every worker raises on every 9th step of each life: restarts in both acting threads' slices
RESTARTING_ALL = "chaos:cue_delay?delay=2&num_cues=3&raise_every=9"


@pytest.mark.parametrize("core,staging", [("lstm", "pack"), ("delta_net", "pack"), ("lstm", "shared")])
def test_replay_matches_acting_with_two_acting_threads(core, staging):
    """Two acting threads, each stepping its own slice of the workers, write one store at once
    (``fwrl.runner.acting``): every rollout still replays from its initial state to the very
    outputs acting computed, across episode ends and worker restarts in both slices; with
    ``staging="shared"`` both threads read the observations from the workers' shared arrays
    (each result checked to be its worker's rows there)."""
    model, rollouts, store, loops = collect(
        core, CORES[core], 12, env=RESTARTING_ALL, workers=4, threads=2,
        until=lambda rs: {r.worker for r in rs if r.life > 0} >= {0, 3}, staging=staging)
    assert all((loop._staging.shared is not None) == (staging == "shared") for loop in loops)
    assert assert_replay_matches(model, rollouts)
    assert {r.worker for r in rollouts} == {0, 1, 2, 3}
    assert all(loop.restarts_seen >= 1 for loop in loops), "each thread saw a restart of one of its workers"
    assert store.dropped_steps > 0
    assert sum(loop.agent_steps for loop in loops) >= 12 * T * 2


def test_replay_matches_acting_on_atari_frames():
    """uint8 frames go into the store as int32 words (``rollouts._words``): the learner must see
    the very frames the actors saw (Pong, nature stem)."""
    pytest.importorskip("ale_py", reason="needs the Atari envs (pip install 'fwrl[atari]')")
    model, rollouts, _, _ = collect("lstm", {"hidden_size": 16}, 4, env="atari:Pong",
                                     obs=((4, 84, 84), torch.uint8, 6, "nature"))
    for r in rollouts:
        frames = r.tensors["obs"]
        assert frames.dtype == torch.uint8 and frames.shape == (T + 1, 2, 4, 84, 84)
        assert (frames[1:] != frames[:-1]).any(), "the frames must change from step to step"
    assert_replay_matches(model, rollouts)


def test_replay_matches_acting_through_local_workers():
    """The local backend (the Ray one: ``tests/ray/test_ray_backend.py``)."""
    model, rollouts, _, _ = collect("lstm", CORES["lstm"], 8)
    assert assert_replay_matches(model, rollouts)


def test_overlap_row_and_shapes():
    _, rollouts, _, _ = collect("lstm", {"hidden_size": 8}, 6)
    by_worker: dict[int, list[RolloutData]] = {}
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
    _, rollouts, _, _ = collect("lstm", {"hidden_size": 8}, 2, env="memory:cue_delay?delay=0&num_cues=3")
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


class _Watched(torch.Tensor):
    """A core-state tensor that logs every torch function applied to it (results are plain)."""

    log: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.log.append(getattr(func, "__name__", str(func)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _ClonesOf(TorchFunctionMode):
    """Counts ``clone`` calls on tensors that share a storage with ``tensors`` (their views too)."""

    def __init__(self, tensors):
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in tensors}
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "clone" and args[0].untyped_storage().data_ptr() in self.storages:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_inference_steps_that_start_no_rollout_leave_core_state_in_place():
    """The core state is read and written on its device, by slot index or, for a run of consecutive
    slots, as rows in place; it is never copied off it, cloned, or copied into the store except
    when a rollout starts."""
    core, opts = "elstm", CORES["elstm"]
    torch.manual_seed(0)
    pool = LocalWorkerPool(PoolSettings(CUE, 2, 2, seed=5))
    model = AgentNet((4,), 3, core, opts, stem="mlp")
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of((4,), "float32"), 3), 2, torch.device("cpu"), model.initial_state(1))
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), threading.Lock(), min_batch=2, batch_wait=1.0)
    loop.state = {name: value.as_subclass(_Watched) for name, value in loop.state.items()}
    allowed = {"index_select", "index_copy_", "narrow"}
    rollouts = []
    starts = quiet = 0
    pool.start()
    try:
        while len(rollouts) < 6:
            clones = _ClonesOf(loop.state.values())
            _Watched.log.clear()
            before = store.state_copies
            with clones:
                loop.step(5.0, on_rollout=lambda r: (rollouts.append(r), store.release(r)))
            used = set(_Watched.log)
            assert used <= allowed, f"core state was used by {sorted(used - allowed)}"
            assert "narrow" in used  # both workers every step (min_batch 2): slots 0-3, one run
            if store.state_copies == before:
                quiet += 1
                assert clones.count == 0
            else:
                starts += 1
                assert (store.state_copies - before) % 2 == 0  # K slots of the workers that start
    finally:
        pool.close()
    assert quiet > starts > 0
    for value in loop.state.values():
        assert type(value) is _Watched and value.device.type == "cpu"


def test_policy_versions_are_stamped_and_lag_counts_published_updates():
    """Stamps are monotonic per slot; a rollout that is not learned from lags one more update
    per publish; the store keeps them per page row on the host (no device column: the learner reads
    the host copy) and ``export`` gives them as the ``policy_version`` column."""
    torch.manual_seed(0)
    pool = LocalWorkerPool(PoolSettings(CUE, 2, 2, seed=5))
    model = AgentNet((4,), 3, "lstm", {"hidden_size": 8}, stem="mlp")
    learner_model = AgentNet((4,), 3, "lstm", {"hidden_size": 8}, stem="mlp")
    weights = PolicyWeights(model)
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of((4,), "float32"), 3), 2, torch.device("cpu"),
                         model.initial_state(1), capacity=64)
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), weights=weights, min_batch=2, batch_wait=2.0)
    rollouts: list[Rollout] = []
    pool.start()
    try:
        for step in range(60):
            loop.step(5.0, on_rollout=rollouts.append)
            if step % 4 == 3:
                weights.publish(learner_model)
    finally:
        pool.close()
    assert weights.version == 15
    by_worker: dict[int, list[int]] = {0: [], 1: []}
    for r in rollouts:
        data = store.export(r)
        host = store._versions[r.page]
        assert "policy_version" not in store.tensors
        assert data.tensors["policy_version"].shape == (T + 1, 2)
        assert (data.tensors["policy_version"] == torch.tensor(host).view(-1, 1)).all()
        by_worker[r.worker] += host[1:]
    for stamps in by_worker.values():
        assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
    # a rollout kept out of the learner: its lag grows by exactly one per published update
    r = rollouts[0]
    batch_before = store.gather([_piece(r, 0, 1)])
    lag_before = batch_before.policy_lag(weights.version)
    weights.publish(learner_model)
    weights.publish(learner_model)
    lag_after = batch_before.policy_lag(weights.version)
    assert lag_after[0] == pytest.approx(lag_before[0] + 2) and lag_after[1] == lag_before[1] + 2
    stamps = store._versions[r.page][1:]
    assert lag_before == (pytest.approx(sum(15 - v for v in stamps) / len(stamps)), 15 - min(stamps))
