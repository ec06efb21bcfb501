"""The ``fwrl`` command's entry point (console script and ``python -m fwrl``).

A Ctrl-C while the command line is still being imported (the first half second or so) ends like one
later: ``fwrl: interrupted`` and exit status 130, not a traceback from inside an import.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


def interrupted() -> int:
    """Say a Ctrl-C that was caught (a KeyboardInterrupt) and return the exit status 130.

    CPython (3.11 at least) marks a KeyboardInterrupt raised inside ``exec`` of a string (dataclasses
    and typing build methods that way while modules import) as unhandled even once caught, and then ends
    the interpreter by SIGINT (status -2) instead of the 130 returned. A successful ``exec`` of a string
    clears that mark.
    """
    exec("pass")
    print("fwrl: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def main() -> int:
    try:
        from fwrl.launch.cli import main as cli_main
    except KeyboardInterrupt:
        return interrupted()
    return cli_main()
