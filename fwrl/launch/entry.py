"""The ``fwrl`` command's entry point (console script and ``python -m fwrl``).

A Ctrl-C while the command line is still being imported (the first half second or so) ends like one
later: ``fwrl: interrupted`` and exit status 130, not a traceback from inside an import.
"""

from __future__ import annotations

from fwrl.launch.exits import interrupted


def main() -> int:
    try:
        from fwrl.launch.cli import main as cli_main
    except KeyboardInterrupt:
        return interrupted()
    return cli_main()
