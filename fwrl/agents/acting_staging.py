"""An acting step's host arrays on the device (``fwrl.agents.inference``): the ready workers' step
records, the step's indices and its riders' observations as one :class:`~fwrl.agents.acting_batch.ActingBatch`.

The stored columns go in their groups (``fwrl.envs.step_record.ColumnGroup``: each observation alone,
the scalars of each dtype side by side): one host buffer and one upload per group, and one for the
step's packed index and for each rider observation column. On CUDA the host buffers are pinned
(allocated on first use, each as large as a step can need) and copied without blocking on the
current stream; a buffer is not written again before its last copy has finished.

With the pool's ``shared`` arrays (``staging="shared"``) the observation groups are not packed: they
come whole from :class:`~fwrl.agents.shared_staging.SharedRows`, ``[pool slots, ...]`` with the ready
workers' rows current, and the step takes its rows from them on the device (:meth:`Staging.step_rows`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fwrl.agents.acting_batch import ActingBatch, StepIndex, StepLayout
from fwrl.agents.rollouts import TORCH_DTYPES
from fwrl.agents.shared_staging import SharedRows
from fwrl.envs.step_record import DONE, FINAL_OF, OBS, OBS_EXTRA, REWARD, TRUNCATED, ColumnGroup, StepRecord
from fwrl.envs.worker_pool import StepResult

MODEL_INPUTS = (OBS, REWARD, DONE, OBS_EXTRA)  # the step record's columns the model reads, where present
INDEX = "index"  # the host buffer of the packed StepIndex


class Staging:
    """The uploads of one acting loop on ``device`` over ``num_slots`` slots (module docstring).

    ``record``: the step record the workers hand over (None: learnt from the first results, as for an
    evaluation source, whose arrays say it); ``shared``: the pool's shared arrays, whose observation
    groups are then read whole (``k``: envs per worker)."""

    def __init__(self, device: torch.device, num_slots: int, record: StepRecord | None = None,
                 shared: dict[str, np.ndarray] | None = None, k: int = 1):
        self.device = torch.device(device)
        self.num_slots = num_slots
        self.k = k
        self.record: StepRecord | None = None
        self.groups: tuple[ColumnGroup, ...] = ()
        self.shared: SharedRows | None = None
        self._shared_arrays = shared
        self.from_shared: tuple[bool, ...] = ()  # per group: read whole from the shared arrays
        self.observations: tuple[str, ...] = ()  # the record's observation columns
        self.model_inputs: tuple[str, ...] = ()  # the record's columns the model reads
        self._pinned: dict[str, tuple[Tensor, np.ndarray]] = {}  # CUDA: a pinned host buffer per upload, its numpy view
        self._copied: torch.cuda.Event | None = None  # CUDA: the last uploads from them are done
        if record is not None:
            self._describe(record)

    def _describe(self, record: StepRecord) -> None:
        """What the uploads of ``record`` hold: its groups, which come from the shared arrays, the
        place of each column and the model's inputs among them."""
        self.record = record
        self.groups = record.groups()
        if self._shared_arrays is not None:
            self.shared = SharedRows(self._shared_arrays, self.groups, self.device, self.k)
        shared_names = self.shared.names if self.shared is not None else ()
        self.from_shared = tuple(g.name in shared_names for g in self.groups)
        self.observations = record.observations
        self.model_inputs = tuple(name for name in MODEL_INPUTS if name in record.names)
        self._place = {column: (position, g.index(column)) for position, g in enumerate(self.groups)
                       for column in g.columns}
        specs = record.specs()
        self._final_obs = tuple((FINAL_OF[name], specs[FINAL_OF[name]]) for name in self.observations)
        self._no_riders = tuple(torch.empty((0, *shape), dtype=TORCH_DTYPES[dtype], device=self.device)
                                for _, (shape, dtype) in self._final_obs)

    def upload(self, results: list[StepResult], index: StepIndex, out: ActingBatch | None = None) -> ActingBatch:
        """The step of ``results`` (in batch order) with its host ``index`` on the device: into the
        tensors of ``out`` (a graph's static inputs, :meth:`empty`) where given, which it returns."""
        if self.record is None:
            self._describe(StepRecord.of_arrays(results[0].arrays))
        if self._copied is not None:  # CUDA: the pinned buffers are read by the last step's copies
            self._copied.synchronize()
        layout = out.layout if out is not None else index.layout
        parts = [r.arrays for r in results]
        shared = self.shared.upload(results) if self.shared is not None else None
        groups = []
        for position, group in enumerate(self.groups):
            if self.from_shared[position]:
                groups.append(shared[group.name])
                continue
            array, host = self._host(group.name, (layout.slots, *group.shape), group.dtype, self.num_slots)
            group.pack(parts, out=array)
            groups.append(self._send(host, out.groups[position] if out is not None else None))
        array, host = self._host(INDEX, (layout.size,), "int64", StepLayout.most_entries(self.num_slots))
        index.pack(out=array)
        uploaded = self._send(host, out.index if out is not None else None)
        riders = self._riders(results, layout.cut, out)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        return out if out is not None else ActingBatch(layout, uploaded, tuple(groups), riders)

    def _riders(self, results: list[StepResult], cut: int, out: ActingBatch | None) -> tuple[Tensor, ...]:
        """The final observations of the ``cut`` slots whose episode a time limit cut, per observation
        column, in batch order (none: the same empty tensors at every step)."""
        if not cut:
            return out.final_obs if out is not None else self._no_riders
        truncated = [r.arrays[TRUNCATED] for r in results]
        riders = []
        for position, (name, (shape, dtype)) in enumerate(self._final_obs):
            array, host = self._host(name, (cut, *shape), dtype, self.num_slots)
            np.concatenate([r.arrays[name][flags] for r, flags in zip(results, truncated)], out=array)
            riders.append(self._send(host, out.final_obs[position] if out is not None else None))
        return tuple(riders)

    def _host(self, name: str, shape: tuple[int, ...], dtype: str, capacity: int) -> tuple[np.ndarray, Tensor]:
        """A host array of ``shape`` and numpy ``dtype`` for the upload ``name`` to fill, and the tensor
        of its memory: on CUDA the first ``shape[0]`` rows of its pinned buffer of ``capacity`` rows
        (made, or made anew, here); else a new array."""
        if self.device.type != "cuda":
            array = np.empty(shape, np.dtype(dtype))
            return array, torch.from_numpy(array)
        pinned = self._pinned.get(name)
        if pinned is None or len(pinned[0]) < shape[0] or pinned[0].shape[1:] != shape[1:] or pinned[1].dtype != dtype:
            buffer = torch.empty((max(shape[0], capacity), *shape[1:]), dtype=TORCH_DTYPES[dtype], pin_memory=True)
            pinned = self._pinned[name] = (buffer, buffer.numpy())
        return pinned[1][:shape[0]], pinned[0][:shape[0]]

    def _send(self, host: Tensor, into: Tensor | None) -> Tensor:
        """``host`` on the device (into ``into`` where given): without blocking on CUDA; on the CPU the
        host tensor itself."""
        if into is not None:
            return into.copy_(host, non_blocking=True)
        return host.to(self.device, non_blocking=True) if self.device.type == "cuda" else host

    def empty(self, layout: StepLayout) -> ActingBatch:
        """Uninitialised device tensors of a step of ``layout``, to upload into (a CUDA graph's static
        inputs, one set per layout); the shared groups are the one buffer every layout shares."""
        shared = self.shared.buffers if self.shared is not None else {}
        groups = tuple(shared[g.name] if self.from_shared[position] else
                       torch.empty((layout.slots, *g.shape), dtype=TORCH_DTYPES[g.dtype], device=self.device)
                       for position, g in enumerate(self.groups))
        riders = tuple(torch.empty((layout.cut, *shape), dtype=TORCH_DTYPES[dtype], device=self.device)
                       for _, (shape, dtype) in self._final_obs)
        return ActingBatch(layout, torch.empty(layout.size, dtype=torch.int64, device=self.device), groups, riders)

    def step_rows(self, groups: tuple[Tensor, ...], pool_slots: Tensor) -> tuple[Tensor, ...]:
        """A batch's ``groups`` with each shared group cut to the step's rows, ``pool_slots`` (device
        work, which a CUDA graph captures)."""
        if self.shared is None:
            return groups
        return tuple(value.index_select(0, pool_slots) if shared else value
                     for value, shared in zip(groups, self.from_shared))

    def column(self, groups: tuple[Tensor, ...], name: str) -> Tensor:
        """Column ``name`` of a step's ``groups`` (as :meth:`step_rows` gives them): a view."""
        position, index = self._place[name]
        return groups[position] if index is None else groups[position][:, index]
