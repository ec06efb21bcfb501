"""One process at a time: an exclusive ``flock`` on a lock file, with who holds it written in it.

The kernel drops an ``flock`` when its holder exits in any way (a crash, ``kill -9``, a lost node
on a local file system), so a dead holder never leaves a stale lock: the file stays, the lock does
not. The file records the holder (pid, host, since when) for the message another process gets. On a
file system without locks (some network mounts: ``ENOLCK``) the lock is not taken and work goes on,
as before locks existed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path


class FileLock:
    """An exclusive, non-blocking ``flock`` on ``path`` for as long as it is held (or the process lives)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock: None where taken (or the file system has no locks), else who holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                os.close(fd)
                return holder or "another process"
            # ENOLCK and friends: a file system without locks; go on without one
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                  .encode(), 0)
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
