"""The learning suite's dry run (benchmarks/learning/): its CPU grid, with tiny budgets, through
``fwrl sweep`` (every cell trained and evaluated) and ``fwrl report`` (the per-game table beside the
random policy's return). The full suite is a benchmark, not a test: benchmarks/learning/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("minatar", reason="needs MinAtar (pip install 'fwrl[minatar]')")
pytest.importorskip("rliable", reason="needs rliable (pip install 'fwrl[report]')")

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "learning"
TINY = ["--total-steps", "120", "--num-workers", "1", "--envs-per-worker", "2", "--batch-size", "2",
        "--unroll-length", "5", "--num-threads", "1", "--device", "cpu"]


def _fwrl(*args: str) -> tuple[int, str, str]:
    """``fwrl ARGS`` through its main in this process (the sweep's cells are processes of their own):
    (exit status, stdout, stderr)."""
    from cli_runs import run_cli

    return run_cli(list(args))


def test_the_grids_name_the_suites_games_and_cores():
    cpu = yaml.safe_load((SUITE / "minatar-cpu.yaml").read_text())
    full = yaml.safe_load((SUITE / "minatar-full.yaml").read_text())
    cores = [{"label": name, "core": name} for name in ("lstm", "rdn", "delta_net", "srwm", "delta_rnn")]
    cores += [{"label": "elstm-rtrl", "core": "elstm", "elstm_grad": "rtrl"}, {"label": "feedforward", "core": "feedforward"}]
    assert cpu["env"] == ["minatar:breakout", "minatar:space_invaders"] and cpu["seed"] == [1, 2, 3]
    assert cpu["core"] == cores and full["core"] == cores
    assert (cpu["batch_size"], cpu["learning_rate"]) == (8, 0.0012)  # one setting for every core
    assert cpu["total_steps"] == 1_000_000 and full["total_steps"] == 5_000_000 and full["seed"] == [1, 2, 3]
    assert sorted(full["env"]) == [f"minatar:{g}" for g in ("asterix", "breakout", "freeway", "seaquest",
                                                             "space_invaders")]
    same = {k: v for k, v in cpu.items() if k not in ("env", "total_steps")}
    assert same == {k: v for k, v in full.items() if k not in ("env", "total_steps")}


def test_dry_run_plans_every_cell_then_trains_evaluates_and_reports_two(tmp_path):
    """Every cell of the CPU grid planned (its settings checked, nothing started); then two of its
    cores on its first game, one seed, trained, evaluated and reported: the LSTM and the labelled
    RTRL eLSTM (the other cores' cells are the same command with another core, and every core
    trains in tests/e2e/test_every_core_trains.py; the report's table of several games is
    tests/unit/test_report.py's)."""
    code, out, err = _fwrl("sweep", str(tmp_path / "plan"), "--grid", str(SUITE / "minatar-cpu.yaml"), "--dry-run")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "42 of 42 cells would run" in out and not (tmp_path / "plan").exists()
    sweep, grid = tmp_path / "suite", tmp_path / "two-cores.yaml"
    cpu = yaml.safe_load((SUITE / "minatar-cpu.yaml").read_text())
    cores = [c for c in cpu["core"] if c["label"] in ("lstm", "elstm-rtrl")]
    grid.write_text(yaml.safe_dump({**cpu, "env": cpu["env"][:1], "seed": [1], "core": cores}))
    code, out, err = _fwrl("sweep", str(sweep), "--grid", str(grid), *TINY, "--evaluate", "--eval-episodes", "2",
                           "--parallel", "2")
    assert code == 0, out[-3000:] + err[-3000:]
    statuses = [json.loads(p.read_text()) for p in (sweep / "status").glob("*.json")]
    assert len(statuses) == 2 and all(s["state"] == "done" for s in statuses), statuses
    code, out, err = _fwrl("report", str(sweep), "--random-episodes", "5", "--reps", "200")
    assert code == 0, out[-3000:] + err[-3000:]
    result = json.loads((sweep / "report" / "report.json").read_text())
    groups = {row["group"] for row in result["per_game"]}
    assert groups == {"lstm", "elstm-rtrl"}
    assert {g["game"] for g in result["games"]} == {"minatar:breakout"}
    assert all(g["random"] is not None for g in result["games"])
    assert "| minatar:breakout |" in out
