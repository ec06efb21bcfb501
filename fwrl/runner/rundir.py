"""Run directories: ``runs/<name>/`` with config, checkpoints and metrics.

Every file but metrics.csv is written atomically (``fwrl.utils.files.atomic_write``), so a
crash never leaves a half-written file behind; metrics.csv is appended a whole row at a time, and a
row a crash cut short is dropped when the file is next opened (``fwrl.utils.metrics_file``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fwrl.errors import FwrlError
from fwrl.utils.files import atomic_write, check_writable_folder, remove_temporary_files
from fwrl.utils.locks import FileLock
from fwrl.utils.metrics_file import append_whole, format_rows, read_metrics_file


def check_run_dir(path: Path, resume: bool) -> Path:
    """Check the run folder without creating anything: on resume it holds a run, else no
    checkpoint; its files can be written."""
    path = Path(path)
    if resume:
        if not (path / "config.yaml").exists():
            raise FwrlError(f"cannot resume: {path} holds no run (no config.yaml). Check --name / --runs-dir.")
    elif (path / "checkpoint.pt").exists():
        raise FwrlError(
            f"run folder {path} already holds a run. Pass --resume to continue it, or choose another --name."
        )
    check_writable_folder(path, "run folder", "Choose another --runs-dir.")
    return path


LOCK_FILE = ".lock"  # one writer per run folder (fwrl.utils.locks)


def lock_run_dir(path: Path) -> FileLock:
    """Take the run folder's lock for this process (the writer of ``path``), or refuse in one line
    naming the process that holds it: two ``fwrl train`` writing one folder (the same ``--name``
    twice, or ``--resume`` of a run still training) interleave their metrics and overwrite each
    other's checkpoints. Call it before anything is written; release the lock (or exit) when done."""
    lock = FileLock(Path(path) / LOCK_FILE)
    holder = lock.acquire()
    if holder is not None:
        raise FwrlError(f"run folder {path} is being written by {holder}: wait for that run to end or stop it "
                        "(Ctrl-C, or SIGTERM: it writes a checkpoint), then --resume it; or choose another --name.")
    return lock


def prepare_run_dir(path: Path, resume: bool, clean: bool = True) -> Path:
    """Create (or, on resume, check) the run folder and that it is writable. ``clean``: remove the
    temporary files of writes a killed run left behind (the process that writes the folder does
    this, before it writes anything; other learner ranks must not)."""
    path = check_run_dir(path, resume)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FwrlError(f"run folder {path} is not writable ({exc.strerror}). Choose another --runs-dir.") from None
    if clean:
        removed = remove_temporary_files(path)
        if removed:
            names = ", ".join(p.name for p in removed)
            print(f"fwrl train: removed {len(removed)} half-written file(s) an earlier run left in {path} when it "
                  f"was killed: {names}", file=sys.stderr)
    return path


class MetricsCSV:
    """The run's metrics.csv (``fwrl.utils.metrics_file``): rows appended whole, in the order they are
    written; new columns rewrite the file with the wider header. Opening it repairs a damaged tail (a
    row cut short by a kill, rows glued together): ``repaired`` says how many rows were dropped."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] = []
        self.rows = 0  # whole rows in the file: a checkpoint records it, a resume keeps that many
        self.repaired = 0
        if self.path.exists():
            table = read_metrics_file(self.path)
            self.columns, self.rows = table.columns, len(table.rows)
            if table.damaged_rows:
                self._rewrite(table.rows)
                self.repaired = table.damaged_rows

    def keep_first(self, rows: int) -> int:
        """Keep the first ``rows`` rows, those written before the checkpoint a run resumes from (a
        killed run wrote the others after it; the resumed run acts those steps again); returns how
        many were dropped."""
        before = self.rows
        if before <= rows:
            return 0
        self._rewrite(read_metrics_file(self.path).rows[:rows])
        return before - self.rows

    def drop_rows_after(self, agent_steps: int) -> int:
        """Drop the rows of more than ``agent_steps`` (a checkpoint of an fwrl version that did not
        record its row count); returns how many were dropped."""
        if not self.path.exists():
            return 0
        rows = read_metrics_file(self.path).rows
        kept = [row for row in rows if _steps(row) <= agent_steps]
        if len(kept) < len(rows):
            self._rewrite(kept)
        return len(rows) - len(kept)

    def write(self, row: dict[str, Any]) -> None:
        new_cols = [k for k in row if k not in self.columns]
        if new_cols:
            old_rows = read_metrics_file(self.path).rows if self.path.exists() else []
            self.columns += new_cols
            self._rewrite(old_rows)
        append_whole(self.path, format_rows(self.columns, [row]))
        self.rows += 1

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        data = format_rows(self.columns, rows, header=True)
        atomic_write(self.path, lambda f: f.write(data))
        self.rows = len(rows)


def _steps(row: dict[str, str]) -> float:
    try:
        return float(row.get("agent_steps") or 0)
    except ValueError:
        return 0.0
