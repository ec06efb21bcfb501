"""Observations staged straight from the env workers' shared memory (``acting_staging: shared``).

The local backend's workers write their step records into arrays they share with the learner's
process, one per column, ``[slots, ...]`` (``LocalWorkerPool.shared_arrays``; a worker's K slots
are rows ``worker * K`` to ``worker * K + K``). By default an acting call packs the ready workers'
rows of each column group into one host buffer (pinned on CUDA) and uploads it
(``fwrl.agents.acting_staging``): for frames, a copy of megabytes on the acting thread at every call,
the store's largest host cost on a GPU box (``benchmarks/results/gpu/README.md``, 35e8e0f).

:class:`SharedRows` skips that copy for the observation columns:

- on CUDA the shared arrays are registered as pinned memory once (``cudaHostRegister``), and each
  call copies the ready workers' rows, one asynchronous copy per run of consecutive workers, into a
  device buffer of every slot's row (``[slots, ...]``, one for all batch sizes and graphs);
- on the CPU the shared arrays are that buffer (no copy at all);
- the step (graphed or not) gathers its slots' rows from it by their pool slots
  (``fwrl.agents.acting_staging.Staging.step_rows``, ``StepIndex.pool_slots``): one device op.

Rows of workers that are not in the call may change under the copy; they are never read. A ready
worker's rows stay as they are until it gets its actions, which leave after the step's device
work, the copies included, is done (the actions' trip to the host waits for it).
"""

from __future__ import annotations

import threading
import weakref
from typing import Sequence

import numpy as np
import torch

from fwrl.envs.step_record import OBS, OBS_EXTRA, ColumnGroup
from fwrl.envs.worker_pool import StepResult

ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered
_registered: dict[int, int] = {}  # pointer -> users: several loops (acting threads) share one pool's arrays
_registered_lock = threading.Lock()


def _register(tensor: torch.Tensor) -> None:
    """Pin ``tensor``'s host memory for asynchronous copies (once per pointer, counted)."""
    pointer = tensor.data_ptr()
    with _registered_lock:
        if pointer not in _registered:
            code = int(torch.cuda.cudart().cudaHostRegister(pointer, tensor.nbytes, 0))
            if code not in (0, ALREADY_REGISTERED):
                raise RuntimeError(f"cudaHostRegister of the env workers' shared {tuple(tensor.shape)} array failed "
                                   f"(CUDA error {code}); run with --acting-staging pack")
        _registered[pointer] = _registered.get(pointer, 0) + 1


def _unregister(pointer: int) -> None:
    with _registered_lock:
        _registered[pointer] -= 1
        if _registered[pointer] == 0:
            del _registered[pointer]
            torch.cuda.cudart().cudaHostUnregister(pointer)


class SharedRows:
    """The observation groups of ``groups`` read from the pool's shared ``arrays`` (module
    docstring) for an acting loop on ``device``; ``k``: envs per worker."""

    def __init__(self, arrays: dict[str, np.ndarray], groups: Sequence[ColumnGroup], device: torch.device, k: int):
        self.device = torch.device(device)
        self.k = k
        self.names = tuple(g.name for g in groups if g.name in (OBS, OBS_EXTRA) and g.name in arrays)
        self.host: dict[str, torch.Tensor] = {}
        self.buffers: dict[str, torch.Tensor] = {}  # [slots, ...] on the device: what the step gathers from
        self._where: dict[str, tuple[int, int]] = {}  # per group: (its shared array's address, bytes per worker)
        for g in groups:
            if g.name not in self.names:
                continue
            array = arrays[g.name]
            if array.shape[1:] != tuple(g.shape) or array.dtype != np.dtype(g.dtype) or not array.flags.c_contiguous:
                raise ValueError(f"the pool's shared {g.name!r} array is {array.dtype}{list(array.shape)}, the step "
                                 f"record's column {g.dtype}{list(g.shape)} per slot")
            host = torch.from_numpy(array)
            self.host[g.name] = host
            self._where[g.name] = (host.data_ptr(), k * array[0].nbytes)
            if self.device.type == "cuda":
                _register(host)
                weakref.finalize(self, _unregister, host.data_ptr())
                self.buffers[g.name] = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            else:
                self.buffers[g.name] = host

    def upload(self, results: list[StepResult]) -> dict[str, torch.Tensor]:
        """The device buffers, with the rows of ``results``' workers current (copied on the current
        stream without blocking, on CUDA). Each result's arrays must be the pool's shared rows of its
        worker, as the local backend's are (a ValueError otherwise)."""
        self._check_views(results)
        if self.device.type == "cuda":
            for first, last in _runs(sorted(r.worker for r in results)):
                rows = slice(first * self.k, (last + 1) * self.k)
                for name, host in self.host.items():
                    self.buffers[name][rows].copy_(host[rows], non_blocking=True)
        return self.buffers

    def _check_views(self, results: list[StepResult]) -> None:
        for name, (start, worker_bytes) in self._where.items():
            for r in results:
                rows = r.arrays[name]
                if rows.ctypes.data != start + r.worker * worker_bytes or len(rows) != self.k:
                    raise ValueError(f"worker {r.worker}'s {name!r} rows are not the pool's shared rows: "
                                     f"shared staging needs a pool whose results are views of its shared arrays")


def _runs(workers: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ``workers`` as (first, last) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for w in workers:
        if runs and w == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], w)
        else:
            runs.append((w, w))
    return runs
