"""The pieces of several acting threads (``fwrl.runner.acting``): the workers' slices, the lock the
threads' forwards share and a publish takes alone, and how many threads a run gets. The threads'
rollouts row by row: ``tests/e2e/test_acting_into_the_store.py``; whole runs: ``tests/e2e/test_acting_threads_runs.py``."""

import threading

import pytest
import torch

from fwrl.agents.policy_weights import SharedLock
from fwrl.envs.worker_pool import PoolSlice, split_workers
from fwrl.errors import FwrlError
from fwrl.agents.inference_graph import acting_graph
from fwrl.runner.concurrency import acting_threads


@pytest.mark.parametrize("workers,parts", [(1, 1), (4, 2), (5, 2), (16, 3), (7, 7)])
def test_split_workers_covers_every_worker_once_in_near_equal_slices(workers, parts):
    slices = split_workers(workers, parts)
    assert len(slices) == parts
    assert [w for s in slices for w in s] == list(range(workers))
    assert max(map(len, slices)) - min(map(len, slices)) <= 1


@pytest.mark.parametrize("workers,parts", [(2, 3), (4, 0)])
def test_split_workers_refuses_more_slices_than_workers(workers, parts):
    with pytest.raises(ValueError, match=f"{workers} workers into {parts}"):
        split_workers(workers, parts)


class _Pool:
    num_workers, envs_per_worker = 4, 3

    def __init__(self):
        self.asked = []

    def wait(self, timeout=None, workers=None):
        self.asked.append(workers)
        return []

    def siblings(self, worker):
        return range(worker, worker + 1)


def test_a_pool_slice_waits_on_its_own_workers_only():
    pool = _Pool()
    part = PoolSlice(pool, range(2, 4))
    assert (part.num_workers, part.num_slots, part.workers) == (2, 6, (2, 3))
    part.wait(0.1)
    assert pool.asked == [(2, 3)]
    for bad in ([], [1, 1], [4]):
        with pytest.raises(ValueError, match="distinct workers of 0..3"):
            PoolSlice(pool, bad)


def _holds(lock_use, timeout=0.5) -> bool:
    """Whether ``lock_use`` (a context manager factory) is entered by another thread within ``timeout``."""
    entered = threading.Event()
    release = threading.Event()

    def take():
        with lock_use():
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    got = entered.wait(timeout)
    release.set()
    if got:  # one still waiting enters (and leaves at once) when the caller lets go of the lock
        thread.join(10)
    return got


def test_shared_lock_readers_share_and_a_writer_is_alone():
    lock = SharedLock()
    with lock.shared():
        assert _holds(lock.shared), "a second reader enters while one reads"
        assert not _holds(lambda: lock), "a writer waits while a reader reads"
    with lock:
        assert not _holds(lock.shared), "a reader waits while the writer writes"
        assert not _holds(lambda: lock), "a second writer waits"
    assert _holds(lock.shared) and _holds(lambda: lock), "free again"


def test_a_waiting_writer_goes_before_later_readers():
    """Forwards that keep coming cannot keep a publish out."""
    lock = SharedLock()
    order = []
    reading = lock.shared()
    reading.__enter__()
    writer = threading.Thread(target=lambda: (lock.acquire(), order.append("write"), lock.release()))
    writer.start()
    while not lock._writers_waiting:  # the writer is queued behind the reader
        threading.Event().wait(0.001)

    def late_read():
        with lock.shared():
            order.append("late read")

    late = threading.Thread(target=late_read)
    late.start()
    late.join(0.3)
    assert late.is_alive() and order == [], "a reader that came after a waiting writer waits"
    reading.__exit__(None, None, None)
    writer.join(5)
    late.join(5)
    assert order == ["write", "late read"]


def test_acting_threads_one_by_default_or_as_asked():
    assert acting_threads(0, 8) == 1 == acting_threads(0, 16)
    assert acting_threads(3, 8) == 3
    with pytest.raises(FwrlError, match=r"acting_threads=5 .* 2 env worker.*1\.\.2"):
        acting_threads(5, 2)


def test_graphed_acting_is_the_default_on_cuda_with_one_acting_thread():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert acting_graph(None, cuda, 1) and not acting_graph(None, cuda, 2) and not acting_graph(None, cpu, 1)
    assert acting_graph(True, cuda, 2) and not acting_graph(False, cuda, 1)
    with pytest.raises(FwrlError, match=r"--inference-graph .* CUDA device; this run uses cpu"):
        acting_graph(True, cpu, 1)


@pytest.mark.parametrize("wait,threads", [(0.0, 1), (0.01, 2)])
def test_every_acting_thread_waits_for_more_workers_as_the_run_asks(tmp_path, wait, threads):
    """``acting_batch_wait`` reaches each acting thread's loop (its dynamic batching)."""
    from fwrl.runner.acting import ActingLoop
    from fwrl.runner.build import build_run
    from fwrl.runner.stopping import Stop
    from fwrl.settings.config import build_config

    config = build_config(None, {"env": "memory:cue_delay?delay=3", "core": "lstm", "num_workers": 2,
                                 "envs_per_worker": 2, "batch_size": 2, "unroll_length": 5,
                                 "acting_batch_wait": wait, "acting_threads": threads})
    parts = build_run(config, tmp_path / "run")
    acting, state = parts.acting, parts.state
    try:
        loops = ActingLoop(acting.pool, acting.store, acting.rollouts, acting.streams, acting.new_loop, acting.timers,
                           state.budget, state.counters, Stop(), lambda episode: None).loops
        assert [loop.batch_wait for loop in loops] == [wait] * threads
    finally:
        acting.pool.close()
