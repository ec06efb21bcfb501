"""The acting step replayed as a CUDA graph, one per batch size (``--inference-graph``).

A T = 1 forward of a small agent is mostly Python and kernel-launch
overhead: dozens of small kernels per layer, and the core state's gather and
scatter and the store's writes around it add a dozen more. :class:`GraphedStep`
captures a function of device tensors once per key (the inference loop's
whole device step, ``InferenceLoop._act``, once per step layout,
``fwrl.agents.acting_batch.StepLayout``: the number of slots served in one
inference step, the number of riders, the slots whose episode a time limit cut,
and the index parts the loop uses) and replays it in one launch. The graph reads
its inputs from static buffers (the loop uploads its ``ActingBatch`` straight into them)
and writes its outputs to static buffers; tensors it reads and writes in place
(the acting weights, the core state, the rollout store) keep their addresses, so
a publish (an in-place copy into the same parameter tensors) is seen by the next
replay.

Sampling uses Gumbel noise from ``torch.rand`` (``AgentNet`` ``sampler="gumbel"``),
which CUDA graphs can capture; every replay draws fresh noise. Each graphed loop
draws it from a CUDA generator of its own, registered with each of its graphs: a
graph reads its generator's seed and offset from device tensors that each replay
refills on the replaying stream, so two acting threads replaying graphs of one
shared generator on two streams could read each other's offset and draw the same
noise.

Several acting threads: PyTorch registers the default CUDA generator with every
graph, and while one thread captures, that generator is in capture mode; a
replay in another thread then fails ("Offset increment outside graph capture
encountered unexpectedly", seen with ``--acting-threads 2`` on an H200). So
captures and replays take one process-wide lock: a replay holds it for its
launch (microseconds), a capture (once per batch size and thread) for its
duration.

Requirements: a CUDA device, and a forward free of host syncs at T = 1 (the
cores are; the fused kernels make no host sync). Shapes that were never
seen are captured on first use: a few warm-up calls on a side stream, then
the capture (about as long as a few dozen forwards). Each acting thread has
its own graphs (its loop's ``GraphedStep``), captured on its own stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Sequence, TypeVar

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map_only

from fwrl.errors import FwrlError

WARMUP_CALLS = 3
# held by every capture and replay in this process (the module docstring says why)
_CAPTURE_OR_REPLAY = threading.Lock()

In = TypeVar("In")  # a step's inputs: a tensor, or tuples, named tuples, lists or dicts of them
Out = TypeVar("Out")  # its outputs, likewise


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    outputs: Any  # the step's Out, as the capture left it: the replays write its tensors


def fill(static: In, values: In) -> None:
    """Copy the tensors of ``values`` into those of ``static`` (the same structure; a tensor that is
    its static one is left as it is): the one place a step's inputs or outputs are seen as a flat
    list of tensors."""
    buffers, spec = tree_flatten(static)
    given, given_spec = tree_flatten(values)
    if given_spec != spec:
        raise ValueError(f"a graphed step's inputs changed structure: {given_spec} after {spec}")
    for buffer, value in zip(buffers, given):
        if isinstance(buffer, Tensor) and value is not buffer:
            buffer.copy_(value)


class GraphedStep(Generic[In, Out]):
    """``fn(inputs) -> outputs`` (device work only, no host sync) replayed as CUDA graphs, one per
    key. Call ``step(key, inputs)``: the tensors of ``inputs`` are copied into the key's static
    buffers (none is copied that is that buffer: fill them in place with :meth:`buffers`), the graph
    is captured on the key's first call and replayed; returns its static outputs (valid until the
    next replay of that key). Inputs and outputs are tensors or tuples, named tuples, lists and dicts
    of them, of the same structure at every call of a key.

    The warm-up calls before a capture run ``fn`` for real: ``protect()`` gives the tensors they
    must leave as they were (the loop's core state, which ``fn`` advances in place); they are
    restored after the capture. Writes of ``fn`` that the replay makes again (the store's, at the
    same entries) need no protection. ``generator``: the CUDA generator ``fn`` samples from,
    registered with every graph (module docstring).
    """

    def __init__(self, fn: Callable[[In], Out], device: torch.device,
                 generator: torch.Generator, protect: Callable[[], Sequence[Tensor]] | None = None):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"--inference-graph needs a CUDA device, got {device}")
        self.fn = fn
        self.device = device
        self.generator = generator
        self.protect = protect
        self.graphs: dict[Hashable, _Captured] = {}
        self._buffers: dict[Hashable, In] = {}
        self.pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every key

    def buffers(self, key: Hashable, make: Callable[[Hashable], In]) -> In:
        """The static inputs of ``key``: ``make(key)`` on first use (uninitialised device tensors, or
        tensors shared by every key, which are then used as they are)."""
        static = self._buffers.get(key)
        if static is None:
            static = self._buffers[key] = make(key)
        return static

    def step(self, key: Hashable, inputs: In) -> Out:
        static = self._buffers.get(key)
        if static is None:
            static = self._buffers[key] = tree_map_only(Tensor, lambda t: torch.empty_like(t, device=self.device),
                                                        inputs)
        if inputs is not static:
            fill(static, inputs)
        captured = self.graphs.get(key)
        if captured is None:
            with _CAPTURE_OR_REPLAY:
                captured = self.graphs[key] = self._capture(static)
        with _CAPTURE_OR_REPLAY:
            captured.graph.replay()
        return captured.outputs

    @torch.no_grad()
    def _capture(self, static: In) -> _Captured:
        current = torch.cuda.current_stream(self.device)
        kept = [value.clone() for value in self.protect()] if self.protect else []
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):  # lazy initialisation (cuBLAS handles, Triton compiles) off the graph
                self.fn(static)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        # thread_local: the learner's and the other acting threads' CUDA calls (an allocation, a
        # sync) go on during a capture; only this thread's calls must be capturable
        with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
            outputs = self.fn(static)
        current.wait_stream(side)
        if kept:  # the warm-up calls advanced them: back to what the replay must start from
            torch._foreach_copy_(list(self.protect()), kept)
        return _Captured(graph, outputs)


def own_generator(device: torch.device) -> torch.Generator:
    """A CUDA generator of one graphed loop's own (module docstring), seeded from torch's global
    CPU generator, so a seeded run is repeatable and two acting threads draw different streams."""
    generator = torch.Generator(device=device)
    generator.manual_seed(int(torch.randint(0, 2**62, ()).item()))
    return generator


def acting_graph(requested: bool | None, device: torch.device, threads: int) -> bool:
    """Whether the acting forward replays CUDA graphs (``inference_graph``): ``requested`` where given
    (true needs a CUDA device), else on for a CUDA device with one acting thread.

    A T = 1 forward on a GPU is bound by its kernel launches; one graph replay launches them all
    (the measured gain: README, ``fwrl train``'s ``--inference-graph``). Several acting threads keep
    the eager forward unless asked: their graphed path (one lock for capture and replay, a generator
    per loop) has not yet been timed on a GPU."""
    if requested is None:
        return device.type == "cuda" and threads == 1
    if requested and device.type != "cuda":
        raise FwrlError(f"--inference-graph replays CUDA graphs and needs a CUDA device; this run uses {device}.")
    return requested
