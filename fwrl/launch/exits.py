"""The command's exit statuses beyond 0 (done) and 2 (a usage or settings error), how a caught
Ctrl-C is said, and how a process whose Ray cluster's head was lost ends."""

from __future__ import annotations

import os
import sys

EXIT_OS_ERROR = 74  # sysexits.h EX_IOERR: the disk or the file system said no
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def interrupted() -> int:
    """Say a Ctrl-C that was caught (a KeyboardInterrupt) and return the exit status 130.

    CPython (3.11 at least) marks a KeyboardInterrupt raised inside ``exec`` of a string (dataclasses
    and typing build methods that way while modules import) as unhandled even once caught, and then ends
    ``python -m`` by SIGINT (status -2) instead of the 130 returned. A successful ``exec`` of a string
    clears that mark.
    """
    exec("pass")
    print("fwrl: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def end_process(code: int) -> int:
    """``code``, for the entry point to exit with; where a Ray pool of this process lost its cluster's
    head, the process ends here instead (output flushed, ``os._exit(code)``): Ray's exit handler
    would wait on the lost head (:func:`fwrl.envs.ray_workers.head_lost_in_this_process`). Everything
    fwrl holds (the final checkpoint, files, child processes) was closed before the command returned."""
    ray_workers = sys.modules.get("fwrl.envs.ray_workers")  # imported only where a Ray pool ran
    if ray_workers is not None and ray_workers.head_lost_in_this_process():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
