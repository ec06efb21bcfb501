"""The acting copy of the weights, its version, and the CUDA streams that read and write it
(ARCHITECTURE.md, Processes).

The learner trains ``model``; the inference loop acts with a second copy,
``PolicyWeights.model``. After every update the learner *publishes*: it copies
its weights into the acting copy and increments ``version``; rows of the
rollout store are stamped with the version that acted, so the learner can log
``policy_lag`` (its version minus the acting one).

On CUDA, inference and learning run on two streams. Under ``lock``:

- ``acting()`` (inference) enqueues the forward on the inference stream;
- ``publish()`` (learner) makes its own stream wait for everything enqueued on
  the inference stream so far (the forwards reading the old weights), copies,
  and makes the inference stream wait for the copy before anything enqueued
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


class DeviceStreams:
    """The inference and learner streams of ``device`` (None on the CPU)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.inference = torch.cuda.Stream(self.device) if cuda else None
        self.learner = torch.cuda.Stream(self.device) if cuda else None

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
    """The acting model, the version of its weights, and the lock that guards both."""

    def __init__(self, model: nn.Module, streams: DeviceStreams | None = None,
                 lock: threading.Lock | None = None, version: int = 0):
        self.model = model
        self.streams = streams
        self.lock = lock if lock is not None else threading.Lock()
        self.version = version
        self._targets = list(model.state_dict().values())

    @contextlib.contextmanager
    def acting(self) -> Iterator[int]:
        """Hold the weights for one forward; yields their version."""
        with self.lock:
            yield self.version

    @torch.no_grad()
    def publish(self, source: nn.Module) -> int:
        """Copy ``source``'s weights into the acting model; returns the new version."""
        sources = list(source.state_dict().values())
        with self.lock:
            inference = self.streams.inference if self.streams is not None else None
            if inference is not None:
                torch.cuda.current_stream(self.streams.device).wait_stream(inference)
            torch._foreach_copy_(self._targets, sources)
            if inference is not None:
                inference.wait_stream(torch.cuda.current_stream(self.streams.device))
            self.version += 1
            return self.version
