"""The learning curves of runs, small enough to commit: a subset of each run's metrics.csv.

Writes ``OUT/<label>/metrics.csv`` with the columns below and
``entropy_per_step``: the policy entropy in nats per agent step: the run's own
``entropy`` column where it has one, else recovered from ``entropy_loss``
(``-entropy_cost * sum of entropies over T x B``) with the run's own cost, T
and B, so runs with other batch sizes compare. ``fwrl plot``
reads the folders like run folders:

    python benchmarks/learning/curves_csv.py OUT lstm=runs/pong-lstm rdn=runs/pong-rdn
    fwrl plot OUT/lstm OUT/rdn --metric entropy_per_step --out OUT/entropy.png
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import yaml

COLUMNS = ("time", "agent_steps", "updates", "steps_per_second", "episodes", "mean_return", "total_loss",
           "pg_loss", "baseline_loss", "entropy_loss", "grad_norm", "learning_rate")


def write_curves(run: Path, out: Path) -> int:
    """Write ``out/metrics.csv`` from ``run``; returns the number of rows."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    steps_per_update = config["batch_size"] * config["unroll_length"]
    cost = config["entropy_cost"]
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "metrics.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow((*COLUMNS, "entropy_per_step"))
        for row in rows:
            loss = row.get("entropy_loss", "")
            if row.get("entropy") not in (None, "", "nan"):  # runs since 2026-11-26 log it themselves
                entropy = f"{float(row['entropy']):.5g}"
            elif loss not in ("", "nan") and cost:
                entropy = f"{-float(loss) / (cost * steps_per_update):.5g}"
            else:
                entropy = ""
            writer.writerow((*(row.get(c, "") for c in COLUMNS), entropy))
    return len(rows)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print("usage: curves_csv.py OUT LABEL=RUN_FOLDER [LABEL=RUN_FOLDER ...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    for pair in argv[1:]:
        label, run = pair.split("=", 1)
        if not (Path(run) / "metrics.csv").is_file():
            print(f"error: {run} holds no metrics.csv", file=sys.stderr)
            return 2
        print(f"{label}: {write_curves(Path(run), out / label)} rows from {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
