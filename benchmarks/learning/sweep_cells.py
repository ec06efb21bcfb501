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

import csv
import json
import shutil
import sys
from pathlib import Path


def finished_cells(sweep: Path) -> list[str]:
    """The cells whose status file says done, in name order."""
    cells = []
    for status in sorted((sweep / "status").glob("*.json")):
        data = json.loads(status.read_text())
        if data.get("state") == "done":
            cells.append(data["cell"])
    return cells


def cell_row(metrics: Path) -> tuple[float, float, int, float]:
    """(MMER, last mean return, agent steps, wall seconds) of one run's metrics.csv."""
    with metrics.open() as f:
        rows = list(csv.DictReader(f))
    returns = [float(r["mean_return"]) for r in rows if r.get("mean_return") not in (None, "", "nan")]
    if not returns:
        raise SystemExit(f"{metrics} has no mean_return: the run logged no episode.")
    return max(returns), returns[-1], int(float(rows[-1]["agent_steps"])), float(rows[-1]["time"])


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
