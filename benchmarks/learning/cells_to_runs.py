"""Run folders rebuilt from committed cells, so that ``fwrl report`` can score a grid whose sweep folder
is gone (a sweep runs for days across machines; what is committed of it is each finished cell's
metrics.csv, ``sweep_cells.py``). Each cell's config is the grid's own, expanded as ``fwrl sweep`` expands it:

    python benchmarks/learning/cells_to_runs.py OUT CELLS_DIR [CELLS_DIR ...] -- SWEEP FLAGS
    python benchmarks/learning/cells_to_runs.py /tmp/popgym-runs \\
        benchmarks/results/learning/popgym-cpu/seed-1 benchmarks/results/learning/popgym-cpu/seed-2 \\
        -- --preset popgym --grid benchmarks/learning/popgym-cpu.yaml
    fwrl report /tmp/popgym-runs --out OUT_REPORT

writes ``OUT/CELL/config.yaml`` and ``OUT/CELL/metrics.csv`` for every ``CELL.metrics.csv`` in the
CELLS_DIRs; a file that names no cell of the grid is refused with the grid's cell names.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from fwrl.errors import FwrlError
from fwrl.launch.sweep.arguments import add_sweep_arguments, grid_from_args
from fwrl.launch.sweep.grid import expand
from fwrl.launch.sweep.options import SweepConfig
from fwrl.settings.config import config_yaml
from fwrl.launch.flags import given_settings

SUFFIX = ".metrics.csv"


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    ours, sweep_flags = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    if len(ours) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, cell_dirs = Path(ours[0]), [Path(p) for p in ours[1:]]
    parser = argparse.ArgumentParser(prog="fwrl sweep")
    add_sweep_arguments(parser)
    args = parser.parse_args(["unused-sweep-folder", *sweep_flags])
    try:
        grid = grid_from_args(args, SweepConfig.parse(given_settings(args, SweepConfig)))
        if grid is None:
            raise FwrlError("no grid: pass --grid FILE or settings flags after --, as to fwrl sweep.")
        cells = {cell.name: cell for cell in expand(grid)}
        files = sorted(f for d in cell_dirs for f in d.glob(f"*{SUFFIX}"))
        unknown = [f.name for f in files if f.name.removesuffix(SUFFIX) not in cells]
        if unknown:
            raise FwrlError(f"{unknown[0]} names no cell of the grid; its cells: {', '.join(sorted(cells))}.")
    except FwrlError as exc:
        print(f"cells_to_runs: {exc}", file=sys.stderr)
        return 2
    for file in files:
        name = file.name.removesuffix(SUFFIX)
        run = out / name
        run.mkdir(parents=True, exist_ok=True)
        (run / "config.yaml").write_text(config_yaml(cells[name].config))
        shutil.copy(file, run / "metrics.csv")
    print(f"cells_to_runs: {len(files)} run folders in {out} (of the grid's {len(cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
