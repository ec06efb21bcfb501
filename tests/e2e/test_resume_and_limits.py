"""Resume, budgets and time limits as a user meets them: what a resumed run says of its time limit,
counters that go on across a resume, metrics rows a killed run wrote after its checkpoint, the
learning rate under a time limit alone; ``--max-seconds`` counts start-up and stop (a hung worker's
closing included), a step budget is reached in whole batches and says by how much; and what the
progress says before the first update (the first batch filling, a slow first update), without a
finished episode, and without a success rate where the env has none."""

from __future__ import annotations

import csv
import io
import time

import torch

from cli_runs import run_cli
from fwrl.runner.rundir import MetricsCSV
from fwrl.runner.train_progress import Progress
from fwrl.settings.config import TrainConfig

TINY = ["--env", "memory:cue_delay?delay=3", "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1",
        "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "5", "--log-interval", "0.5"]
# the same agent without its env, a metrics row a second (the budget tests name their envs)
TINY_AGENT = ["--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1", "--envs-per-worker", "4",
              "--batch-size", "4", "--unroll-length", "5", "--log-interval", "1"]


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


BUDGET = 6.0
# The limit counts from main() to its return. What is kept back for the stop is measured (the last
# update, the last checkpoint) plus fwrl.runner.stopping.STOP_ALLOWANCE (2 s, for closing the worker
# and the interpreter's exit); here the measured ones take milliseconds, so the run ends about two
# seconds early. The tolerance is for a loaded 2-core machine, where closing a worker process or the
# last metrics row can be slow.
TOLERANCE = 1.5


def test_max_seconds_counts_start_up_and_stop(tmp_path):
    began = time.monotonic()
    code, out, err = run_cli(["train", "--env", "memory:cue_delay?delay=3", *TINY_AGENT, "--total-steps", "1e9",
                              "--max-seconds", BUDGET, "--runs-dir", tmp_path, "--name", "timed"])
    wall = time.monotonic() - began
    assert code == 0, err
    assert "stopped by time limit" in out and f"limit {BUDGET:g} s, start-up and stop included" in out, out
    assert wall < BUDGET + TOLERANCE, f"{wall:.2f} s for a {BUDGET:g} s limit"
    assert int(rows(tmp_path / "timed")[-1]["updates"]) >= 1, "the run never learnt: the limit was spent before the first update"
    assert (tmp_path / "timed" / "checkpoint.pt").is_file()


def test_the_clock_starts_with_fwrl_not_with_the_process_a_shell_execd(tmp_path):
    """``bash -c "sleep S && exec fwrl train ..."``: the process is the shell's, started S seconds before
    fwrl; the elapsed time (and --max-seconds, which counts from the same start) counts from fwrl's."""
    import re
    import shlex
    import subprocess
    import sys

    sleep = 3.0
    train = [sys.executable, "-m", "fwrl.launch.cli", "train", "--env", "memory:cue_delay?delay=3", *TINY_AGENT,
             "--total-steps", "100", "--max-seconds", "600", "--runs-dir", str(tmp_path), "--name", "late"]
    began = time.monotonic()
    done = subprocess.run(["bash", "-c", f"sleep {sleep} && exec {shlex.join(train)}"], capture_output=True, text=True,
                          timeout=300)
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr[-3000:]
    elapsed = float(re.search(r"stopped by budget after ([0-9.]+) s", done.stdout).group(1))
    assert elapsed < wall - sleep + 0.5, (elapsed, wall, done.stdout)  # at 9f18864: the sleep counted too


def test_a_time_limit_that_ends_a_run_before_its_first_update_says_to_raise_it():
    from types import SimpleNamespace

    from fwrl.launch.cli import _result_text

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "total_steps": 2000, "max_seconds": 2})
    result = SimpleNamespace(mean_return=float("nan"), episodes=0, stopped_by="time limit", wall_seconds=2.1,
                             updates=0, agent_steps=0, mean_success=float("nan"))
    text = _result_text(result, config, 100)
    assert "before its first update: raise --max-seconds" in text, text
    assert "first update" not in _result_text(SimpleNamespace(**{**vars(result), "updates": 3, "agent_steps": 300}),
                                              config, 100)


