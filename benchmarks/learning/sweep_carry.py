"""Carry a sweep that runs for days to another machine: what it needs to go on, small enough to commit.

A long grid (``popgym-protocol.yaml``: 15 cells of 30-70 minutes) outlives the machine it started on;
the files a session leaves behind are gone when the next one starts elsewhere. ``save`` copies what
``fwrl sweep`` needs to skip the finished cells and resume the others, and ``restore`` puts it back:

    python benchmarks/learning/sweep_carry.py save SWEEP DEST      # before the machine goes
    python benchmarks/learning/sweep_carry.py restore DEST SWEEP   # on the next machine, then fwrl sweep SWEEP

``save`` copies ``sweep.yaml``, ``configs/``, every cell's ``status/CELL.json`` and, per run folder
(under ``run-folders/``: git ignores ``runs/``), ``config.yaml``, ``run.json``, ``metrics.csv`` and its evaluations; the checkpoint only of cells not
done (a done cell needs none to be skipped, and its figures are in the files above). Left behind: the
logs, TensorBoard events and ``episodes.csv`` (a 15 M-step POPGym run writes ~100 MB of it; a resumed
run starts a new one from its checkpoint). A cell that runs while it is saved is saved as interrupted,
from its last checkpoint (written atomically by the run). ``restore`` refuses a SWEEP that exists.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from fwrl.launch.sweep.status import read_status

RUN_FILES = ("config.yaml", "run.json", "metrics.csv", "config-edits.log")
RUN_PATTERNS = ("evaluation*.json", "evaluation*.md")
CHECKPOINT = "checkpoint.pt"
RUNS = "run-folders"  # the sweep's runs/ under another name: git ignores runs/ (.gitignore)


def _statuses(sweep: Path) -> dict[str, dict]:
    """Each cell's status as its file says it (a runner's lock does not travel); unreadable ones left out."""
    statuses = {path.stem: read_status(sweep, path.stem) for path in sorted((sweep / "status").glob("*.json"))}
    return {cell: status for cell, status in statuses.items() if status is not None}


def save(sweep: Path, dest: Path) -> list[str]:
    """Copy ``sweep``'s state to ``dest`` (replacing what an earlier save put there); the lines to print."""
    if not (sweep / "sweep.yaml").is_file():
        raise SystemExit(f"{sweep} is not a sweep folder (no sweep.yaml inside).")
    statuses = _statuses(sweep)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "status").mkdir(parents=True)
    shutil.copyfile(sweep / "sweep.yaml", tmp / "sweep.yaml")
    if (sweep / "configs").is_dir():
        shutil.copytree(sweep / "configs", tmp / "configs")
    lines = []
    for cell, status in statuses.items():
        state = status["state"]
        if state == "running":  # its runner stays behind: resumed from its last checkpoint
            status.update(state="interrupted", message="carried to another machine while it ran")
        (tmp / "status" / f"{cell}.json").write_text(json.dumps(status, indent=2) + "\n")
        run = sweep / "runs" / cell
        if not run.is_dir():
            continue
        out = tmp / RUNS / cell
        out.mkdir(parents=True)
        names = [n for n in RUN_FILES if (run / n).is_file()]
        names += sorted(p.name for pattern in RUN_PATTERNS for p in run.glob(pattern))
        if state != "done" and (run / CHECKPOINT).is_file():
            names.append(CHECKPOINT)
        for name in names:
            shutil.copyfile(run / name, out / name)
        size = sum((out / n).stat().st_size for n in names)
        lines.append(f"  {cell}: {status['state']}, {status.get('agent_steps') or 0:,} agent steps, "
                     f"{len(names)} files, {size / 1e6:.1f} MB")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return [f"saved {sweep} -> {dest}: {len(statuses)} cells with a status"] + lines


def restore(source: Path, sweep: Path) -> list[str]:
    """Put a saved state back as the sweep folder ``sweep``; the lines to print."""
    if not (source / "sweep.yaml").is_file():
        raise SystemExit(f"{source} holds no saved sweep (no sweep.yaml inside); save one with: save SWEEP DEST")
    if sweep.exists():
        raise SystemExit(f"{sweep} exists; restore into a new folder (or remove it first).")
    tmp = sweep.with_name(sweep.name + ".partial")  # renamed when whole: a stopped restore leaves no sweep
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    if (tmp / RUNS).is_dir():
        (tmp / RUNS).rename(tmp / "runs")
    for run_json in (tmp / "runs").glob("*/run.json"):  # the run's folder, as the run will record it
        data = json.loads(run_json.read_text())
        data["folder"] = str((sweep / "runs" / run_json.parent.name).resolve())
        run_json.write_text(json.dumps(data) + "\n")
    tmp.rename(sweep)
    return [f"restored {source} -> {sweep}: run `fwrl sweep {sweep}` to go on"]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("save", "restore"):
        print("usage: sweep_carry.py save SWEEP DEST | restore DEST SWEEP", file=sys.stderr)
        return 2
    verb, a, b = argv[0], Path(argv[1]), Path(argv[2])
    print("\n".join(save(a, b) if verb == "save" else restore(a, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
