"""What ``fwrl sweep`` says of a sweep: ``--status`` keeps each cell's whole name on one line, the
ETA counts a running cell's time left, a finished sweep names the next command (``fwrl report``),
and the sweep folder of the README's example is ignored by git. Sweep folders are written, no cell
runs.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from cli_runs import run_cli, tiny_sweep

REPO = Path(__file__).resolve().parents[2]


LONG = ["--env", "memory:cue_delay?delay=3", "memory:copy?length=2&delay=1", "--core", "linear_transformer",
        "lstm", "--learning-rate", "0.002", "0.0006", "--seed", "11", "12", "--total-steps", "1000"]


def test_sweep_status_keeps_each_cell_name_on_one_line(tmp_path):
    sweep = tiny_sweep(tmp_path / "sw", *LONG)
    names = [cell.name for cell in sweep.cells]
    assert max(map(len, names)) > 60  # longer than an 80-column table leaves them
    code, out, _ = run_cli(["sweep", tmp_path / "sw", "--status"])
    assert code == 0
    lines = out.splitlines()
    for name in names:
        assert any(name in line for line in lines), (name, out)


def test_sweep_eta_counts_a_running_cells_time_left(tmp_path):
    """A cell running past the mean duration of the finished ones still has time left: its run says how much."""
    import time as clock

    from fwrl.launch.sweep.plan import CellState
    from fwrl.launch.sweep.sweep_progress import SweepProgress, run_time_left

    states = [CellState("a", "done", {"state": "done", "seconds": 60.0}), CellState("b", "pending", None)]
    progress = SweepProgress("sw", states, 1, out=io.StringIO(), time_left=lambda cell: 58.0)
    progress.start("b")
    progress.started["b"] -= 65  # running for 65 s: past the 60 s mean of the finished cell
    assert progress.eta() == pytest.approx(58.0)
    assert "ETA 0:58" in progress.summary()
    unknown = SweepProgress("sw", states, 1, out=io.StringIO())  # the run has logged no update yet
    unknown.start("b")
    unknown.started["b"] -= 65
    assert unknown.eta() is None and "ETA" not in unknown.summary()

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("time,agent_steps,updates\n10.0,100,1\n60.0,500,5\n")
    left = run_time_left(run, 1000, now=clock.time())
    assert left == pytest.approx(60.0, abs=1.5)  # 500 more steps at 500 steps per 60 s


def test_a_finished_sweep_says_what_comes_next(tmp_path):
    from fwrl.launch.sweep.status import write_status

    sweep = tiny_sweep(tmp_path / "sw", "--env", "memory:cue_delay", "--core", "lstm", "feedforward",
                       "--total-steps", "100")
    for cell in sweep.cells:
        write_status(sweep.path, cell.name, state="done", exit_code=0, seconds=3.0)
    code, _, err = run_cli(["sweep", sweep.path])
    assert code == 0, err
    assert f"next: fwrl report {sweep.path}" in err, err

    from fwrl.launch.sweep.command import _finish

    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        assert _finish(sweep, 0) == 0
    assert f"next: fwrl report {sweep.path}" in captured.getvalue()


def test_the_readmes_sweep_folder_is_ignored_by_git():
    ignored = (REPO / ".gitignore").read_text().split()
    assert "sweeps/" in ignored
    assert "fwrl sweep sweeps/memory" in (REPO / "README.md").read_text()
