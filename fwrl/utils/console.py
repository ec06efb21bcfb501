"""Tables printed whole, on a terminal and in a pipe or a file alike.

rich draws to a terminal at its width, and anywhere else at 80 columns: a table piped into a file or
a log (``fwrl info > cores.txt``, CI logs, ``| less``) had its headers cut to ``step…`` and its rows
wrapped. :func:`show_table` prints at the table's natural width where the output is not a terminal.
"""

from __future__ import annotations

from rich.console import Console, RenderableType

NATURAL_LIMIT = 100_000  # columns a table may ask for when it is measured off a terminal


def show_table(renderable: RenderableType, console: Console | None = None, *, stderr: bool = False) -> None:
    """Print ``renderable`` (a rich Table) with ``console`` (default: a new one on stdout, or stderr):
    at the terminal's width on a terminal, every row on one line at the table's natural width (80
    columns at least) anywhere else."""
    console = console or Console(stderr=stderr)
    if not console.is_terminal:
        natural = console.measure(renderable, options=console.options.update_width(NATURAL_LIMIT)).maximum
        console = Console(width=max(80, natural), stderr=console.stderr, file=console.file,
                          color_system=None, highlight=False)
    console.print(renderable)
