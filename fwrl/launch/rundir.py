"""Run directories: ``runs/<name>/`` with config, checkpoints and metrics.

Every file is written atomically (a temporary file in the same folder, then
``os.replace``), so a crash never leaves a half-written file behind.
"""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from fwrl.errors import FwrlError


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write ``path`` through ``write(file)`` into a temporary file (fsync), then replace and fsync the
    folder, so a crash leaves either the old file or the new one. The file gets the permissions a
    new file would (0644 under the usual umask 022), not the temporary file's 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _read_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; done once, at import
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the OS lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text), mode="w")


def prepare_run_dir(path: Path, resume: bool) -> Path:
    """Create (or, on resume, check) the run folder and that it is writable."""
    path = Path(path)
    if resume:
        if not (path / "config.yaml").exists():
            raise FwrlError(f"cannot resume: {path} holds no run (no config.yaml). Check --name / --runs-dir.")
    elif (path / "checkpoint.pt").exists():
        raise FwrlError(
            f"run folder {path} already holds a run. Pass --resume to continue it, or choose another --name."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise FwrlError(f"run folder {path} is not writable ({exc.strerror}). Choose another --runs-dir.") from None
    return path


class MetricsCSV:
    """Appends rows to metrics.csv; new columns start a rewrite with the wider header."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] = []
        if self.path.exists():
            with self.path.open() as f:
                header = next(csv.reader(f), [])
            self.columns = header

    def write(self, row: dict[str, Any]) -> None:
        new_cols = [k for k in row if k not in self.columns]
        if new_cols:
            old_rows = []
            if self.path.exists():
                with self.path.open() as f:
                    old_rows = list(csv.DictReader(f))
            self.columns += new_cols

            def rewrite(f):
                w = csv.DictWriter(f, self.columns)
                w.writeheader()
                w.writerows(old_rows)

            atomic_write(self.path, rewrite, mode="w")
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)
