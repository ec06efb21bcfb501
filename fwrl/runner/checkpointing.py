"""Checkpoints written off the acting and learning paths (ARCHITECTURE.md, Runs on disk).

``CheckpointWriter.request(path)`` takes a snapshot (``snapshot()``: CPU
copies of the weights, optimiser state and counters, taken by the caller
under the lock that keeps the learner between updates, so the learner waits
only for the copy and the actors not at all) and hands it to a background
thread, which writes it atomically (temporary file, fsync, rename, folder
fsync). A request for a path that is still waiting replaces the older
snapshot. ``flush()`` waits until everything requested is on disk and
re-raises a write error. ``write_seconds`` is how long the last write took
(a time limit keeps it back for the final checkpoint).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from fwrl.agents.checkpoint import write_checkpoint


class CheckpointWriter:
    def __init__(self, snapshot: Callable[[], dict[str, Any]],
                 write: Callable[[Path, dict[str, Any]], None] = write_checkpoint):
        self.snapshot = snapshot
        self.write = write
        self._pending: dict[Path, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self.written = 0
        self.write_seconds = 0.0  # how long the last write took
        self._thread = threading.Thread(target=self._loop, name="fwrl-checkpoints", daemon=True)
        self._thread.start()

    def request(self, path: Path) -> None:
        """Snapshot now; write ``path`` in the background."""
        payload = self.snapshot()
        with self._cond:
            self._raise_error()
            self._pending[Path(path)] = payload
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every requested checkpoint is written; re-raise a write error."""
        with self._cond:
            while self._pending or self._busy:
                self._cond.wait(0.1)
            self._raise_error()

    def close(self) -> None:
        """Write what is pending, then stop the thread."""
        try:
            self.flush()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                path = next(iter(self._pending))
                payload = self._pending.pop(path)
                self._busy = True
            try:
                began = time.monotonic()
                self.write(path, payload)
                self.written += 1
                self.write_seconds = time.monotonic() - began
            except BaseException as exc:  # surfaced by the next request / flush
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
