"""Files written atomically, and a writability check made before long work starts.

Every file fwrl writes goes through :func:`atomic_write` (a temporary file in
the same folder, then ``os.replace``), so a crash never leaves a half-written
file behind.
"""

from __future__ import annotations

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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not exc.filename and exc.errno:  # a write or fsync that failed (a full
            raise OSError(exc.errno, exc.strerror, str(path)) from None    # disk) names no file: name it
        raise


def temporary_files(folder: Path) -> list[Path]:
    """The temporary files :func:`atomic_write` left in ``folder`` (``.<name>.<pid>.<random>.tmp``; before
    the writer's pid was in the name, ``.<name>.<random>.tmp``): a process killed during a write (SIGKILL,
    power loss) cannot remove its own."""
    return sorted(p for p in Path(folder).glob(".*.tmp") if p.is_file())


def writer_alive(path: Path) -> bool:
    """Whether the process that writes temporary file ``path`` (its pid in the name) runs here: a live
    writer's file is its write in progress (``fwrl evaluate`` writing into a run folder while the run
    resumes), not a dead one's leftover. Another process's only: this process has no write in progress
    where it cleans."""
    parts = path.name[:-len(".tmp")].split(".")
    if len(parts) < 3 or not parts[-2].isdigit():
        return False
    pid = int(parts[-2])
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True


def remove_temporary_files(folder: Path) -> list[Path]:
    """Remove what :func:`temporary_files` finds but the files of writers still running here
    (:func:`writer_alive`); returns the removed paths."""
    removed = []
    for path in temporary_files(folder):
        if writer_alive(path):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


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
    """Write ``text`` to ``path`` atomically."""
    atomic_write(path, lambda f: f.write(text), mode="w")


def check_writable(path: Path, what: str, hint: str = "") -> None:
    """Raise FwrlError unless the file ``path`` could be written (its folders created if missing).

    Probes with a temporary file in the nearest existing folder, so nothing
    stays behind; ``what`` names the file in the message ("evaluation JSON"),
    ``hint`` says what to do instead ("Pass --out PATH.").
    """
    path = Path(path)
    problem = "it is a folder" if path.is_dir() else _folder_problem(path.parent)
    if problem:
        raise FwrlError(f"{what} {path} is not writable ({problem})." + (f" {hint}" if hint else ""))


def check_writable_folder(folder: Path, what: str, hint: str = "") -> None:
    """Raise FwrlError unless files can be written into ``folder`` (created if missing)."""
    problem = _folder_problem(Path(folder))
    if problem:
        raise FwrlError(f"{what} {folder} is not writable ({problem})." + (f" {hint}" if hint else ""))


def _folder_problem(folder: Path) -> str | None:
    """Why no file can be written into ``folder`` (or the nearest existing one above it); None if it can."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".fwrl-write-test.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None
