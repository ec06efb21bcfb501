"""The finished cells of a sweep still running, small enough to commit: each cell's metrics.csv and a
table (task, core, seed) of its MMER (POPGym's metric: the best running mean return of 100 episodes over training), its
last mean return, agent steps and wall time.

    python benchmarks/learning/sweep_cells.py SWEEP OUT

copies ``SWEEP/runs/CELL/metrics.csv`` of every cell whose ``status/CELL.json`` says done to
``OUT/CELL.metrics.csv`` and prints the markdown table (one row per cell, by task then label).
``fwrl report SWEEP --finished-only`` makes the statistics (CIs, IQM) from the same runs; this adds
the wall time of each run, which the report does not keep.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

from fwrl.evaluation.scores import mmer
from fwrl.launch.plot import read_metrics


def finished_cells(sweep: Path) -> list[str]:
    """The cells whose status file says done, in name order."""
    cells = []
    for status in sorted((sweep / "status").glob("*.json")):
        data = json.loads(status.read_text())
        if data.get("state") == "done":
            cells.append(data["cell"])
    return cells


def _number(raw: str | None) -> float:
    return float(raw) if raw not in (None, "") else math.nan


def cell_row(metrics: Path) -> tuple[float, float, int, float]:
    """(MMER, last mean return, agent steps, wall seconds) of one run's metrics.csv; MMER as
    ``fwrl report`` scores it (:func:`fwrl.evaluation.scores.mmer`: rows before 100 episodes ended
    do not count)."""
    rows = read_metrics(metrics)
    means = [_number(r.get("mean_return")) for r in rows]
    best = mmer(means, [_number(r.get("episodes")) for r in rows])
    if best is None:
        raise SystemExit(f"{metrics} has no mean_return: the run logged no episode.")
    last = [m for m in means if math.isfinite(m)][-1]
    return best.value, last, int(float(rows[-1]["agent_steps"])), float(rows[-1]["time"])


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    sweep, out = Path(argv[0]), Path(argv[1])
    if not (sweep / "status").is_dir():
        print(f"{sweep} is not a sweep folder (no status/ inside).", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    table = []
    for cell in finished_cells(sweep):
        metrics = sweep / "runs" / cell / "metrics.csv"
        shutil.copyfile(metrics, out / f"{cell}.metrics.csv")
        labels = cell.split("__")  # seed, env, core: the grid's axes in order
        task = labels[1].split("-", 1)[-1] if len(labels) > 1 else cell
        table.append((task, "__".join(labels[2:]) or cell, labels[0], *cell_row(metrics)))
    print("| task | core | seed | MMER | final mean return | agent steps | wall s |")
    print("|---|---|---|---|---|---|---|")
    for task, core, seed, best, last, steps, wall in sorted(table):
        print(f"| {task} | {core} | {seed.removeprefix('seed-')} | {best:.3f} | {last:.3f} | {steps:,} | {wall:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
