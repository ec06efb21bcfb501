"""A job run every so many steps of training on a snapshot of the acting weights, in a background
thread, one at a time: what the periodic evaluation (``evaluate.PeriodicEvaluator``, every
``eval_every`` agent steps) and the periodic video (``video.PeriodicVideo``, every ``video_every``
updates) share. Importing it does not import torch."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fwrl.errors import FwrlError

if TYPE_CHECKING:
    from torch import nn

Result = TypeVar("Result")


class PeriodicJob(Generic[Result]):
    """Runs :meth:`_work` (a subclass's) on a snapshot of the acting weights each time the count
    (agent steps, updates) passes the next multiple of ``every`` (0: never) and no run is going;
    :meth:`poll` hands over the finished runs' results and re-raises a run's error."""

    def __init__(self, every: int, count: int, thread_name: str, failure: str):
        """``count``: where training starts (a resumed run's); ``failure`` names the job in the error
        :meth:`poll` raises ("<failure> during training failed: ...")."""
        self.every = int(every)
        self.next_at = (count // self.every + 1) * self.every if self.every > 0 else 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.results: list[Result] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread_name = thread_name
        self._failure = failure

    def _work(self, model: nn.Module, *args: Any) -> Result | None:
        """One run on the snapshot ``model`` (in the job's thread); None: nothing to hand over."""
        raise NotImplementedError

    def _start(self, count: int, model: nn.Module, lock: threading.Lock, *args: Any) -> bool:
        """Start a run (``_work(snapshot, *args)``) if ``count`` passed the next mark and none is
        going; the snapshot is taken under ``lock`` (the acting weights' lock)."""
        if self.every <= 0 or count < self.next_at or (self.thread is not None and self.thread.is_alive()):
            return False
        from fwrl.agents.policy_weights import acting_copy

        self.next_at = (count // self.every + 1) * self.every
        with lock:
            snapshot = acting_copy(model)
        self.thread = threading.Thread(target=self._run, args=(snapshot, *args), name=self._thread_name,
                                       daemon=True)
        self.thread.start()
        return True

    def _run(self, model: nn.Module, *args: Any) -> None:
        try:
            result = self._work(model, *args)
        except BaseException as exc:  # reported through poll()
            with self._lock:
                self.errors.append(exc)
            return
        if result is not None:
            with self._lock:
                self.results.append(result)

    def poll(self) -> list[Result]:
        """The results of the runs finished since the last call; re-raises a run's error."""
        with self._lock:
            results, self.results = self.results, []
            errors, self.errors = self.errors, []
        if errors:
            raise FwrlError(f"{self._failure} during training failed: {errors[0]}") from errors[0]
        return results

    def close(self, wait: bool = False) -> None:
        """Stop a running job (or, with ``wait``, let it finish) and join its thread."""
        if not wait:
            self.stop.set()
        if self.thread is not None:
            self.thread.join()
