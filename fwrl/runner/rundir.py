"""Run folders (``runs/<name>/``) and their one owner, :class:`RunDir`: it creates, locks, reads and
trims the folder, and writes its small files (``config.yaml``, ``run.json``, ``config-edits.log``).
The other files have their own writers: ``checkpoint.pt`` the checkpoint thread
(:mod:`fwrl.runner.checkpointing`), ``metrics.csv`` and ``episodes.csv`` a :class:`MetricsCSV` each
(opened for a session by :meth:`RunDir.metrics`), ``tensorboard/`` the metrics sink
(:mod:`fwrl.runner.run_metrics`).

Every file but the two CSV files and the append-only ones (``config-edits.log``, TensorBoard's event files)
is written atomically (``fwrl.utils.files.atomic_write``), so a crash never leaves a half-written file
behind, only a temporary one, removed when the folder is next opened; the CSV files are appended whole
rows at a time, and a row a crash cut short is dropped when the file is next opened
(``fwrl.utils.metrics_file``).
"""

from __future__ import annotations

import json
import math
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, save_config
from fwrl.utils.files import atomic_write, atomic_write_text, check_writable_folder, remove_temporary_files
from fwrl.utils.locks import FileLock
from fwrl.utils.metrics_file import EPISODES_FILE, METRICS_FILE, append_whole, format_rows, read_metrics_file

LOCK_FILE = ".lock"  # one writer per run folder (fwrl.utils.locks)
RUN_FILE = "run.json"  # the run's identity: its id, which every checkpoint it writes carries
CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_EDITS_LOG = "config-edits.log"  # a run's record of the config.yaml edits it resumed on
TENSORBOARD = "tensorboard"  # the run's TensorBoard event files (where tensorboard is installed)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class SessionMetrics(NamedTuple):
    """A session's metrics.csv and episodes.csv, opened and trimmed (:meth:`RunDir.metrics`), and what
    TensorBoard needs of them."""

    csv: "MetricsCSV"
    episodes: "MetricsCSV"  # episodes.csv: one row per finished training episode
    purge_step: int | None  # a resumed run's checkpoint step: TensorBoard hides later events of a killed session
    at_purge_step: list[dict[str, str]]  # the kept rows of that step (TensorBoard writes them again)


