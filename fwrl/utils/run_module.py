"""``python fwrl/utils/run_module.py MODULE ARGS...``: ``python -m MODULE ARGS...`` with this fwrl.

fwrl's own child processes (a sweep's cell runners and the commands they run, the learner ranks of
``fwrl train --learners N``) run their module through this script rather than ``python -m``, which
puts the current folder first on ``sys.path``: started from the folder that holds a clone of fwrl
(``./fwrl``, the README's editable install), ``python -m fwrl.launch.cli`` imports that folder as a
namespace package ``fwrl`` ahead of the installed one (an editable install's finder comes after the
path's) and fails (``cannot import name '__version__' from 'fwrl' (unknown location)``). Here the
first entry of ``sys.path`` (this script's folder) becomes the folder that holds this fwrl package, or
goes where that is on the path already, so the child imports the fwrl its parent did, whatever the
current folder holds. The current folder is still searched for the user's own modules (env wrappers,
``gym:<module>:<id>`` packages), last: :func:`fwrl.envs.user_wrappers.import_module_for`.

:func:`module_command` makes the command line. The script imports nothing from fwrl before the path is
set, and runs the module as ``-m`` would (``runpy``, ``__main__``, ``sys.argv[0]`` its file).
"""

from __future__ import annotations

import os
import sys


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` in a child process with this fwrl."""
    return [sys.executable, os.path.abspath(__file__), module, *args]


def _main() -> None:
    import runpy

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the folder of fwrl/
    if root in sys.path[1:]:
        del sys.path[0]
    else:
        sys.path[0] = root
    if len(sys.argv) < 2:
        sys.exit(f"usage: {sys.executable} {sys.argv[0]} MODULE [ARGS...]")
    module = sys.argv.pop(1)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
