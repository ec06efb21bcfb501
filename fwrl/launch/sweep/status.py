"""Cell status files (``SWEEP/status/CELL.json``, written atomically) and the locks that say a cell runs.

A status holds ``state`` (below), ``phase`` (train or evaluate), ``exit_code``,
``started`` / ``ended`` (ISO times), ``seconds``, ``log``, ``host``, ``pid``,
``attempt``, ``agent_steps``, ``evaluated`` / ``eval_episodes``, ``message``
(why it failed or stopped) and, for the slurm executor, ``job_id``.

States: ``pending`` (no status yet), ``queued`` (submitted to SLURM), ``running``,
``done`` (trained to its budget, and evaluated where that was asked), ``failed``
(a command of the cell exited with an error), ``interrupted`` (stopped by a
signal or a time limit, with a checkpoint to resume from).

The cell runner holds ``SWEEP/status/CELL.lock`` (``flock``) while it runs, so a
``running`` status whose lock is free belongs to a runner that died (killed,
its node lost): it counts as interrupted. On file systems without locks the
lock is skipped.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fwrl.utils.files import atomic_write_text
from fwrl.utils.locks import FileLock

STATES = ("pending", "queued", "running", "done", "failed", "interrupted")


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def status_path(sweep_dir: Path, cell: str) -> Path:
    return Path(sweep_dir) / "status" / f"{cell}.json"


def log_path(sweep_dir: Path, cell: str) -> Path:
    return Path(sweep_dir) / "logs" / f"{cell}.log"


def read_status(sweep_dir: Path, cell: str) -> dict[str, Any] | None:
    """The cell's status, or None where it has none (never started) or it cannot be read."""
    try:
        data = json.loads(status_path(sweep_dir, cell).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("state") in STATES else None


def write_status(sweep_dir: Path, cell: str, **fields: Any) -> dict[str, Any]:
    """Update the cell's status with ``fields`` (atomically); returns the new status."""
    status = read_status(sweep_dir, cell) or {"cell": cell}
    status.update(fields, host=fields.get("host", status.get("host", socket.gethostname())))
    path = status_path(sweep_dir, cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(status, indent=2) + "\n")
    return status


class CellLock:
    """An exclusive, non-blocking lock on ``SWEEP/status/CELL.lock`` (``fwrl.utils.locks``: released on
    close or at any exit)."""

    def __init__(self, sweep_dir: Path, cell: str):
        self.path = Path(sweep_dir) / "status" / f"{cell}.lock"
        self._lock = FileLock(self.path)

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it."""
        return self._lock.acquire() is None

    def release(self) -> None:
        self._lock.release()


def is_running(sweep_dir: Path, cell: str) -> bool:
    """Whether a live cell runner holds the cell's lock (on this machine or, with shared locks, another)."""
    if not (Path(sweep_dir) / "status" / f"{cell}.lock").exists():
        return False
    lock = CellLock(sweep_dir, cell)
    if lock.acquire():
        lock.release()
        return False
    return True


def evaluation_done(status: dict[str, Any] | None, eval_episodes: int | None) -> bool:
    """Whether the cell was evaluated with ``eval_episodes`` (None: the protocol's own)."""
    return bool(status and status.get("evaluated") and status.get("eval_episodes") == eval_episodes)


def effective_state(sweep_dir: Path, cell: str, status: dict[str, Any] | None = None) -> str:
    """The cell's state, with a ``running`` status whose runner is gone read as ``interrupted``."""
    status = status if status is not None else read_status(sweep_dir, cell)
    if status is None:
        return "pending"
    state = status["state"]
    if state == "running" and not is_running(sweep_dir, cell):
        return "interrupted"
    return state
