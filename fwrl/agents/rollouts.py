"""Per-worker rollout assembly and the rollout queue (ARCHITECTURE.md, Rollouts).

A rollout holds ``[T+1, K, ...]`` tensors for the K slots of one worker plus
the core state before row 0. torchbeast's layout:

- row t holds the env output of obs t (``obs``, ``reward`` and ``done`` of the
  transition into obs t, ``episode_return``, ``episode_step``, ``task``) and
  the agent output computed from obs t-1 (``action``, ``policy_logits``,
  ``baseline``), i.e. the action that led to obs t;
- row 0 repeats the previous rollout's row T, and the initial core state is
  the state before obs T was processed.

A worker restart (new ``life``) drops the partial rollout of its slots: no
rollout ever mixes steps from two worker lives.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch
from torch import Tensor

ENV_KEYS = ("obs", "reward", "done", "episode_return", "episode_step", "task")
AGENT_KEYS = ("action", "policy_logits", "baseline")


@dataclass
class Rollout:
    tensors: dict[str, Tensor]  # [T+1, K, ...]
    initial_state: dict[str, Tensor]  # [K, ...]
    worker: int
    life: int

    @property
    def columns(self) -> int:
        return self.tensors["reward"].shape[1]

    def split(self, n: int) -> tuple["Rollout", "Rollout"]:
        """The first n columns, and the rest."""
        head = Rollout({k: v[:, :n] for k, v in self.tensors.items()},
                       {k: v[:n] for k, v in self.initial_state.items()}, self.worker, self.life)
        tail = Rollout({k: v[:, n:] for k, v in self.tensors.items()},
                       {k: v[n:] for k, v in self.initial_state.items()}, self.worker, self.life)
        return head, tail


@dataclass
class _Buffer:
    tensors: dict[str, Tensor]
    initial_state: dict[str, Tensor] | None = None
    cursor: int = 0
    life: int = 0


@dataclass
class RolloutSpec:
    unroll_length: int
    envs_per_worker: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    num_actions: int

    def empty(self) -> dict[str, Tensor]:
        T1, K = self.unroll_length + 1, self.envs_per_worker
        return {
            "obs": torch.zeros((T1, K, *self.obs_shape), dtype=self.obs_dtype),
            "reward": torch.zeros(T1, K),
            "done": torch.zeros(T1, K, dtype=torch.bool),
            "episode_return": torch.zeros(T1, K),
            "episode_step": torch.zeros(T1, K, dtype=torch.int32),
            "task": torch.zeros(T1, K, dtype=torch.int32),
            "action": torch.zeros(T1, K, dtype=torch.int64),
            "policy_logits": torch.zeros(T1, K, self.num_actions),
            "baseline": torch.zeros(T1, K),
        }


class RolloutAssembler:
    """Builds rollouts for every worker from the inference loop's steps."""

    def __init__(self, spec: RolloutSpec, num_workers: int):
        self.spec = spec
        self.buffers = [_Buffer(spec.empty()) for _ in range(num_workers)]
        self.dropped_steps = 0

    def add_env_output(self, worker: int, life: int, env: dict[str, Tensor],
                       state_in: dict[str, Tensor]) -> Rollout | None:
        """Record obs t of ``worker``; returns the rollout that row T completes, if any.

        ``state_in`` is the core state of the worker's slots before obs t is
        processed ([K, ...] tensors).
        """
        buf = self.buffers[worker]
        if life != buf.life:  # the worker was restarted: drop the partial rollout
            self.dropped_steps += buf.cursor * self.spec.envs_per_worker
            buf = self.buffers[worker] = _Buffer(self.spec.empty(), life=life)
        row = buf.cursor
        for key in ENV_KEYS:
            buf.tensors[key][row] = env[key]
        if row == 0:
            buf.initial_state = _clone(state_in)
        if row < self.spec.unroll_length:
            return None
        finished = Rollout(buf.tensors, buf.initial_state, worker, buf.life)
        # Row T becomes row 0 of the next rollout, which starts from the state before obs T.
        new = _Buffer(self.spec.empty(), initial_state=_clone(state_in), cursor=0, life=life)
        for key, value in buf.tensors.items():
            new.tensors[key][0] = value[-1]
        self.buffers[worker] = new
        return finished

    def add_agent_output(self, worker: int, agent: dict[str, Tensor]) -> None:
        """Record the agent output computed from the obs just added; it belongs to the next row."""
        buf = self.buffers[worker]
        for key in AGENT_KEYS:
            buf.tensors[key][buf.cursor + 1] = agent[key]
        buf.cursor += 1


def _clone(state: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


class RolloutQueue:
    """Bounded queue of rollouts; ``get_batch`` returns exactly B columns."""

    def __init__(self, maxsize: int):
        self._queue: queue.Queue[Rollout] = queue.Queue(maxsize=maxsize)
        self._leftover: Rollout | None = None
        self._lock = threading.Lock()

    def put(self, rollout: Rollout, stop: threading.Event) -> bool:
        while not stop.is_set():
            try:
                self._queue.put(rollout, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get_batch(self, batch_size: int, stop: threading.Event) -> list[Rollout] | None:
        """Rollout pieces totalling ``batch_size`` columns, or None once ``stop`` is set."""
        with self._lock:
            pieces, have = [], 0
            while have < batch_size:
                if self._leftover is not None:
                    piece, self._leftover = self._leftover, None
                else:
                    piece = None
                    while piece is None:
                        if stop.is_set():
                            return None
                        try:
                            piece = self._queue.get(timeout=0.1)
                        except queue.Empty:
                            continue
                need = batch_size - have
                if piece.columns > need:
                    piece, self._leftover = piece.split(need)
                pieces.append(piece)
                have += piece.columns
            return pieces


def collate(pieces: list[Rollout], device: torch.device) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Concatenate rollout pieces along the batch dimension and move them to ``device``."""
    batch = {k: torch.cat([p.tensors[k] for p in pieces], dim=1).to(device, non_blocking=True)
             for k in pieces[0].tensors}
    state = {k: torch.cat([p.initial_state[k] for p in pieces], dim=0).to(device, non_blocking=True)
             for k in pieces[0].initial_state}
    return batch, state
