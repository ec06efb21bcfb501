"""User-facing errors.

Anything a researcher can get wrong (an unknown env, core or option, a missing
optional dependency, a bad run directory, a foreign checkpoint) raises
:class:`FwrlError` with a one-paragraph message. The CLI prints the message and
exits with status 2 instead of showing a traceback.
"""

from __future__ import annotations

from typing import Iterable


class FwrlError(Exception):
    """An error caused by the user's input, shown without a traceback."""


def unknown_choice(kind: str, value: object, choices: Iterable[object], where: str = "") -> FwrlError:
    """Error for a value that is not one of ``choices``; the message lists them. ``where`` follows
    the value: ``unknown core 'rdnn' in sweep cell rdnn__seed-1; valid choices: ...``."""
    valid = ", ".join(sorted(str(c) for c in choices))
    return FwrlError(f"unknown {kind} {value!r}{f' {where}' if where else ''}; valid choices: {valid}.")


def install_command(extra: str) -> str:
    """How to install an extra, in the README's form (in the fwrl folder): ``pip install -e '.[atari]'``."""
    return f"pip install -e '.[{extra}]'"


def missing_dependency(module: str, extra: str, purpose: str) -> FwrlError:
    """Error for an optional dependency that is not installed: what needs it, and the extra to install."""
    return FwrlError(
        f"the Python module '{module}', needed for {purpose}, is not installed. "
        f"Install it with: {install_command(extra)} (in the fwrl folder)"
    )


def run_main(main, argv=None) -> int:
    """Run a script's ``main(argv)``; a FwrlError prints one paragraph and gives status 2."""
    import sys

    try:
        return main(sys.argv[1:] if argv is None else argv)
    except FwrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
