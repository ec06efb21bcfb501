"""The slurm executor: one SLURM job array (``sbatch --array``) of the sweep's unfinished cells.

The array script (kept in ``SWEEP/slurm/``) lists every cell of the sweep; the
array's indices pick the unfinished ones, so task ``i`` runs cell ``i`` of
``sweep.yaml``. Each task ``exec``s the cell runner, so SLURM's SIGTERM (at a
time limit, ``--signal=B:TERM@300``, or ``scancel``) reaches it and the cell
writes a checkpoint; the next ``fwrl sweep`` resubmits what is unfinished.
Cells whose job is still queued or running (``squeue``) are not submitted again.

The sweep folder and the Python environment must be on storage every node
sees at the same path (the script names this Python and the sweep folder by
absolute path).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from fwrl.errors import FwrlError
from fwrl.launch.sweep.cell import cell_command
from fwrl.launch.sweep.plan import Sweep
from fwrl.launch.sweep.status import now_iso, read_status, write_status
from fwrl.utils.files import atomic_write_text

SIGNAL_SECONDS = 300  # SIGTERM this long before the time limit, so the cell checkpoints


def array_ranges(indices: Iterable[int]) -> str:
    """``[0, 2, 3, 4, 7]`` -> ``0,2-4,7``."""
    out: list[str] = []
    values = sorted(set(indices))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def array_script(sweep: Sweep, cells: Sequence[str], evaluate: bool, eval_episodes: int | None, cpus: float,
                 gpus: float, parallel: int, sbatch_options: Mapping[str, str]) -> str:
    """The job array script that runs ``cells`` of ``sweep`` (one task each)."""
    path = sweep.path.resolve()
    names = [c.name for c in sweep.cells]
    indices = [names.index(c) for c in cells]
    need_cpus = cpus or max(sweep.cell(c).config.num_workers + 1 for c in cells)
    lines = [
        "#!/bin/bash",
        f"# fwrl sweep {path}: one array task per unfinished cell; task i runs cell i of sweep.yaml.",
        f"# Written {now_iso()} by fwrl sweep --executor slurm; submit with sbatch.",
        f"#SBATCH --job-name=fwrl-sweep-{path.name}",
        f"#SBATCH --array={array_ranges(indices)}{f'%{parallel}' if parallel else ''}",
        f"#SBATCH --output={path}/logs/slurm-%A_%a.out",
        f"#SBATCH --cpus-per-task={int(need_cpus) if float(need_cpus).is_integer() else need_cpus}",
        f"#SBATCH --signal=B:TERM@{SIGNAL_SECONDS}",
    ]
    if gpus:
        lines.append(f"#SBATCH --gres=gpu:{int(gpus)}")
    lines += [f"#SBATCH --{key}" + (f"={value}" if value else "") for key, value in sbatch_options.items()]
    cmd = cell_command(path, "CELL", evaluate, eval_episodes, eval_workers=max(1, int(need_cpus)))
    at = cmd.index("CELL")
    run = " ".join([*(shlex.quote(p) for p in cmd[:at]), '"$CELL"', *(shlex.quote(p) for p in cmd[at + 1:])])
    lines += [
        "set -euo pipefail",
        "CELLS=(",
        *[f"  {shlex.quote(name)}" for name in names],
        ")",
        'CELL="${CELLS[$SLURM_ARRAY_TASK_ID]}"',
        f"cd {shlex.quote(str(Path.cwd()))}",
        f"exec {run}",
    ]
    return "\n".join(lines) + "\n"


def alive_cells(sweep: Sweep) -> set[str]:
    """Cells whose SLURM task is still queued or running (by ``squeue``; empty where it is missing)."""
    jobs: dict[str, list[str]] = {}
    for cell in sweep.cells:
        status = read_status(sweep.path, cell.name)
        if status and status["state"] in ("queued", "running") and status.get("job_id"):
            jobs.setdefault(str(status["job_id"]), []).append(cell.name)
    if not jobs or shutil.which("squeue") is None:
        return set()
    names = [c.name for c in sweep.cells]
    alive: set[str] = set()
    for job, cells in jobs.items():
        out = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%K"], capture_output=True, text=True)
        if out.returncode != 0:
            continue
        tasks = {int(t) for t in out.stdout.split() if t.isdigit()}
        alive |= {c for c in cells if names.index(c) in tasks}
    return alive


def check_sbatch() -> None:
    """A FwrlError where ``sbatch`` is not on PATH (checked before the sweep folder is written)."""
    if shutil.which("sbatch") is None:
        raise FwrlError("the slurm executor needs sbatch, which is not on PATH here; run fwrl sweep on a SLURM "
                        "login node, or pass --dry-run to print the array script.")


def submit(sweep: Sweep, script: str) -> str:
    """Write the script to ``SWEEP/slurm/`` and submit it; returns the job id. Cells become ``queued``."""
    check_sbatch()
    folder = sweep.path / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"array-{datetime.now().strftime('%Y%m%d-%H%M%S')}.sh"
    atomic_write_text(path, script)
    out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines()
        raise FwrlError(f"sbatch {path} failed (exit status {out.returncode}): {said[-1] if said else 'no output'}")
    job = out.stdout.strip().split(";")[0]
    if not job:
        raise FwrlError(f"sbatch {path} printed no job id.")
    jobs_file = folder / "jobs.json"
    try:
        jobs = json.loads(jobs_file.read_text())
    except (OSError, ValueError):
        jobs = []
    cells = _script_cells(script, sweep)
    jobs.append({"job_id": job, "script": str(path), "submitted": now_iso(), "cells": cells})
    atomic_write_text(jobs_file, json.dumps(jobs, indent=2) + "\n")
    for cell in cells:
        write_status(sweep.path, cell, state="queued", job_id=job, message=f"SLURM job {job}")
    return job


def _script_cells(script: str, sweep: Sweep) -> list[str]:
    """The cells an array script runs (from its ``--array`` line)."""
    spec = next(line for line in script.splitlines() if line.startswith("#SBATCH --array="))
    spec = spec.split("=", 1)[1].split("%")[0]
    indices: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        indices += list(range(int(low), int(high or low) + 1))
    return [sweep.cells[i].name for i in indices]
