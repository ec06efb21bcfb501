"""The queue of finished rollouts between the inference loop and the learner.

It holds :class:`~fwrl.agents.rollouts.Rollout` handles (indices into the
rollout store, not data). ``get_batch`` returns pieces totalling exactly B
columns; when B is not a multiple of the K columns of a rollout, the rest of
the last one waits for the next batch.
"""

from __future__ import annotations

import queue
import threading

from fwrl.agents.rollouts import Rollout, RolloutPiece


class RolloutQueue:
    """Bounded queue of finished rollouts; ``put`` blocks while it is full (backpressure on acting)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._queue: queue.Queue[Rollout] = queue.Queue(maxsize=maxsize)
        self._leftover: RolloutPiece | None = None
        self._lock = threading.Lock()

    def put(self, rollout: Rollout, stop: threading.Event) -> bool:
        """Queue ``rollout``; False if ``stop`` was set while waiting for room."""
        while not stop.is_set():
            try:
                self._queue.put(rollout, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def qsize(self) -> int:
        """Rollouts waiting (a partly taken one counts)."""
        return self._queue.qsize() + (self._leftover is not None)

    def get_batch(self, batch_size: int, stop: threading.Event) -> list[RolloutPiece] | None:
        """Pieces totalling ``batch_size`` columns, or None once ``stop`` is set."""
        with self._lock:
            pieces, have = [], 0
            while have < batch_size:
                if self._leftover is not None:
                    piece, self._leftover = self._leftover, None
                else:
                    rollout = None
                    while rollout is None:
                        if stop.is_set():
                            return None
                        try:
                            rollout = self._queue.get(timeout=0.1)
                        except queue.Empty:
                            continue
                    piece = RolloutPiece(rollout, 0, rollout.columns)
                need = batch_size - have
                if piece.width > need:
                    piece, self._leftover = (RolloutPiece(piece.rollout, piece.start, piece.start + need),
                                             RolloutPiece(piece.rollout, piece.start + need, piece.stop))
                pieces.append(piece)
                have += piece.width
            return pieces