def test_max_seconds_counts_closing_a_hung_worker(tmp_path):
    """A worker hung in a step when the limit comes (its step timeout far off) is killed within
    the limit, not waited on for the pool's 5 s of grace."""
    env = "chaos:cue_delay?delay=3&hang_every=30&hang_seconds=600&only_worker=1"
    began = time.monotonic()
    code, out, err = run_cli(["train", "--env", env, *TINY_AGENT, "--num-workers", "2", "--step-timeout", "600",
                              "--total-steps", "1e9", "--max-seconds", BUDGET, "--runs-dir", tmp_path,
                              "--name", "hung"])
    wall = time.monotonic() - began
    assert code == 0, err
    assert "stopped by time limit" in out, out
    assert wall < BUDGET + TOLERANCE, f"{wall:.2f} s for a {BUDGET:g} s limit"


def test_step_budget_overshoot_is_below_one_batch_and_said_so(tmp_path):
    """B 4 x T 5 = 20 steps per update; a budget of 210 takes 11 updates, 220 steps; acting stops
    once the last batch's rollouts are done; --resume says where it continues."""
    code, out, err = run_cli(["train", "--env", "memory:cue_delay?delay=3", *TINY_AGENT, "--total-steps", 210,
                              "--runs-dir", tmp_path, "--name", "steps"])
    assert code == 0, err
    assert "220 agent steps: budget 210 reached in whole batches of 20 steps, the last one 10 past it" in out, out
    assert "11 updates" in out and "stopped by budget" in out, out
    last = rows(tmp_path / "steps")[-1]
    slots, unroll = 4, 5
    # one rollout per slot under way when the last batch was done, plus each slot's first extra step
    assert int(last["acted_steps"]) <= 220 + slots * (unroll + 1), last
    assert int(last["rollout_columns"]) >= 44, last

    code, out, err = run_cli(["train", "--name", "steps", "--runs-dir", tmp_path, "--resume", "--total-steps", 260])
    assert code == 0, err
    assert f"resuming {tmp_path / 'steps'} from its checkpoint at 220 agent steps (11 updates)" in err, err
    assert "260 / 260 agent steps (100.0%)" in out, out


def test_no_episode_finished_says_so_not_nan():
    from types import SimpleNamespace

    from fwrl.launch.cli import _result_text

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "total_steps": 2000, "max_seconds": 30})
    result = SimpleNamespace(agent_steps=1600, updates=1, episodes=0, mean_return=float("nan"),
                             mean_success=float("nan"), stopped_by="time limit", wall_seconds=29.4)
    text = _result_text(result, config, 1600)
    assert "no episode finished yet" in text and "nan" not in text, text
    assert "1 update," in text and "after 29.4 s (limit 30 s" in text, text


def test_filling_counts_the_rollouts_the_learner_waits_for():
    config = TrainConfig.from_dict({"env": "memory:cue_delay", "batch_size": 32, "unroll_length": 50})
    progress = Progress(config, "runs/x")
    row = {"agent_steps": 0, "updates": 0, "acted_steps": 2222, "rollout_columns": 24, "time": 3.0}
    assert progress.status(row) == ("filling the first batch: 24 of 32 rollouts of 50 steps ready "
                                    "(2,222 agent steps acted)")
    row["rollout_columns"] = 40
    assert progress.status(row).startswith("first update running: its batch of 32 rollouts x 50 steps is ready")


def test_a_slow_first_update_says_what_to_change():
    from fwrl.runner.budget import Budget
    from fwrl.runner.slow_start import SlowStartHint

    class Shown:
        rows: list = []
        started: list = []

        def start(self, budget, deadline):
            self.started.append((budget, deadline))

        def update(self, row):
            self.rows.append(row)

        def stop(self):
            pass

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "core": "rdn", "batch_size": 32, "unroll_length": 50})
    out = io.StringIO()
    hint = SlowStartHint(Shown(), config, after=0.0, out=out)
    budget = Budget.of(config, ranks=2)
    hint.start(budget, 5.0)  # train starts its progress with the run's budget and deadline: they reach the display
    assert Shown.started == [(budget, 5.0)]
    hint.update({"updates": 0, "agent_steps": 0, "rollout_columns": 12, "acted_steps": 700})
    hint.update({"updates": 0, "agent_steps": 0, "rollout_columns": 20, "acted_steps": 1200})
    text = out.getvalue()
    assert text.count("\n") == 1, text  # said once
    assert "12 of 32 rollouts of 50 steps" in text and "--batch-size" in text and "--device cuda" in text
    assert len(Shown.rows) == 2
    quiet = io.StringIO()
    fast = SlowStartHint(Shown(), config, after=0.0, out=quiet)
    fast.start(budget, 5.0)
    fast.update({"updates": 1, "agent_steps": 1600})
    assert quiet.getvalue() == ""
