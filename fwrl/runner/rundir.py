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


def check_budget_left(path: Path, total_steps: int) -> None:
    """Refuse to resume the run in ``path`` where its checkpoint has reached ``total_steps`` already (it would
    train nothing, yet start a session: workers, a new TensorBoard file); say how to give it more. A checkpoint
    that cannot be read here is left to the resume itself, which says what is wrong with it."""
    checkpoint = Path(path) / "checkpoint.pt"
    try:
        import torch

        payload = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        steps = int(payload["agent_steps"])
    except Exception:  # noqa: BLE001 - damaged, foreign, missing: the resume's own checks word it
        return
    if steps >= total_steps:
        raise FwrlError(f"run {path} has reached its budget: its checkpoint is at {steps:,} agent steps of "
                        f"total_steps {total_steps:,}, so --resume would train nothing. Pass --total-steps above "
                        f"{steps:,} to train on (e.g. --total-steps {2 * steps}).")


LOCK_FILE = ".lock"  # one writer per run folder (fwrl.utils.locks)
RUN_FILE = "run.json"  # the run's identity: its id, which every checkpoint it writes carries


def new_run_id() -> str:
    """A new run's id: when it started and 8 random hex digits (``20261207-113000-1a2b3c4d``)."""
    import secrets
    import time

    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def read_run_id(path: Path) -> str | None:
    """The id of the run in folder ``path`` (its ``run.json``), None where it has none (a run of an fwrl
    version before run ids, or no run) or the file cannot be read."""
    import json

    try:
        data = json.loads((Path(path) / RUN_FILE).read_text())
    except (OSError, ValueError):
        return None
    run_id = data.get("id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def write_run_id(path: Path, run_id: str) -> None:
    """Record ``run_id`` as the identity of the run in folder ``path`` (atomically)."""
    import json

    from fwrl.utils.files import atomic_write_text

    atomic_write_text(Path(path) / RUN_FILE, json.dumps({"id": run_id, "folder": str(Path(path).resolve())}) + "\n")


def run_identity(run_dir: Path, run_id: str) -> dict[str, str]:
    """What a checkpoint records of the run that wrote it."""
    return {"id": run_id, "dir": str(Path(run_dir).resolve())}


def _checkpoint_run_text(payload: dict[str, Any]) -> str:
    run = payload.get("run") or {}
    config = payload.get("config") or {}
    return (f"run {run.get('id')} of {run.get('dir', 'an unknown folder')}, {config.get('env')} / {config.get('core')}, "
            f"at {int(payload.get('agent_steps', 0)):,} agent steps")


def foreign_checkpoint(run_dir: Path, path: Path, payload: dict[str, Any]) -> str | None:
    """Why checkpoint ``path`` (read: ``payload``) is not of the run in folder ``run_dir``, or None where it
    is or cannot be told: it records another run id than the folder's ``run.json``. A checkpoint or a
    folder of an fwrl version before run ids has none, and is taken as the folder's (the config
    checks that follow still hold)."""
    folder_id = read_run_id(run_dir)
    checkpoint_id = (payload.get("run") or {}).get("id")
    if folder_id is None or not checkpoint_id or checkpoint_id == folder_id:
        return None
    return (f"{path} is a checkpoint of another run ({_checkpoint_run_text(payload)}), not of the run in {run_dir} "
            f"(run {folder_id}, {RUN_FILE})")


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
        self.damage = ""  # where the dropped rows were, in words
        if self.path.exists():
            table = read_metrics_file(self.path)
            self.columns, self.rows = table.columns, len(table.rows)
            if table.damaged_rows:
                self._rewrite(table.rows)
                self.repaired = table.damaged_rows
                self.damage = damage_text(table.malformed_rows, table.torn_last_line)

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


def damage_text(malformed: int, torn: bool) -> str:
    """Where a metrics.csv's dropped rows were: lines whose fields do not fit the header (anywhere in the
    file: two rows glued together where an earlier session's write was cut short), a last line cut short."""
    parts = []
    if malformed:
        parts.append(f"{malformed} line(s) whose fields do not fit the header (rows glued together, or a row cut "
                     "inside, where an earlier session's write was cut short)")
    if torn:
        parts.append("its last line, cut short (a kill or a full disk during its write)")
    return "; ".join(parts)


def _steps(row: dict[str, str]) -> float:
    try:
        return float(row.get("agent_steps") or 0)
    except ValueError:
        return 0.0
