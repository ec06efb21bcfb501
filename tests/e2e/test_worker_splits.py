"""Worker processes that step their envs in splits (``worker_splits``, double-buffered sampling).

A pool of P processes with S splits has P*S workers of K envs each: every split answers
on its own, the splits of one process share its pid, a fault restarts the whole process
(every split of it starts a new life, the other processes go on), an action for a
result of a life that a sibling's fault ended is dropped (the new life answers with its
reset, never twice), acting threads hold whole processes, and ``train`` runs with splits
(and with splits and two acting threads) through faults to its budget, and resumes with
another number of splits.
"""

from __future__ import annotations

import csv
import dataclasses
import time
from collections import defaultdict

import numpy as np
import pytest
import yaml

from fwrl.envs.backends import make_pool
from fwrl.envs.worker_pool import PoolSettings, PoolSlice, split_workers
from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig

K = 2  # envs per split


def _run(pool, seconds: float, until=None) -> dict[int, list]:
    """Act (zeros) on every result for up to ``seconds``; results by worker, their arrays copied
    (a result's arrays are views of shared memory, valid until the next action)."""
    results = defaultdict(list)
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (until and until(results)):
        for r in pool.wait(0.5):
            results[r.worker].append(dataclasses.replace(r, arrays={k: v.copy() for k, v in r.arrays.items()}))
            pool.act(r.worker, np.zeros(pool.envs_per_worker, np.int64))
    return results


def test_every_split_answers_and_the_splits_of_a_process_share_it():
    pool = make_pool("local", PoolSettings("memory:cue_delay?delay=2", 6, K, seed=5, worker_splits=3))
    assert (pool.num_workers, pool.envs_per_worker, pool.settings.num_processes) == (6, K, 2)
    with pool:
        results = _run(pool, 60, until=lambda rs: len(rs) == 6 and all(len(v) >= 20 for v in rs.values()))
        pids = [pool.pid(w) for w in range(6)]
    assert sorted(results) == list(range(6)) and all(len(v) >= 20 for v in results.values())
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5]
    assert pool.restarts == 0 and all(not r.restarted and r.life == 0 for v in results.values() for r in v)
    # each split steps its own envs: the shared-memory rows of worker w are slots w*K..(w+1)*K
    assert [pool.slots_of(w) for w in (0, 5)] == [slice(0, K), slice(5 * K, 6 * K)]


def test_a_fault_restarts_every_split_of_its_process_and_no_other():
    spec = "chaos:cue_delay?delay=2&raise_every=5&only_worker=1"  # worker 1: the second split of process 0
    pool = make_pool("local", PoolSettings(spec, 4, K, seed=1, step_timeout=20.0, worker_splits=2))
    with pool:
        results = _run(pool, 90, until=lambda rs: all(rs[w] and rs[w][-1].life >= 2 for w in (0, 1))
                       and all(len(rs[w]) > 12 for w in (2, 3)))
    assert pool.restarts >= 2
    for w in (0, 1):  # both splits of process 0 start new lives, told so once per life
        lives = [r.life for r in results[w]]
        assert lives == sorted(lives) and lives[-1] >= 2, (w, lives)
        firsts = {r.life: r.restarted for r in results[w][::-1]}  # the first result of each life
        assert all(firsts[life] for life in firsts if life > 0) and not firsts[0]
        assert sum(r.restarted for r in results[w]) == len(set(lives)) - 1
        assert all(r.done.all() for r in results[w] if r.restarted)
    assert all(r.life == 0 and not r.restarted for w in (2, 3) for r in results[w])
    assert all("worker process of workers 0-1" in e and "ChaosFault" in e for e in pool.errors), pool.errors


