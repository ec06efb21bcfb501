"""The sweep folder: its manifest (``sweep.yaml``), the cells' configs, and what is left to run.

A sweep folder keeps the cells it was made with. Running the command again
with the same grid skips finished cells and resumes the others. A grid may
grow (new axis values add new cells); a grid that would drop a cell, or change
a cell's settings, is refused (use another sweep folder), except for the
settings a run may change on ``--resume`` (resources and logging:
:data:`RESOURCE_CHANGES`), which apply from the cell's next start on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from fwrl.errors import FwrlError
from fwrl.settings.config import RESUMABLE_CHANGES, TrainConfig, config_yaml, read_config
from fwrl.launch.sweep.grid import Cell, Grid
from fwrl.launch.sweep.status import effective_state, evaluation_done, now_iso, read_status
from fwrl.utils.files import atomic_write_text, check_writable_folder
from fwrl.utils.locks import FileLock

MANIFEST = "sweep.yaml"
FORMAT = 1
# settings of an existing cell that a later invocation may change (fwrl train --resume takes them)
RESOURCE_CHANGES = frozenset(RESUMABLE_CHANGES - {"total_steps"})


@dataclass(frozen=True)
class Sweep:
    """A sweep folder and its cells (in grid order)."""

    path: Path
    cells: tuple[Cell, ...]

    def cell(self, name: str) -> Cell:
        for cell in self.cells:
            if cell.name == name:
                return cell
        raise FwrlError(f"sweep {self.path} has no cell {name!r}; its cells: "
                        f"{', '.join(c.name for c in self.cells[:5])}{', ...' if len(self.cells) > 5 else ''}.")


def is_sweep(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def read_manifest(path: Path) -> dict[str, Any]:
    file = Path(path) / MANIFEST
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FwrlError(f"cannot read sweep manifest {file}: {exc}.") from None
    if not isinstance(data, dict) or data.get("fwrl_sweep") != FORMAT or not isinstance(data.get("cells"), dict):
        raise FwrlError(f"{file} is not a sweep manifest written by fwrl sweep (format {FORMAT}).")
    return data


def load_sweep(path: Path) -> Sweep:
    """The sweep in folder ``path``: its cells with the configs in ``configs/``."""
    path = Path(path)
    data = read_manifest(path)
    cells = []
    for name, entry in data["cells"].items():
        config = read_config(path / "configs" / f"{name}.yaml")
        cells.append(Cell(name, dict((entry or {}).get("labels") or {}), config))
    return Sweep(path, tuple(cells))


def cell_settings(path: Path, name: str) -> dict[str, Any]:
    """A cell's config as saved in ``configs/NAME.yaml``, read without validating it (no torch import: the
    cell runner stays light; ``fwrl train`` validates it)."""
    data = read_manifest(path)
    if name not in data["cells"]:
        names = list(data["cells"])
        raise FwrlError(f"sweep {path} has no cell {name!r}; its cells: {', '.join(names[:5])}"
                        f"{', ...' if len(names) > 5 else ''}.")
    file = Path(path) / "configs" / f"{name}.yaml"
    try:
        settings = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FwrlError(f"cannot read the config of cell {name}, {file}: {exc}.") from None
    if not isinstance(settings, dict):
        raise FwrlError(f"{file} is not a mapping of settings.")
    return settings


def _differences(old: TrainConfig, new: TrainConfig) -> list[str]:
    a, b = old.to_dict(), new.to_dict()
    return [key for key in a if a[key] != b.get(key)]


def check_compatible(old: Sweep, new_cells: Sequence[Cell]) -> None:
    """Refuse a grid that drops a cell of ``old`` or changes its settings beyond :data:`RESOURCE_CHANGES`."""
    new = {c.name: c for c in new_cells}
    hint = (f"A sweep folder keeps its cells and their settings (it may gain cells, and change only "
            f"{', '.join(sorted(RESOURCE_CHANGES))}); use another sweep folder for another grid.")
    for cell in old.cells:
        if cell.name not in new:
            raise FwrlError(f"the grid has no cell {cell.name!r}, which sweep folder {old.path} holds "
                            f"({len(old.cells)} cells). {hint}")
        changed = [k for k in _differences(cell.config, new[cell.name].config) if k not in RESOURCE_CHANGES]
        if changed:
            key = changed[0]
            raise FwrlError(f"the grid changes setting {key} of cell {cell.name!r} from "
                            f"{getattr(cell.config, key)!r} to {getattr(new[cell.name].config, key)!r}. {hint}")


def stored_evaluation(path: Path) -> dict[str, Any] | None:
    """The evaluation the sweep in ``path`` was last run with (``evaluate``, ``eval_episodes`` of its
    manifest), or None where it records none (a new folder, or one written before fwrl kept it)."""
    if not is_sweep(path):
        return None
    entry = read_manifest(path).get("evaluation")
    if not isinstance(entry, dict) or not isinstance(entry.get("evaluate"), bool):
        return None
    episodes = entry.get("eval_episodes")
    return {"evaluate": entry["evaluate"], "eval_episodes": episodes if isinstance(episodes, int) else None}


def write_sweep(path: Path, grid: Grid | None, cells: Sequence[Cell], evaluate: bool | None = None,
                eval_episodes: int | None = None) -> Sweep:
    """Create or update the sweep folder: manifest, configs, and the folders cells write to. ``evaluate``
    and ``eval_episodes`` are recorded in the manifest (None: keep what it records), so that
    ``fwrl sweep SWEEP`` alone evaluates as the sweep was asked to."""
    path = Path(path)
    check_writable_folder(path, "sweep folder", "Choose another sweep folder.")
    for sub in ("configs", "runs", "status", "logs"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    for cell in cells:
        file = path / "configs" / f"{cell.name}.yaml"
        text = config_yaml(cell.config)
        if not file.exists() or file.read_text() != text:
            atomic_write_text(file, text)
    old = read_manifest(path) if is_sweep(path) else {}
    manifest = {
        "fwrl_sweep": FORMAT,
        "created": old.get("created", now_iso()),
        "updated": now_iso(),
        "grid": grid.describe() if grid is not None else old.get("grid", {}),
        "cells": {c.name: {"labels": c.labels} for c in cells},
    }
    evaluation = ({"evaluate": bool(evaluate), "eval_episodes": eval_episodes if evaluate else None}
                  if evaluate is not None else old.get("evaluation"))
    if evaluation is not None:
        manifest["evaluation"] = evaluation
    atomic_write_text(path / MANIFEST, yaml.safe_dump(manifest, sort_keys=False))
    return Sweep(path, tuple(cells))


class SweepLock:
    """``SWEEP/.lock``: one ``fwrl sweep`` at a time runs or changes a sweep folder (``flock``)."""

    def __init__(self, path: Path):
        self.file = Path(path) / ".lock"
        self._lock = FileLock(self.file)

    def __enter__(self) -> "SweepLock":
        holder = self._lock.acquire()
        if holder is not None:
            raise FwrlError(f"another fwrl sweep ({holder}) is running on {self.file.parent}; wait for it to end "
                            "or stop it (Ctrl-C), then run this again.")
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()


# ----------------------------------------------------------------------------- what is left

@dataclass(frozen=True)
class CellState:
    """A cell's state as the executors see it, with its status (None where it never started)."""

    name: str
    state: str
    status: dict[str, Any] | None


def cell_states(sweep: Sweep) -> list[CellState]:
    out = []
    for cell in sweep.cells:
        status = read_status(sweep.path, cell.name)
        out.append(CellState(cell.name, effective_state(sweep.path, cell.name, status), status))
    return out


def finished(state: CellState, evaluate: bool, eval_episodes: int | None) -> bool:
    """Done, and evaluated as asked (a cell done without the evaluation runs again, to evaluate only)."""
    return state.state == "done" and (not evaluate or evaluation_done(state.status, eval_episodes))


def to_run(states: Sequence[CellState], evaluate: bool, eval_episodes: int | None) -> list[str]:
    """Cells to start: all but the finished ones and those a live runner holds."""
    return [s.name for s in states if not finished(s, evaluate, eval_episodes) and s.state != "running"]