class RunDir:
    """The folder of one run, and the one owner of its creation, lock and small files.

    Checks (nothing written): :meth:`check`, :meth:`check_budget_left`. Made ready for this process:
    :meth:`open` (create, lock as the writer, check, clean), or :meth:`prepare` without the lock;
    :meth:`close` releases the lock, :meth:`discard_unused` removes a folder this process made for a
    run that never wrote a checkpoint. Read: :meth:`run_id`, :meth:`foreign_checkpoint`. Written:
    :meth:`save_config`, :meth:`identify` (``run.json``), :meth:`record_config_edits`. Trimmed for a
    session: :meth:`metrics`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock: FileLock | None = None
        self._made: list[Path] = []  # the folders create() made, deepest first

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_FILE

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    # ------------------------------------------------------------------ checks: nothing is written

    def check(self, resume: bool) -> None:
        """Check the folder without creating anything: on resume it holds a run, else no checkpoint;
        its files can be written."""
        if resume:
            if not self.config_file.exists():
                raise FwrlError(f"cannot resume: {self.path} holds no run (no config.yaml). Check --name / --runs-dir.")
        elif self.checkpoint.exists():
            raise FwrlError(f"run folder {self.path} already holds a run. Pass --resume to continue it, or choose "
                            "another --name.")
        check_writable_folder(self.path, "run folder", "Choose another --runs-dir.")

    def check_budget_left(self, total_steps: int) -> None:
        """Refuse to resume the run where its checkpoint has reached ``total_steps`` already (it would train
        nothing, yet start a session: workers, a new TensorBoard file); say how to give it more. A checkpoint
        that cannot be read here is left to the resume itself, which says what is wrong with it."""
        try:
            import torch

            payload = torch.load(self.checkpoint, map_location="cpu", weights_only=True, mmap=True)
            steps = int(payload["agent_steps"])
        except Exception:  # noqa: BLE001 - damaged, foreign, missing: the resume's own checks word it
            return
        if steps >= total_steps:
            raise FwrlError(f"run {self.path} has reached its budget: its checkpoint is at {steps:,} agent steps of "
                            f"total_steps {total_steps:,}, so --resume would train nothing. Pass --total-steps "
                            f"above {steps:,} to train on (e.g. --total-steps {2 * steps}).")

    # ------------------------------------------------------------------ made ready: create, lock, clean

    def create(self) -> None:
        """Create the folder (and its missing parents) where it is missing; the first call that makes
        it remembers what it made (:meth:`discard_unused`)."""
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            check_writable_folder(self.path, "run folder", "Choose another --runs-dir.")  # says why, where it can
            raise FwrlError(f"run folder {self.path} is not writable ({exc.strerror}). Choose another "
                            "--runs-dir.") from None
        if missing and not self._made:
            self._made = missing

    def lock(self) -> None:
        """Take the folder's lock for this process (its writer), or refuse in one line naming the process
        that holds it: two ``fwrl train`` writing one folder (the same ``--name`` twice, or ``--resume``
        of a run still training) interleave their metrics and overwrite each other's checkpoints. Taken
        before anything is written; held until :meth:`close` (or the process's exit)."""
        lock = FileLock(self.path / LOCK_FILE)
        holder = lock.acquire()
        if holder is not None:
            raise FwrlError(f"run folder {self.path} is being written by {holder}: wait for that run to end or stop "
                            "it (Ctrl-C, or SIGTERM: it writes a checkpoint), then --resume it; or choose another "
                            "--name.")
        self._lock = lock

    def clean(self) -> list[Path]:
        """Remove the temporary files of writes a killed run left behind (said in one line) but those of
        writers still running; the folder's writer does this before it writes anything, other learner
        ranks must not. Returns the removed paths."""
        removed = remove_temporary_files(self.path)
        if removed:
            names = ", ".join(p.name for p in removed)
            say(f"fwrl train: removed {len(removed)} half-written file(s) an earlier run left in {self.path} when it "
                f"was killed: {names}")
        return removed

    def prepare(self, resume: bool, clean: bool = True) -> None:
        """Check the folder (:meth:`check`), create it and, with ``clean``, remove what killed writes left."""
        self.check(resume)
        self.create()
        if clean:
            self.clean()

    def open(self, resume: bool, writer: bool) -> None:
        """Make the folder ready for this process: create it; as its ``writer`` (rank 0) take its lock
        first of all; check it; as its writer, clean it."""
        self.create()
        if writer:
            self.lock()
        self.prepare(resume, clean=writer)

    def close(self) -> None:
        """Release the folder's lock, where this process holds it."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def discard_unused(self) -> None:
        """Remove the folder where this process made it (:meth:`create`), holds its lock and no checkpoint
        was written (a new run refused or interrupted while it started): no folder with a config and
        nothing to resume is left; the parents made with it go too, where empty."""
        if not self._made or self._lock is None or self.checkpoint.exists():
            return
        shutil.rmtree(self.path, ignore_errors=True)
        for parent in self._made[1:]:  # deepest first: runs/ made for this run alone goes with it
            try:
                parent.rmdir()
            except OSError:
                break

    # ------------------------------------------------------------------ read and written: its small files

    def run_id(self) -> str | None:
        """The id of the run in the folder (its ``run.json``), None where it has none (a run of an fwrl
        version before run ids, or no run) or the file cannot be read."""
        try:
            data = json.loads((self.path / RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        run_id = data.get("id") if isinstance(data, dict) else None
        return run_id if isinstance(run_id, str) and run_id else None

    def identify(self, resume: bool) -> str:
        """The run's id, recorded in ``run.json`` (atomically): a new run's own (when it started and 8 random
        hex digits, ``20261207-113000-1a2b3c4d``), a resumed run's from the folder (one of an older fwrl
        version gets one now)."""
        recorded = self.run_id()
        run_id = (recorded if resume else None) or f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
        if recorded != run_id:
            atomic_write_text(self.path / RUN_FILE,
                              json.dumps({"id": run_id, "folder": str(self.path.resolve())}) + "\n")
        return run_id

    def identity(self, run_id: str) -> dict[str, str]:
        """What a checkpoint records of the run that wrote it."""
        return {"id": run_id, "dir": str(self.path.resolve())}

    def foreign_checkpoint(self, path: Path, payload: dict[str, Any]) -> str | None:
        """Why checkpoint ``path`` (read: ``payload``) is not of the run in this folder, or None where it is
        or cannot be told: it records another run id than the folder's ``run.json``. A checkpoint or a
        folder of an fwrl version before run ids has none, and is taken as the folder's (the config
        checks that follow still hold)."""
        folder_id = self.run_id()
        checkpoint_id = (payload.get("run") or {}).get("id")
        if folder_id is None or not checkpoint_id or checkpoint_id == folder_id:
            return None
        return (f"{path} is a checkpoint of another run ({_checkpoint_run_text(payload)}), not of the run in "
                f"{self.path} (run {folder_id}, {RUN_FILE})")

    def save_config(self, config: TrainConfig) -> None:
        """Write ``config.yaml`` (atomically): the settings the run trains with."""
        save_config(config, self.config_file)

    def record_config_edits(self, details: str) -> Path:
        """Append the config.yaml edits a resume accepted (``details``, in words) to ``config-edits.log``;
        returns its path."""
        log = self.path / CONFIG_EDITS_LOG
        with log.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} resumed on an edited config.yaml: {details}\n")
        return log

    # ------------------------------------------------------------------ trimmed for a session: the metrics

    def metrics(self, resumed: Mapping[str, Any] | None) -> SessionMetrics:
        """The run's metrics.csv for this session, read once. A new run in a folder that holds the metrics
        (and TensorBoard events) of a run killed before its first checkpoint starts them anew. A damaged
        tail is repaired. ``resumed``: a resumed run's checkpoint counters (``agent_steps``, and
        ``metrics_rows``, the rows written when it was taken; -1 in checkpoints that predate it): the rows
        a killed session wrote after it are dropped (they are acted again), and so are the episodes.csv rows
        of more agent steps than the checkpoint's. Each is said in one line."""
        path, episodes_path = self.path / METRICS_FILE, self.path / EPISODES_FILE
        if resumed is None and (path.exists() or episodes_path.exists() or self.tensorboard.exists()):
            path.unlink(missing_ok=True)
            episodes_path.unlink(missing_ok=True)
            shutil.rmtree(self.tensorboard, ignore_errors=True)
            say(f"fwrl train: removed the metrics a run killed before its first checkpoint left in {self.path}")
        csv, episodes = MetricsCSV(path), MetricsCSV(episodes_path)
        for table in (csv, episodes):
            if table.repaired:
                say(f"fwrl train: dropped {table.repaired} damaged row(s) of {table.path}: {table.damage}")
        if resumed is None:
            csv.forget_read()
            episodes.forget_read()
            return SessionMetrics(csv, episodes, None, [])
        steps, rows = int(resumed["agent_steps"]), int(resumed.get("metrics_rows", -1))
        dropped = csv.keep_first(rows) if rows >= 0 else csv.drop_rows_after(steps)
        if dropped:
            say(f"fwrl train: dropped {dropped} row(s) of {path} written after the checkpoint at {steps:,} agent "
                "steps (the steps after it are acted again)")
        dropped = episodes.drop_rows_after(steps)
        if dropped:
            say(f"fwrl train: dropped {dropped} row(s) of {episodes_path} logged after the checkpoint at {steps:,} "
                "agent steps")
        at_step = csv.rows_at(steps)
        csv.forget_read()
        episodes.forget_read()
        return SessionMetrics(csv, episodes, steps, at_step)


