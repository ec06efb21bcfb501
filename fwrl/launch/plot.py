"""``fwrl plot``: learning curves of one or more runs to a PNG (matplotlib, Agg backend).

Each run's ``metrics.csv`` gives the curve of a metric (default
``mean_return``) against ``agent_steps``; several runs are overlaid, one line
each, labelled with the run folder's name. ``--by task`` draws one panel per
task of multi-task runs, from the columns ``<prefix>/<task>`` (``return/<task>``
for ``mean_return``; e.g. ``eval/test/return/<task>`` for
``--metric eval/test/return``). ``--smooth K`` averages each point with the
K - 1 before it. Rows where the metric is empty (e.g. evaluation rows for a
training metric) are skipped. ``--random FILE`` (with ``--by task``) draws each
task's random-policy return (``benchmarks/random_policy.py``'s JSON) as a dashed line.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Sequence

from fwrl.errors import FwrlError, unknown_choice
from fwrl.utils.files import atomic_write
from fwrl.utils.metrics_file import METRICS_FILE, read_metrics_file

BY = ("run", "task")
TASK_PREFIX = {"mean_return": "return"}  # metric -> prefix of its per-task columns


def read_metrics(run_dir: Path, say_damage: bool = True) -> list[dict[str, str]]:
    """The whole rows of a run's metrics.csv (a damaged header is an error; rows cut short or glued
    together are left out and, with ``say_damage``, said on stderr)."""
    path = Path(run_dir) / METRICS_FILE if Path(run_dir).is_dir() else Path(run_dir)
    if not path.is_file():
        raise FwrlError(f"{run_dir} holds no metrics.csv; pass run folders written by fwrl train.")
    table = read_metrics_file(path)
    if table.damaged_rows and say_damage:
        print(f"fwrl: left out {table.damaged_rows} damaged row(s) of {path} (cut short or glued together)",
              file=sys.stderr)
    return table.rows


def series(rows: Sequence[dict[str, str]], column: str) -> tuple[list[float], list[float]]:
    """(agent_steps, value) pairs of ``column``, skipping empty and non-finite values."""
    xs, ys = [], []
    for row in rows:
        raw, step = row.get(column), row.get("agent_steps")
        if raw in (None, "") or step in (None, ""):
            continue
        try:
            x, y = float(step), float(raw)
        except ValueError:
            continue
        if math.isfinite(y):
            xs.append(x)
            ys.append(y)
    return xs, ys


def smooth(values: Sequence[float], k: int) -> list[float]:
    """Trailing moving average over (up to) ``k`` points."""
    if k <= 1:
        return list(values)
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= k:
            total -= values[i - k]
        out.append(total / min(i + 1, k))
    return out


def task_columns(rows: Sequence[dict[str, str]], metric: str) -> list[str]:
    prefix = TASK_PREFIX.get(metric, metric) + "/"
    columns = list(rows[0].keys()) if rows else []
    return [c for c in columns if c.startswith(prefix) and "/" not in c[len(prefix):]]


def random_returns(path: Path, by: str) -> dict[str, float]:
    """Each task's mean return in a random policy's JSON (``benchmarks/random_policy.py``, the shape of
    ``fwrl evaluate``'s): its train split where it has one, else its first split."""
    if by != "task":
        raise FwrlError(f"--random draws each task's random return in its panel: add --by task (got --by {by}).")
    from fwrl.evaluation.results import task_rows

    try:
        _, rows = task_rows(json.loads(Path(path).read_text()))
        return {task: float(row["mean"]) for task, row in rows.items()}
    except FileNotFoundError:
        raise FwrlError(f"--random {path}: no such file; pass the JSON benchmarks/random_policy.py wrote.") from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise FwrlError(f"--random {path}: not a random policy's JSON (benchmarks/random_policy.py writes one, "
                        "with per-task rows under 'aggregates').") from None


def plot_runs(
    run_dirs: Sequence[Path],
    metric: str = "mean_return",
    by: str = "run",
    smooth_k: int = 1,
    out: Path | None = None,
    size: tuple[int, int] = (1200, 800),
    dpi: int = 100,
    random: Path | None = None,
):
    """Draw the curves (and, with ``random``, each task's random-policy return); write ``out`` (PNG)
    if given; return the matplotlib figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if by not in BY:
        raise unknown_choice("--by", by, BY)
    if smooth_k < 1:
        raise FwrlError(f"--smooth must be at least 1, got {smooth_k}.")
    if not run_dirs:
        raise FwrlError("fwrl plot needs at least one run folder.")
    runs = [(_label(Path(d), run_dirs), read_metrics(Path(d))) for d in run_dirs]
    floors = random_returns(random, by) if random is not None else {}

    panels: dict[str, list[tuple[str, str, list]]] = {}  # panel title -> [(label, column, rows)]
    for label, rows in runs:
        if by == "task":
            for column in task_columns(rows, metric):
                panels.setdefault(column.rsplit("/", 1)[1], []).append((label, column, rows))
        else:
            panels.setdefault(metric, []).append((label, metric, rows))
    drawn = {title: [(l, c, r) for l, c, r in lines if series(r, c)[0]] for title, lines in panels.items()}
    drawn = {title: lines for title, lines in drawn.items() if lines}
    if not drawn:
        available = sorted({c for _, rows in runs for c in (rows[0].keys() if rows else ())} - {"agent_steps"})
        what = f"per-task columns '{TASK_PREFIX.get(metric, metric)}/<task>'" if by == "task" else f"metric {metric!r}"
        raise FwrlError(f"no values of {what} in these runs; columns found: {', '.join(available) or 'none'}.")

    n = len(drawn)
    cols = min(n, 3)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi, squeeze=False)
    for ax, (title, lines) in zip(axes.flat, drawn.items()):
        for label, column, rows in lines:
            xs, ys = series(rows, column)
            ax.plot(xs, smooth(ys, smooth_k), label=label)
        if title in floors:
            ax.axhline(floors[title], color="grey", linestyle="--", label="random policy")
        ax.set_title(title)
        ax.set_xlabel("agent steps")
        ax.set_ylabel(metric if by == "run" else f"{TASK_PREFIX.get(metric, metric)} ({title})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fmt = image_format(out)
        # whole or not at all: a full disk or a crash leaves no truncated image (atomic_write's temporary file)
        atomic_write(out, lambda f: fig.savefig(f, dpi=dpi, format=fmt))
    return fig


def image_format(out: Path) -> str:
    """The image format of ``out``'s suffix, one matplotlib writes; a FwrlError naming the formats else."""
    import matplotlib.pyplot as plt

    formats = sorted(plt.figure().canvas.get_supported_filetypes())
    plt.close()
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in formats:
        raise FwrlError(f"--out {str(out)!r}: {('.' + fmt) if fmt else 'no suffix'} is not an image format "
                        f"matplotlib writes; use one of {', '.join('.' + f for f in formats)} (e.g. .png).")
    return fmt


def _label(run_dir: Path, all_dirs: Sequence[Path]) -> str:
    names = [Path(d).name for d in all_dirs]
    return run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)


def default_out(run_dirs: Sequence[Path], metric: str) -> Path:
    name = metric.replace("/", "_") + ".png"
    return Path(run_dirs[0]) / name if len(run_dirs) == 1 else Path(name)
