"""benchmarks/learning/cells_to_runs.py: committed cells (CELL.metrics.csv) back into run folders whose
config is the grid's own, which `fwrl report` scores like the sweep's runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--", "--env", "memory:cue_delay?delay=2", "--core", "lstm", "feedforward", "--seed", "1", "2",
         "--total-steps", "300"]


def _script():
    spec = importlib.util.spec_from_file_location("cells_to_runs", ROOT / "benchmarks/learning/cells_to_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cell(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.metrics.csv").write_text("agent_steps,mean_return\n100,0.5\n")


def test_cells_become_runs_with_the_grids_configs(tmp_path, capsys):
    _cell(tmp_path / "seed-1", "lstm__seed-1")
    _cell(tmp_path / "seed-2", "feedforward__seed-2")
    out = tmp_path / "runs"
    assert _script().main([str(out), str(tmp_path / "seed-1"), str(tmp_path / "seed-2"), *FLAGS]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["feedforward__seed-2", "lstm__seed-1"]
    config = yaml.safe_load((out / "feedforward__seed-2" / "config.yaml").read_text())
    assert (config["core"], config["seed"], config["total_steps"]) == ("feedforward", 2, 300)
    assert (out / "lstm__seed-1" / "metrics.csv").read_text().startswith("agent_steps,mean_return")
    assert "2 run folders" in capsys.readouterr().out


def test_a_file_of_no_cell_of_the_grid_is_refused_with_the_cells(tmp_path, capsys):
    _cell(tmp_path / "cells", "lstm__seed-3")
    out = tmp_path / "runs"
    assert _script().main([str(out), str(tmp_path / "cells"), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert "lstm__seed-3.metrics.csv names no cell of the grid" in err and "lstm__seed-1" in err
    assert not out.exists()
