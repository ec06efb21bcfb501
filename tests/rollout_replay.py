"""Acting through a worker pool into the rollout store, and replaying what was stored: the shared
pieces of the rollout tests (``tests/e2e/test_acting_into_the_store.py`` on the local backend,
``tests/ray/test_ray_backend.py`` on the Ray cluster).

Imported by the test modules (pytest puts ``tests/`` on ``sys.path``); its name does not start
with ``test_``, so it is not collected itself.
"""

import threading

import torch

from fwrl.agents.inference import InferenceLoop
from fwrl.agents.model import AgentNet
from fwrl.agents.policy_weights import PolicyWeights
from fwrl.agents.rollouts import Rollout, RolloutData, RolloutSpec, RolloutStore
from fwrl.envs.local_workers import LocalWorkerPool
from fwrl.envs.step_record import StepRecord
from fwrl.envs.worker_pool import PoolSettings, PoolSlice, split_workers

T = 6
CUE = "memory:cue_delay?delay=2&num_cues=3"  # 4-step episodes: ends inside rollouts of 6


def collect(core: str, core_options: dict, n: int, env: str = CUE, backend=None, workers: int = 2,
             until=lambda rollouts: True, obs=((4,), torch.float32, 3, "mlp"), threads: int = 1,
             staging: str = "pack"):
    """At least ``n`` rollouts (and more until ``until(rollouts)``) of acting with the model through a
    pool of ``backend`` (default: local), copied out of the store (each page is handed back as soon
    as it is copied). ``obs``: the env's (observation shape, dtype, actions) and the model's stem.
    ``threads`` > 1: that many acting threads, each with its own loop over a slice of the workers,
    writing the one store at once (``fwrl.runner.acting``); the last value is then the list of loops.
    ``staging``: the loops' (``InferenceLoop``)."""
    if threads > 1:
        return collect_threaded(core, core_options, n, env, workers, until, obs, threads, staging)
    torch.manual_seed(0)
    shape, dtype, actions, stem = obs
    pool = (backend.pool(env, workers, 2, seed=5, step_timeout=30.0) if backend is not None
            else LocalWorkerPool(PoolSettings(env, workers, 2, seed=5, step_timeout=30.0)))
    model = AgentNet(shape, actions, core, core_options, stem=stem)
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of(shape, str(dtype).removeprefix("torch.")), actions), workers, torch.device("cpu"),
                         model.initial_state(1))
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), threading.Lock(), staging=staging)
    rollouts: list[RolloutData] = []

    def keep(rollout: Rollout) -> None:
        rollouts.append(store.export(rollout))
        store.release(rollout)

    pool.start()
    try:
        while len(rollouts) < n or not until(rollouts):
            loop.step(5.0, on_rollout=keep)
    finally:
        pool.close()
    return model, rollouts, store, loop


def collect_threaded(core, core_options, n, env, workers, until, obs, threads, staging="pack"):
    torch.manual_seed(0)
    shape, dtype, actions, stem = obs
    pool = LocalWorkerPool(PoolSettings(env, workers, 2, seed=5, step_timeout=30.0))
    model = AgentNet(shape, actions, core, core_options, stem=stem)
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of(shape, str(dtype).removeprefix("torch.")), actions),
                         workers, torch.device("cpu"), model.initial_state(1))
    weights = PolicyWeights(model)  # one acting copy, read by every thread's forwards at once
    loops = [InferenceLoop(model, PoolSlice(pool, part), store, torch.device("cpu"), weights=weights, staging=staging)
             for part in split_workers(workers, threads)]
    rollouts: list[RolloutData] = []
    kept = threading.Lock()
    enough, errors = threading.Event(), []

    def keep(rollout: Rollout) -> None:
        with kept:
            rollouts.append(store.export(rollout))
            store.release(rollout)
            if len(rollouts) >= n and until(rollouts):
                enough.set()

    def serve(loop: InferenceLoop) -> None:
        try:
            while not enough.is_set():
                loop.step(0.5, on_rollout=keep)
        except BaseException as exc:  # noqa: BLE001 - failed the test below
            errors.append(exc)
            enough.set()

    pool.start()
    try:
        running = [threading.Thread(target=serve, args=(loop,)) for loop in loops]
        for thread in running:
            thread.start()
        for thread in running:
            thread.join(120)
        assert not any(thread.is_alive() for thread in running), "acting threads did not stop"
    finally:
        pool.close()
    if errors:
        raise errors[0]
    return model, rollouts, store, loops


def assert_replay_matches(model, rollouts: list[RolloutData]) -> bool:
    """Replays every rollout; returns whether some episode ended inside one."""
    saw_inner_reset = False
    for r in rollouts:
        saw_inner_reset |= bool(r.tensors["done"][1:].any())
        with torch.no_grad():
            out, _ = model({k: r.tensors[k] for k in ("obs", "reward", "done")}, r.initial_state)
        torch.testing.assert_close(out["policy_logits"][:-1], r.tensors["policy_logits"][1:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["baseline"][:-1], r.tensors["baseline"][1:], rtol=1e-5, atol=1e-5)
    return saw_inner_reset