def test_an_action_for_a_life_that_a_sibling_ended_is_dropped():
    """Worker 0's result is held back while its sibling faults: acting on it afterwards must not
    send a step to the new life, which answers its reset once and then waits for an action."""
    spec = "chaos:cue_delay?delay=2&exit_every=3&only_worker=1"
    pool = make_pool("local", PoolSettings(spec, 2, K, seed=1, step_timeout=20.0, worker_splits=2))
    with pool:
        held = None
        end = time.monotonic() + 60
        while pool.restarts == 0:
            assert time.monotonic() < end, "worker 1 never faulted"
            for r in pool.wait(0.5):
                if r.worker == 0 and held is None:
                    held = r  # not acted on until its process has been restarted
                elif r.worker == 1:
                    pool.act(1, np.zeros(K, np.int64))
        assert held is not None and held.life == 0
        pool.act(0, np.zeros(K, np.int64))  # for the ended life: dropped
        answers = []
        # no actions now: each split answers its reset (the new process may take a while to start on a
        # loaded machine: up to 60 s), and nothing more in the 3 s after both have
        end = time.monotonic() + 60
        while len(answers) < 2 and time.monotonic() < end:
            answers += [(r.worker, r.life, r.restarted) for r in pool.wait(0.2)]
        end = time.monotonic() + 3
        while time.monotonic() < end:
            answers += [(r.worker, r.life, r.restarted) for r in pool.wait(0.2)]
    assert sorted(answers) == [(0, 1, True), (1, 1, True)]


def test_acting_slices_hold_whole_processes():
    assert split_workers(8, 2, worker_splits=2) == [range(0, 4), range(4, 8)]
    assert split_workers(6, 2, worker_splits=2) == [range(0, 2), range(2, 6)]
    with pytest.raises(ValueError, match=r"6 workers \(3 processes of 2 splits\) into 4"):
        split_workers(6, 4, worker_splits=2)
    pool = make_pool("local", PoolSettings("memory:cue_delay", 4, K, worker_splits=2))  # not started
    PoolSlice(pool, [2, 3])
    with pytest.raises(ValueError, match="whole worker processes"):
        PoolSlice(pool, [1, 2])


def test_pool_and_settings_reject_splits_that_do_not_fit():
    with pytest.raises(FwrlError, match=r"worker_splits=2 .* 3 workers"):
        make_pool("local", PoolSettings("memory:cue_delay", 3, K, worker_splits=2))
    with pytest.raises(FwrlError, match=r"worker_splits=4 does not divide envs_per_worker=6 .* 1, 2, 3, 6"):
        TrainConfig(env="memory:cue_delay", envs_per_worker=6, worker_splits=4)
    with pytest.raises(FwrlError, match=r"worker_splits=2 is for the local backend"):
        TrainConfig(env="memory:cue_delay", envs_per_worker=2, worker_splits=2, backend="ray")
    settings = TrainConfig(env="memory:cue_delay", num_workers=3, envs_per_worker=4, worker_splits=2).pool_settings()
    assert (settings.num_workers, settings.envs_per_worker, settings.num_processes) == (6, 2, 3)


@pytest.mark.parametrize("acting_threads", [1, 2])
def test_train_with_splits_survives_faults(tmp_path, acting_threads):
    from fwrl.runner.train import train

    log = tmp_path / "faults.txt"
    config = TrainConfig(
        env=f"chaos:cue_delay?delay=3&raise_every=20&only_worker=0&fault_log={log}",
        core="lstm", core_options={"hidden_size": 32}, num_workers=2, envs_per_worker=2 * K, worker_splits=2,
        acting_threads=acting_threads, batch_size=4, unroll_length=10, total_steps=2000, learning_rate=1e-3,
        device="cpu", num_threads=1, step_timeout=10.0, log_interval=1.0, checkpoint_interval=600.0)
    run_dir = tmp_path / "run"
    result = train(config, run_dir)
    assert result.stopped_by == "budget" and result.agent_steps >= config.total_steps
    with open(run_dir / "metrics.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    assert int(last["worker_restarts"]) > 0 and int(last["dropped_steps"]) > 0
    if acting_threads == 2:  # the splits may change on resume: the store is laid out anew
        resumed = train(config.model_copy(update={"worker_splits": 1, "total_steps": 3000}), run_dir, resume=True)
        assert resumed.stopped_by == "budget" and resumed.agent_steps >= 3000
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["worker_splits"] == 1
