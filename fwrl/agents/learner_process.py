"""The learner's update in a process of its own (``--learner-process``; ARCHITECTURE.md, Processes and machines).

The acting thread and the learner thread of one process take turns at one GIL. On the CPU a
fast-weight core's learner runs a Python loop over the unroll, many small torch calls a step, and
the acting thread waits for the GIL between them (and the learner for the acting thread's); on a
GPU every thread's Python is the launch of its kernels, and the acting step's launches queue behind
the learner's. Here the update's maths (:func:`fwrl.agents.update_step.optimise`: forward, loss, backward, clip,
optimiser and schedule steps) run in a spawned process with its own interpreter, while the
learner thread keeps everything else: the rollout queue, the gather, the policy lag, the publish
and the counters. It waits for the process with the GIL released.

- **Weights**: the model goes to the process once, at :meth:`UpdateProcess.start`; handing it over
  moves a CPU model's parameters into shared memory, and shares a CUDA model's device memory
  (CUDA IPC: ``torch.multiprocessing``), so the process trains the parent's own tensors in place.
  The learner thread publishes them to the acting copy after each update (the process is idle
  then), and a checkpoint copies them.
- **Optimiser and schedule**: trained in the process; :meth:`UpdateProcess.training_state` brings
  their state back, on the host (the learner loads it into its own copies before a checkpoint and
  when it stops).
- **Batches**: one buffer per batch layout (in shared memory, or on the model's GPU), handed over
  once; each gathered batch is copied into it and an update asks for a few bytes.
- **Order on a GPU**: two processes' streams know nothing of each other, so each side finishes its
  device work before it hands over: the learner thread its copies into the buffers (and the publish
  before them, which reads the weights the process is about to change) before it asks for an
  update, the process its update before it answers.

The process dies with its parent, ignores Ctrl-C (the run stops it), and answers an error with
its traceback, which the learner thread raises.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

import torch
from torch import nn

from fwrl.agents.checkpoint import host_copy
from fwrl.agents.stage_timer import StageTimer
from fwrl.agents.update_step import optimise
from fwrl.errors import FwrlError

# How long :meth:`UpdateProcess.close` waits for the process to leave before it kills it.
CLOSE_SECONDS = 10.0


def _layout(tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}


class UpdateProcess:
    """The update's maths in a spawned process (module docstring), for one learner rank, on the CPU or
    a CUDA device (the model's).

    ``start()`` spawns it with ``model``, ``optimizer`` and ``scheduler`` (their state as it is then,
    a resumed run's included); per update ``load(tensors, initial_state)`` copies a gathered batch
    into the shared buffers and ``update()`` returns the loss's statistics and the seconds of each
    learner stage the process timed; ``training_state()`` the optimiser's and the schedule's state;
    ``close()`` stops it. Calls come from one thread at a time (the learner's, or a checkpoint's
    under the learner's update lock); a lock keeps the pipe whole if not."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, settings: Any,
                 action_dims: Any, threads: int):
        self.device = next(model.parameters()).device
        if self.device.type not in ("cpu", "cuda"):
            raise FwrlError(f"the update process trains CPU or CUDA models; this one is on {self.device}")
        self._parts = (model, optimizer, scheduler, settings, action_dims, threads)
        self._process = None
        self._conn = None
        self._layouts: tuple[dict, dict] | None = None
        self._buffers: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self._pipe = threading.Lock()
        self.ready = False  # started, answered that it is ready, and not closed

    @property
    def running(self) -> bool:
        """Started and not closed."""
        return self._conn is not None

    def start(self) -> None:
        import os

        ctx = torch.multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, os.getpid(), *self._parts),
                                    name="fwrl-update", daemon=True)
        try:  # handing the model over moves its tensors into shared memory
            self._process.start()
        except (RuntimeError, OSError) as exc:
            if not _out_of_shared_memory(exc):
                raise
            raise _no_shared_memory("the model", exc) from exc
        finally:
            child.close()
        self._conn = parent

    def wait_ready(self, stop: threading.Event | None = None) -> bool:
        """Wait until the process has started (spawned, torch imported, the model unpickled: seconds);
        False if ``stop`` was set first (it is then killed by :meth:`close`, having trained nothing)."""
        while not self.ready:
            if stop is not None and stop.is_set():
                return False
            if self._conn.poll(0.05):
                self._receive("start")
                self.ready = True
        return True

    def load(self, tensors: dict[str, torch.Tensor], initial_state: dict[str, torch.Tensor]) -> None:
        """Copy a gathered batch into the shared buffers (made, and handed over, for a new layout); on a
        GPU, wait until this thread's stream has done the copies and all it was given before them."""
        layouts = (_layout(tensors), _layout(initial_state))
        if layouts != self._layouts:
            try:
                self._buffers = tuple({name: self._buffer(shape, dtype) for name, (shape, dtype) in layout.items()}
                                      for layout in layouts)
            except (RuntimeError, OSError) as exc:
                if not _out_of_shared_memory(exc):
                    raise
                raise _no_shared_memory("a batch", exc) from exc
            self._layouts = layouts
            self._send(("buffers", *self._buffers))
        for source, target in zip((tensors, initial_state), self._buffers):
            for name, value in source.items():
                target[name].copy_(value)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _buffer(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """One batch buffer: in shared memory on the CPU; on a GPU, device memory the process opens once."""
        if self.device.type == "cuda":
            return torch.empty(shape, dtype=dtype, device=self.device)
        return torch.empty(shape, dtype=dtype).share_memory_()

    def update(self) -> tuple[dict[str, float], dict[str, float]]:
        """One update on the loaded batch: (the loss's statistics, seconds per learner stage)."""
        return self._call(("update",))

    def training_state(self) -> tuple[dict, dict]:
        """(the optimiser's state_dict, the schedule's), as the process has them now; the optimiser's
        tensors on the host (a GPU model's are copies: nothing here holds the process's device memory)."""
        return self._call(("state",))

    def close(self) -> None:
        """Stop the process (killed if it does not leave within :data:`CLOSE_SECONDS`)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        ready, self.ready = self.ready, False
        try:
            with self._pipe:
                conn.send(("close",))
        except (BrokenPipeError, EOFError, OSError):
            pass
        self._process.join(CLOSE_SECONDS if ready else 0.0)  # one still starting has nothing to finish
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        conn.close()

    def _send(self, message: tuple) -> None:
        if self._conn is None:
            raise FwrlError("the learner's update process is not running (never started, or closed)")
        with self._pipe:
            self._conn.send(message)

    def _call(self, message: tuple) -> Any:
        if self._conn is None:
            raise FwrlError("the learner's update process is not running (never started, or closed)")
        if not self.ready:
            self.wait_ready()
        with self._pipe:
            try:
                self._conn.send(message)
            except (BrokenPipeError, EOFError, ConnectionResetError) as exc:
                self._died(message[0], exc)
            return self._receive(message[0])

    def _receive(self, during: str) -> Any:
        try:
            reply = self._conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            self._died(during, exc)
        if reply[0] == "error":
            raise FwrlError(f"the learner's update process failed during {during!r}:\n{reply[1]}")
        return reply[1:] if len(reply) > 2 else (reply[1] if len(reply) > 1 else None)

    def _died(self, during: str, exc: BaseException) -> None:
        self._process.join(1.0)
        raise FwrlError(f"the learner's update process died (exit code {self._process.exitcode}) "
                        f"during {during!r}") from exc


def _out_of_shared_memory(exc: BaseException) -> bool:
    """torch's words (or the system's) for a full /dev/shm."""
    text = str(exc)
    return "No space left on device" in text or "unable to write to file </torch_" in text or "shm" in text


def _no_shared_memory(what: str, exc: BaseException) -> FwrlError:
    return FwrlError(f"could not put {what} into shared memory for the learner's update process ({exc}); "
                     "/dev/shm may be too small (64 MB in a container by default): give it more (docker or "
                     "podman run --shm-size=1g) or run with --learner-process off")


def _serve(conn, parent_pid: int, model: nn.Module, optimizer, scheduler, settings, action_dims,
           threads: int) -> None:
    """The update process: answers the parent's messages until ``close`` or a closed pipe."""
    from fwrl.utils.allocator import keep_freed_memory
    from fwrl.utils.child_process import become_child_of

    become_child_of(parent_pid)
    torch.set_num_threads(threads)
    keep_freed_memory()
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timer = StageTimer(device)  # on a GPU its stages are timed by events, read once the update is done
    conn.send(("ready",))
    tensors = initial_state = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        kind = message[0]
        try:
            if kind == "buffers":
                tensors, initial_state = message[1], message[2]
            elif kind == "update":
                timer.collect()  # the stages of this update only
                stats = optimise(model, optimizer, scheduler, params, settings, action_dims, tensors,
                                 initial_state, timer)
                if device.type == "cuda":  # the weights are the parent's to read once it has the answer
                    torch.cuda.current_stream(device).synchronize()
                seconds, _ = timer.collect()
                conn.send(("ok", stats, seconds))
            elif kind == "state":
                optimizer_state = optimizer.state_dict()
                if device.type == "cuda":
                    optimizer_state = host_copy(optimizer_state)
                conn.send(("ok", optimizer_state, scheduler.state_dict()))
            elif kind == "close":
                return
            else:
                conn.send(("error", f"unknown message {kind!r}"))
        except Exception:  # the parent raises it in the learner thread
            conn.send(("error", traceback.format_exc()))
