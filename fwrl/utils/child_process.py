"""What a spawned child process of fwrl does first: die with its parent, and leave Ctrl-C to it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux only)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def become_child_of(parent_pid: int) -> None:
    """Start of a child's work: die with the parent ``parent_pid`` (at once where it has died already,
    before the kernel's request took effect), and ignore SIGINT, which a terminal sends to the whole
    process group: the parent handles Ctrl-C and stops its children itself."""
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
