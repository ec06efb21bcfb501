"""The ``fwrl`` command's entry point (console script and ``python -m fwrl``).

A Ctrl-C while the command line is still being imported (the first half second or so) ends like one
later: ``fwrl: interrupted`` and exit status 130, not a traceback from inside an import.

:data:`STARTED` is when this module was imported, the first thing the ``fwrl`` script does: a run's
time limit and elapsed time count from there, not from the process's start (a process may be a shell
that ran other commands first and then ``exec``'d fwrl: ``bash -c "sleep 30 && fwrl train ..."``).
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # when fwrl began its work: --max-seconds and the elapsed time count from here

from fwrl.launch.exits import end_process, interrupted  # noqa: E402


def main() -> int:
    try:
        from fwrl.launch.cli import main as cli_main
    except KeyboardInterrupt:
        return interrupted()
    return end_process(cli_main(started=STARTED))
