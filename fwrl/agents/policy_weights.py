"""The acting copy of the weights, its version, and the CUDA streams that read and write it
(ARCHITECTURE.md, Processes and machines).

The learner trains ``model``; the inference loop acts with a second copy,
``PolicyWeights.model``. After every update the learner *publishes*: it copies
its weights into the acting copy and increments ``version``; rows of the
rollout store are stamped with the version that acted, so the learner can log
``policy_lag`` (its version minus the acting one).

Several acting threads may act with the one copy at once: ``lock`` is a
:class:`SharedLock`, which the forwards hold together (``acting()``) and the
learner's ``publish()`` alone (``with lock:``). On CUDA each acting thread has
its own stream (``DeviceStreams.acting``) and the learner its own. Then:

- ``acting()`` (inference) enqueues the forward on its thread's acting stream;
- ``publish()`` (learner) makes its own stream wait for everything enqueued on
  every acting stream so far (the forwards reading the old weights), copies,
  and makes each acting stream wait for the copy before anything enqueued
  after it (the next forward, or a snapshot taken on that stream).

On the CPU the lock alone orders them.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Iterator

import torch
from torch import nn

from fwrl.errors import unknown_choice


def acting_copy(model: nn.Module) -> nn.Module:
    """A frozen copy of ``model`` in eval mode to act with.

    ``copy.deepcopy`` copies each parameter on its own, so on CUDA a cuDNN RNN
    (the ``lstm`` core's ``nn.LSTM``) loses its single flat weight buffer and
    would compact its weights again at every forward (PyTorch warns "RNN module
    weights are not part of single contiguous chunk of memory", seen on the
    first GPU run); they are flattened once here."""
    acting = copy.deepcopy(model).eval()
    for p in acting.parameters():
        p.requires_grad_(False)
    for module in acting.modules():
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return acting


class SharedLock:
    """A lock that readers share and a writer holds alone: ``with lock.shared():`` for a reader,
    ``with lock:`` for a writer (and for any caller that takes it as a plain lock). A waiting writer
    goes before readers that come after it, so the forwards of several acting threads cannot keep
    the learner's publish out."""

    def __init__(self) -> None:
        self._turn = threading.Condition(threading.Lock())
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._turn:
            while self._writing or self._writers_waiting:
                self._turn.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._turn:
                self._readers -= 1
                if not self._readers:
                    self._turn.notify_all()

    def acquire(self) -> bool:
        with self._turn:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._turn.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        return True

    def release(self) -> None:
        with self._turn:
            self._writing = False
            self._turn.notify_all()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


ACTING_PRIORITIES = {"normal": 0, "high": -1}  # CUDA stream priorities: lower is higher


class DeviceStreams:
    """The acting streams (one per acting thread; ``inference`` is the first) and the learner
    stream of ``device`` (None on the CPU). ``acting_priority`` "high": the acting streams take a
    higher CUDA priority than the learner's, so where both have kernels waiting the GPU schedules
    the acting step's blocks first (a CUDA graph replayed on the stream takes its priority)."""

    def __init__(self, device: torch.device, acting_threads: int = 1, acting_priority: str = "normal"):
        if acting_priority not in ACTING_PRIORITIES:
            raise unknown_choice("acting stream priority", acting_priority, tuple(ACTING_PRIORITIES))
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        priority = ACTING_PRIORITIES[acting_priority]
        self.acting = (tuple(torch.cuda.Stream(self.device, priority=priority) for _ in range(acting_threads))
                       if cuda else ())
        self.inference = self.acting[0] if cuda else None
        self.learner = torch.cuda.Stream(self.device) if cuda else None

    def acting_stream(self, thread: int) -> "torch.cuda.Stream | None":
        """Acting thread ``thread``'s stream (None on the CPU)."""
        return self.acting[thread] if self.acting else None

    def make_current(self, stream: "torch.cuda.Stream | None") -> "torch.cuda.Stream | None":
        """Make ``stream`` this thread's current stream; returns the one it replaces (None on the
        CPU, and nothing happens for ``stream`` None)."""
        if stream is None:
            return None
        previous = torch.cuda.current_stream(self.device)
        torch.cuda.set_stream(stream)
        return previous

    @staticmethod
    def use(stream: "torch.cuda.Stream | None") -> contextlib.AbstractContextManager:
        """Make ``stream`` current in this thread (nothing on the CPU)."""
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class PolicyWeights:
    """The acting model, the version of its weights, and the lock that guards both (a
    :class:`SharedLock` unless a plain lock is given)."""

    def __init__(self, model: nn.Module, streams: DeviceStreams | None = None,
                 lock: "threading.Lock | SharedLock | None" = None, version: int = 0):
        self.model = model
        self.streams = streams
        self.lock = lock if lock is not None else SharedLock()
        # what a forward holds: the shared side of a SharedLock, a plain lock whole
        self._hold = self.lock.shared if isinstance(self.lock, SharedLock) else lambda: self.lock
        self.version = version
        self._targets = list(model.state_dict().values())

    @contextlib.contextmanager
    def acting(self) -> Iterator[int]:
        """Hold the weights for one forward (shared with the other acting threads' forwards where the
        lock is a :class:`SharedLock`); yields their version."""
        with self._hold():
            yield self.version

    @torch.no_grad()
    def publish(self, source: nn.Module) -> int:
        """Copy ``source``'s weights into the acting model; returns the new version."""
        sources = list(source.state_dict().values())
        with self.lock:
            acting = self.streams.acting if self.streams is not None else ()
            for stream in acting:
                torch.cuda.current_stream(self.streams.device).wait_stream(stream)
            torch._foreach_copy_(self._targets, sources)
            for stream in acting:
                stream.wait_stream(torch.cuda.current_stream(self.streams.device))
            self.version += 1
            return self.version
