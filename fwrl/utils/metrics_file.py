"""``metrics.csv``, a run's table of progress rows: read with its damage named, appended a whole row at a time.

The file is a header line and one line per row, appended by the run's writer while it trains. A
kill (or a full disk) can cut the last line short; the next row would then be glued onto it. A reader
drops a last line without its newline (the write it belongs to never ended) and rows whose number of
fields differs from the header's (two rows glued together, a line cut inside), and says how many; a
header that is not one fwrl writes (empty, without ``agent_steps``, a name repeated or unprintable)
is refused in one line naming the file: nothing in it can be read as a run's progress.
"""

from __future__ import annotations

import csv
import errno
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from fwrl.errors import FwrlError

METRICS_FILE = "metrics.csv"
EPISODES_FILE = "episodes.csv"  # one row per finished training episode (fwrl.runner.run_metrics)
STEP_COLUMN = "agent_steps"


@dataclass
class MetricsTable:
    """What a metrics.csv holds: its columns and its whole rows, in the order they were written."""

    columns: list[str]
    rows: list[dict[str, str]] = field(default_factory=list)
    torn_last_line: bool = False  # the last line had no newline: a write cut short, dropped
    malformed_rows: int = 0  # lines whose field count is not the header's, dropped

    @property
    def damaged_rows(self) -> int:
        return self.malformed_rows + int(self.torn_last_line)


def header_problem(columns: Sequence[str]) -> str | None:
    """Why ``columns`` is not a header fwrl writes, or None."""
    if not columns:
        return "it is empty"
    if STEP_COLUMN not in columns:
        return f"it has no {STEP_COLUMN} column"
    odd = next((c for c in columns if not c or not c.isprintable()), None)
    if odd is not None:
        return f"it has an empty or unprintable column name {odd!r}"
    if len(set(columns)) != len(columns):
        repeated = next(c for c in columns if columns.count(c) > 1)
        return f"the column {repeated!r} appears twice"
    return None


def read_metrics_file(path: Path) -> MetricsTable:
    """The whole rows of the metrics.csv at ``path`` (module docstring); a damaged header is an error."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FwrlError(f"{path} is not a metrics.csv fwrl wrote (byte {exc.start} is not UTF-8 text); move it aside "
                        "or restore it.") from None
    torn = bool(text) and not text.endswith("\n")
    if torn:
        text = text[:text.rfind("\n") + 1]
    lines = list(csv.reader(io.StringIO(text, newline="")))
    if not lines:
        if torn:  # even the header was cut short
            raise FwrlError(f"{path} is not a metrics.csv fwrl wrote: its header line was cut short. Move it aside "
                            "or restore it.")
        return MetricsTable(columns=[])
    columns, body = lines[0], lines[1:]
    problem = header_problem(columns)
    if problem:
        raise FwrlError(f"{path} is not a metrics.csv fwrl wrote: its header is damaged ({problem}). Move it "
                        "aside or restore it.")
    rows = [dict(zip(columns, line)) for line in body if len(line) == len(columns)]
    return MetricsTable(columns=columns, rows=rows, torn_last_line=torn, malformed_rows=len(body) - len(rows))


def format_rows(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], header: bool = False) -> bytes:
    """The CSV lines of ``rows`` (and the header first, if asked), as written to the file."""
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, list(columns), lineterminator="\n")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().encode("utf-8")


def append_whole(path: Path, data: bytes) -> None:
    """Append ``data`` with one write call to a file opened for appending: a row is never split by
    another writer's, and a kill leaves it whole or absent (a full disk may still cut it: the next
    read drops it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:  # named with the file, as a disk fault is said (one line with the path)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    if written != len(data):
        raise OSError(errno.ENOSPC, f"only {written} of {len(data)} bytes written", str(path))
