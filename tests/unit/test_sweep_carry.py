"""benchmarks/learning/sweep_carry.py: a sweep's state saved small enough to commit, and restored on another
machine as a sweep folder whose finished cells are skipped and whose others resume."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fwrl.launch.sweep.status import effective_state, read_status, write_status

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("sweep_carry", ROOT / "benchmarks/learning/sweep_carry.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(sweep: Path, cell: str, state: str) -> None:
    run = sweep / "runs" / cell
    (run / "tensorboard").mkdir(parents=True)
    for name in ("config.yaml", "metrics.csv", "episodes.csv", "checkpoint.pt", "evaluation.json"):
        (run / name).write_text(f"{cell} {name}\n")
    (run / "run.json").write_text(json.dumps({"id": cell, "folder": str(run)}) + "\n")
    write_status(sweep, cell, state=state, agent_steps=1000)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    path = tmp_path / "machine-a" / "sweep"
    (path / "configs").mkdir(parents=True)
    (path / "sweep.yaml").write_text("fwrl_sweep: 1\n")
    (path / "configs" / "done.yaml").write_text("seed: 1\n")
    _run(path, "done", "done")
    _run(path, "running", "running")  # its runner holds no lock here: a runner that is gone
    return path


def test_save_keeps_what_resuming_needs_and_leaves_the_bulk(sweep: Path, tmp_path: Path):
    saved = tmp_path / "saved"
    lines = _script().save(sweep, saved)
    assert "2 cells with a status" in lines[0]
    assert sorted(p.name for p in (saved / "run-folders" / "done").iterdir()) == [
        "config.yaml", "evaluation.json", "metrics.csv", "run.json"]  # done: no checkpoint needed
    assert sorted(p.name for p in (saved / "run-folders" / "running").iterdir()) == [
        "checkpoint.pt", "config.yaml", "evaluation.json", "metrics.csv", "run.json"]
    assert read_status(saved, "running")["state"] == "interrupted"
    assert read_status(sweep, "running")["state"] == "running"  # the sweep itself is untouched
    assert (saved / "configs" / "done.yaml").is_file() and not (saved.parent / "saved.partial").exists()
    assert not any(p.name == "runs" for p in saved.rglob("*"))  # .gitignore ignores runs/: the save is committable


def test_a_second_save_replaces_the_first(sweep: Path, tmp_path: Path):
    saved = tmp_path / "saved"
    _script().save(sweep, saved)
    (saved / "stale").write_text("from an earlier save\n")
    _script().save(sweep, saved)
    assert not (saved / "stale").exists()


def test_restore_gives_a_sweep_that_skips_done_cells_and_resumes_the_others(sweep: Path, tmp_path: Path):
    carry = _script()
    carry.save(sweep, tmp_path / "saved")
    other = tmp_path / "machine-b" / "sweep"
    carry.restore(tmp_path / "saved", other)
    assert effective_state(other, "done") == "done"
    assert effective_state(other, "running") == "interrupted"
    assert (other / "runs" / "running" / "checkpoint.pt").read_text() == "running checkpoint.pt\n"
    run = json.loads((other / "runs" / "running" / "run.json").read_text())
    assert run == {"id": "running", "folder": str((other / "runs" / "running").resolve())}


def test_restore_refuses_an_existing_folder_and_a_folder_of_no_save(sweep: Path, tmp_path: Path):
    carry = _script()
    carry.save(sweep, tmp_path / "saved")
    with pytest.raises(SystemExit, match="exists; restore into a new folder"):
        carry.restore(tmp_path / "saved", sweep)
    with pytest.raises(SystemExit, match="holds no saved sweep"):
        carry.restore(tmp_path, tmp_path / "new")
    with pytest.raises(SystemExit, match="is not a sweep folder"):
        carry.save(tmp_path, tmp_path / "saved2")