def _checkpoint_run_text(payload: dict[str, Any]) -> str:
    run = payload.get("run") or {}
    config = payload.get("config") or {}
    return (f"run {run.get('id')} of {run.get('dir', 'an unknown folder')}, {config.get('env')} / {config.get('core')}, "
            f"at {int(payload.get('agent_steps', 0)):,} agent steps")


class MetricsCSV:
    """A run's metrics.csv or episodes.csv (``fwrl.utils.metrics_file``): rows appended whole, in the order they are
    written; new columns rewrite the file with the wider header. Opening it reads it once and repairs a
    damaged tail (a row cut short by a kill, rows glued together): ``repaired`` says how many rows were
    dropped. The rows read are kept for the trims a resume makes (:meth:`keep_first`,
    :meth:`drop_rows_after`, :meth:`rows_at`) until the first write or :meth:`forget_read`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] = []
        self.rows = 0  # whole rows in the file: a checkpoint records it, a resume keeps that many
        self.repaired = 0
        self.damage = ""  # where the dropped rows were, in words
        self._read: list[dict[str, str]] | None = []  # the file's rows, as read at opening (None: forgotten)
        if self.path.exists():
            table = read_metrics_file(self.path)
            self.columns, self.rows, self._read = table.columns, len(table.rows), table.rows
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
        self._rewrite(self._rows()[:rows])
        return before - self.rows

    def drop_rows_after(self, agent_steps: int) -> int:
        """Drop the rows of more than ``agent_steps`` (a checkpoint of an fwrl version that did not
        record its row count); returns how many were dropped."""
        rows = self._rows()
        kept = [row for row in rows if _steps(row) <= agent_steps]
        if len(kept) < len(rows):
            self._rewrite(kept)
        return len(rows) - len(kept)

    def rows_at(self, agent_steps: int) -> list[dict[str, str]]:
        """The rows of exactly ``agent_steps`` (a resumed run's checkpoint step)."""
        return [row for row in self._rows() if _steps(row, default=math.nan) == agent_steps]

    def forget_read(self) -> None:
        """Let go of the rows read at opening (a session's writes do not need them)."""
        self._read = None

    def write(self, row: dict[str, Any]) -> None:
        self.write_rows([row])

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` with one write (a new column first rewrites the file with the wider header)."""
        if not rows:
            return
        new_cols = [k for row in rows for k in row if k not in self.columns]
        if new_cols:
            old_rows = self._rows()
            self.columns += list(dict.fromkeys(new_cols))
            self._rewrite(old_rows)
        append_whole(self.path, format_rows(self.columns, rows))
        self.rows += len(rows)
        self._read = None

    def _rows(self) -> list[dict[str, str]]:
        """The file's rows: those read at opening (or kept by the last trim), else read now."""
        if self._read is None:
            self._read = read_metrics_file(self.path).rows if self.path.exists() else []
        return self._read

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        data = format_rows(self.columns, rows, header=True)
        atomic_write(self.path, lambda f: f.write(data))
        self.rows = len(rows)
        self._read = list(rows)


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


def _steps(row: dict[str, str], default: float = 0.0) -> float:
    """A row's agent steps; ``default`` where it has none that reads as a number."""
    try:
        return float(row.get("agent_steps") or default)
    except ValueError:
        return default
