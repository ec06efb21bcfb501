"""Several learners as ``torch.distributed`` ranks (ARCHITECTURE.md, Processes and machines: past one GPU).

Each rank owns a device, its own env workers, inference loop and rollout
store, and computes the IMPALA loss on its own B rollout columns. After the
backward pass the ranks' gradients are **summed** with one all-reduce of a
flat buffer, so every rank takes the same optimiser step and holds the same
weights. Summed, not averaged: the IMPALA loss is a *sum* over T x B
(PAPERS.md §4), so the sum of the ranks' gradients is exactly the gradient of
one learner on the union of their batches; averaging would shrink every step
by the number of ranks (RMSProp's eps and the global-norm clip make that
visible).

The same all-reduce carries one more number: whether some rank wants to stop
(a signal, its time limit, its workers lost, an error). Then no rank steps,
and all leave the loop after the same update, so no rank is left waiting in a
collective. A rank that dies outright is noticed by the others' collectives
(gloo: at once, when its sockets close; otherwise at the process-group
timeout); they then ask every rank to pass a monitored barrier on a second
(gloo) group, whose error names the ranks that did not answer.

Ranks come from the launcher's environment: ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK`` (torchrun, ``fwrl train --learners N``) or SLURM's
``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` with
``MASTER_ADDR`` / ``MASTER_PORT`` set by the job script.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn


@dataclass(frozen=True)
class Ranks:
    """This process's place among the learner ranks."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def ranks_from_env(environ: dict[str, str] | None = None) -> Ranks:
    """The ranks a launcher set in the environment (a single rank when none did)."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env:
        return Ranks(int(env.get("RANK", 0)), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)))
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "MASTER_ADDR" in env:
        return Ranks(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", 0)))
    return Ranks()


def share(total: int, ranks: Ranks) -> int:
    """This rank's share of ``total`` (e.g. env workers): as even as can be, earlier ranks first."""
    base, extra = divmod(total, ranks.world_size)
    return base + (1 if ranks.rank < extra else 0)


def first_of_share(total: int, ranks: Ranks) -> int:
    """The run-wide index of this rank's first item of ``total`` shared by :func:`share` (e.g. its
    first env worker: worker ``w`` of rank ``r`` is worker ``first_of_share(total, r) + w`` of the run)."""
    base, extra = divmod(total, ranks.world_size)
    return ranks.rank * base + min(ranks.rank, extra)


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """``cuda`` becomes ``cuda:<local rank mod GPUs>`` (ranks share GPUs when there are more ranks
    than GPUs); a CPU device is kept."""
    if device.type != "cuda" or not ranks.distributed:
        return device
    return torch.device("cuda", ranks.local_rank % max(1, torch.cuda.device_count()))


class CollectiveFailed(RuntimeError):
    """A collective with the other learner ranks failed (a rank died, or the timeout passed)."""


def _collective(call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # gloo / NCCL raise RuntimeError subclasses (DistBackendError, ...)
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CollectiveFailed(f"{getattr(call, '__name__', 'collective')}: {first}") from exc


class LearnerGroup:
    """The process group of the learner ranks: gradient sums, stop votes, gathers, checks."""

    def __init__(self, ranks: Ranks, device: torch.device, timeout: float = 300.0, backend: str = "auto"):
        self.ranks = ranks
        self.device = torch.device(device)
        self.timeout = datetime.timedelta(seconds=timeout)
        if backend == "auto":  # NCCL needs one GPU per rank; ranks sharing a GPU, or CPUs, use gloo
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.world_size))
            own_gpu = self.device.type == "cuda" and per_node <= torch.cuda.device_count()
            backend = "nccl" if own_gpu else "gloo"
        self.backend = backend
        if not dist.is_initialized():
            dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world_size, timeout=self.timeout)
        # a gloo group beside it: Python objects, checksums and the monitored barrier
        self.control = dist.new_group(backend="gloo", timeout=self.timeout)
        self._buffer: Tensor | None = None

    # ------------------------------------------------------------------ per update
    def sum_gradients(self, params: Sequence[nn.Parameter], stop: bool = False) -> bool:
        """Sum every rank's gradients of ``params`` in place; returns True if some rank voted to
        stop (then no rank should step: the gradients are left as they were)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        numel = sum(g.numel() for g in grads)
        # float32 (half and bfloat16 gradients are summed in it); float64 where the weights are
        dtype = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
        if self._buffer is None or self._buffer.numel() != numel + 1 or self._buffer.dtype != dtype:
            self._buffer = torch.empty(numel + 1, device=self.device, dtype=dtype)
        flat = self._buffer
        torch.cat([g.detach().reshape(-1).to(dtype) for g in grads], out=flat[:numel])
        flat[numel] = 1.0 if stop else 0.0
        _collective(dist.all_reduce, flat, op=dist.ReduceOp.SUM)
        if flat[numel].item() > 0:
            return True
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            summed = flat[offset:offset + n].view_as(g).to(g.dtype)
            if p.grad is None:
                p.grad = summed.clone()
            else:
                p.grad.copy_(summed)
            offset += n
        return False

    def vote_stop(self, params: Sequence[nn.Parameter]) -> None:
        """Join the next gradient sum with a stop vote and no gradient of one's own."""
        for p in params:
            p.grad = None
        self.sum_gradients(params, stop=True)

    # ------------------------------------------------------------------ now and then
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.ranks.world_size
        _collective(dist.all_gather_object, out, obj, group=self.control)
        return out

    def check_same_weights(self, model: nn.Module) -> None:
        """Raise if the ranks' weights differ (a cheap position-weighted checksum of every parameter)."""
        with torch.no_grad():
            total = torch.zeros((), dtype=torch.float64)
            for i, p in enumerate(model.parameters()):
                total += (p.detach().double().cpu().flatten() * (1.0 + (i % 7))).sum()
        sums = [float(x) for x in self.gather(float(total))]
        if max(sums) - min(sums) > 1e-9 * max(1.0, max(abs(s) for s in sums)):
            raise RuntimeError(f"the learner ranks' weights differ (parameter checksums {sums}); the gradient "
                               "sums did not keep them identical")

    def broadcast_weights(self, model: nn.Module) -> None:
        """Every rank takes rank 0's weights and buffers (at the start of a run)."""
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                _collective(dist.broadcast, tensor.data, src=0)

    def missing_ranks(self, timeout: float = 10.0) -> str:
        """After a failed collective: which ranks do not answer (the monitored barrier's words), or ''."""
        try:
            dist.monitored_barrier(group=self.control, timeout=datetime.timedelta(seconds=timeout),
                                   wait_all_ranks=True)
        except Exception as exc:  # it raises to report the ranks that did not answer
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return text[:300] if "monitoredBarrier" in text else ""  # not a dead connection's gloo error
        return ""

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
