"""Resume and time limits as a user meets them (issue 39, items 8 and 9): what a resumed run says
of its time limit, counters that go on across a resume, metrics rows a killed run wrote after its
checkpoint, the learning rate under a time limit alone, and progress lines without a success
rate where the env has none."""

from __future__ import annotations

import csv
import io

import torch

from cli_runs import run_cli
from fwrl.runner.rundir import MetricsCSV
from fwrl.runner.train_progress import Progress
from fwrl.settings.config import TrainConfig

TINY = ["--env", "memory:cue_delay?delay=3", "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1",
        "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "5", "--log-interval", "0.5"]


def rows(run) -> list[dict]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_resumed_run_says_its_time_limit_and_continues_its_counters(tmp_path):
    runs = ["--runs-dir", tmp_path, "--name", "r"]
    code, _, err = run_cli(["train", *TINY, "--total-steps", 200, "--max-seconds", 120, *runs])
    assert code == 0, err
    first = rows(tmp_path / "r")[-1]
    acted = int(first["acted_steps"])
    assert acted >= 200
    assert torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["progress"]["acted_steps"] >= 200

    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 400])
    assert code == 0, err
    assert "time limit 120 s for this session (--max-seconds changes it)" in err, err
    assert int(rows(tmp_path / "r")[-1]["acted_steps"]) >= acted + 200  # counts on, not from 0

    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 440, "--max-seconds", 0])
    assert code == 0, err
    assert "no time limit (--max-seconds sets one)" in err, err


def test_resume_drops_the_metrics_rows_a_killed_run_wrote_after_its_checkpoint(tmp_path):
    runs = ["--runs-dir", tmp_path, "--name", "k"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *runs])[0] == 0
    saved = torch.load(tmp_path / "k" / "checkpoint.pt", weights_only=True)["agent_steps"]
    metrics = MetricsCSV(tmp_path / "k" / "metrics.csv")
    for steps in (saved + 20, saved + 40):  # what a run killed after its checkpoint left
        metrics.write({"time": 99.0, "agent_steps": steps, "updates": 77})
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", saved + 20])
    assert code == 0, err
    assert f"dropped 2 row(s) of {tmp_path / 'k' / 'metrics.csv'}" in err, err
    kept = rows(tmp_path / "k")
    assert all(r["updates"] != "77" for r in kept), kept
    steps = [int(r["agent_steps"]) for r in kept]
    assert steps == sorted(steps) and steps[-1] == saved + 20


def test_metrics_rows_after_a_step_count_are_dropped_and_nothing_else(tmp_path):
    metrics = MetricsCSV(tmp_path / "metrics.csv")
    for steps in (10, 20, 30):
        metrics.write({"agent_steps": steps, "mean_return": steps / 10})
    metrics.write({"agent_steps": 20, "eval/test/mean_return": 1.5})  # an evaluation row of 20 steps
    assert MetricsCSV(tmp_path / "metrics.csv").drop_rows_after(20) == 1
    assert [r["agent_steps"] for r in rows(tmp_path)] == ["10", "20", "20"]
    assert MetricsCSV(tmp_path / "metrics.csv").drop_rows_after(20) == 0


def test_a_time_limit_alone_says_the_learning_rate_does_not_anneal_over_it(tmp_path):
    code, out, err = run_cli(["train", *TINY, "--max-seconds", 8, "--runs-dir", tmp_path, "--name", "t"])
    assert code == 0, err
    assert "decays to 0 over --total-steps (50,000,000 agent steps, the default)" in err, err
    assert "(time limit 0:08)" in err, err  # the progress lines show the binding budget
    code, _, err = run_cli(["train", *TINY, "--max-seconds", 8, "--total-steps", 100, "--runs-dir", tmp_path,
                            "--name", "u"])
    assert code == 0 and "decays to 0 over --total-steps" not in err, err


def test_progress_lines_leave_out_a_success_rate_the_env_does_not_have():
    out = io.StringIO()
    from rich.console import Console

    progress = Progress(TrainConfig.from_dict({"env": "memory:cue_delay", "total_steps": 1000}), "runs/x",
                        console=Console(file=out, width=300))
    row = {"agent_steps": 100, "updates": 2, "time": 1.0, "episodes": 3, "mean_return": 0.5}
    progress.update({**row, "mean_success": float("nan")})
    progress.update({**row, "mean_success": 0.75})
    first, second = out.getvalue().splitlines()
    assert "mean_success" not in first and "mean_return=0.5" in first
    assert "mean_success=0.75" in second
