"""Training metrics: normalised returns per family."""

import pytest

from fwrl.envs.worker_pool import EpisodeRecord
from fwrl.runner.run_metrics import Episodes, normaliser


def test_atari_human_normalised_return():
    episodes = Episodes(("Pong",), normalise=normaliser("atari:Pong"))
    episodes.add(EpisodeRecord(-20.7, 800, task=0, worker=0))
    episodes.add(EpisodeRecord(14.6, 800, task=0, worker=1))
    row = episodes.per_task()
    assert row == {"normalised_return": pytest.approx((-3.05 + 20.7) / (14.6 + 20.7))}


def test_families_without_constants_log_no_normalised_score():
    assert normaliser("memory:cue_delay") is None
    assert Episodes(("cue_delay",)).per_task() == {}


def test_a_disk_fault_in_tensorboards_writer_thread_prints_no_traceback(monkeypatch):
    """TensorBoard's writer thread that hits a full disk keeps the error for the run's thread (whose next
    write raises it: one line, exit 74) and re-raises it; the thread hook installed with the writer
    keeps that from printing a traceback. Any other thread's exception reaches the hook as before."""
    import queue
    import threading

    pytest.importorskip("tensorboard", reason="needs tensorboard (the test extra)")
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    from fwrl.runner.run_metrics import quiet_tensorboard_writer_faults

    seen = []
    monkeypatch.setattr(threading, "excepthook", seen.append)  # the hook before ours: prints tracebacks
    quiet_tensorboard_writer_faults()

    class FullDisk:
        def write(self, data):
            raise OSError(28, "No space left on device")

        def flush(self):
            pass

    records = queue.Queue()
    writer = _AsyncWriterThread(records, FullDisk(), 120)
    writer.start()
    records.put(b"event")
    writer.join(10)
    assert isinstance(writer.exception, OSError) and seen == []  # kept for the run's thread, not printed

    def other():
        raise OSError(28, "No space left on device")

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert len(seen) == 1 and isinstance(seen[0].exc_value, OSError)  # not TensorBoard's: the hook as before
