"""The acting forward (T = 1) replayed as a CUDA graph, one per batch size (``--inference-graph``).

A T = 1 forward of a small agent is mostly Python and kernel-launch
overhead: dozens of small kernels per layer. Capturing it once per batch
size (the number of slots served in one inference step, at most the number
of workers times K) and replaying the graph costs one launch. The graph reads
its inputs from static buffers (the step's obs, reward, done and the gathered
core state are copied in) and writes its outputs to static buffers; the
acting weights are read in place, so a publish (an in-place copy into the
same parameter tensors) is seen by the next replay.

Sampling uses Gumbel noise from ``torch.rand`` (``AgentNet`` ``sampler="gumbel"``),
which CUDA graphs can capture; every replay draws fresh noise. Each ``GraphedActing``
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
its own graphs (its loop's ``GraphedActing``), captured on its own stream.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fwrl.envs.step_record import REWARD

WARMUP_CALLS = 3
# held by every capture and replay in this process (the module docstring says why)
_CAPTURE_OR_REPLAY = threading.Lock()


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, Tensor]
    state: dict[str, Tensor]
    outputs: dict[str, Tensor]
    state_out: dict[str, Tensor]


class GraphedActing:
    """Call like the model (``inputs`` with T = 1, ``state``); replays a captured graph."""

    def __init__(self, model: nn.Module, device: torch.device, greedy: bool = False):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"--inference-graph needs a CUDA device, got {device}")
        self.model = model
        self.device = device
        self.greedy = greedy
        self.graphs: dict[int, _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every batch size
        # this object's own noise (module docstring), seeded from torch's global CPU generator, so
        # a seeded run is repeatable and two acting threads' loops draw different streams
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(torch.randint(0, 2**62, ()).item()))

    def __call__(self, inputs: dict[str, Tensor], state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        n = inputs[REWARD].shape[1]
        captured = self.graphs.get(n)
        if captured is None:
            with _CAPTURE_OR_REPLAY:
                captured = self.graphs[n] = self._capture(inputs, state)
        for key, value in inputs.items():
            captured.inputs[key].copy_(value)
        for key, value in state.items():
            captured.state[key].copy_(value)
        with _CAPTURE_OR_REPLAY:
            captured.graph.replay()
        return captured.outputs, captured.state_out

    def _forward(self, inputs: dict[str, Tensor], state: dict[str, Tensor]):
        return self.model(inputs, state, greedy=self.greedy, sampler="gumbel", generator=self.generator)

    @torch.no_grad()
    def _capture(self, inputs: dict[str, Tensor], state: dict[str, Tensor]) -> _Captured:
        static_inputs = {key: value.clone() for key, value in inputs.items()}
        static_state = {key: value.clone() for key, value in state.items()}
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):  # lazy initialisation (cuBLAS handles, Triton compiles) off the graph
                self._forward(static_inputs, static_state)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)
        # thread_local: the learner's and the other acting threads' CUDA calls (an allocation, a
        # sync) go on during a capture; only this thread's calls must be capturable
        with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
            outputs, state_out = self._forward(static_inputs, static_state)
        current.wait_stream(side)
        return _Captured(graph, static_inputs, static_state, outputs, state_out)
