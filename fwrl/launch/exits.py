"""The command's exit statuses beyond 0 (done) and 2 (a usage or settings error), and how a caught
Ctrl-C is said."""

from __future__ import annotations

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
