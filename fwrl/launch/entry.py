"""The ``fwrl`` command's entry point (console script and ``python -m fwrl``).

A Ctrl-C while the command line is still being imported (the first half second or so) ends like one
later: ``fwrl: interrupted`` and exit status 130, not a traceback from inside an import.
"""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from fwrl.launch.cli import main as cli_main
    except KeyboardInterrupt:
        print("fwrl: interrupted", file=sys.stderr)
        return 130
    return cli_main()
