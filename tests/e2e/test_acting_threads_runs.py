"""Several acting threads (``--acting-threads N``, ``fwrl.runner.acting``) as a user runs them: each
thread steps its own slice of the workers, workers that fault are restarted in every slice, the
metrics keep their counters, a run resumes with another thread count, and several learner ranks
each run their own threads. That the threads' rollouts are right row by row is
``tests/e2e/test_acting_into_the_store.py`` (the replay test with two threads)."""

import torch
import yaml
from cli_runs import metrics_rows, run_cli, train_cli

COMMON = ["--core", "lstm", "--core-opt", "hidden_size=16", "--envs-per-worker", "2", "--batch-size", "4",
          "--unroll-length", "10", "--device", "cpu", "--num-threads", "1", "--log-interval", "1"]


def test_two_acting_threads_restart_faulty_workers_in_both_slices_and_resume_with_three(tmp_path):
    log = tmp_path / "faults.txt"
    env = f"chaos:cue_delay?delay=2&raise_every=60&fault_log={log}"  # every worker raises every 60th step
    run = tmp_path / "t"
    code, _, err = run_cli(["train", "--env", env, *COMMON, "--num-workers", "4", "--acting-threads", "2",
                            "--total-steps", "1200", "--runs-dir", tmp_path, "--name", "t"])
    assert code == 0, err[-3000:]
    faulted = {int(line.split()[2]) for line in log.read_text().splitlines()}
    assert faulted == {0, 1, 2, 3}, f"workers of both threads' slices must have stepped and faulted: {faulted}"
    rows = metrics_rows(run)
    last = rows[-1]
    assert int(last["worker_restarts"]) >= 4 and int(last["dropped_steps"]) > 0
    assert int(last["acted_steps"]) >= int(last["agent_steps"]) >= 1200
    assert float(last["policy_lag_mean"]) >= 0 and int(last["episodes"]) > 0
    for stage in ("share/env_wait", "share/inference_forward", "share/rollout_bookkeeping"):
        assert 0 <= float(last[stage]) <= 1, stage
    before = torch.load(run / "checkpoint.pt", weights_only=True)
    code, _, err = run_cli(["train", "--resume", "--acting-threads", "3", "--total-steps", "1600", "--runs-dir",
                            tmp_path, "--name", "t"])
    assert code == 0, err[-3000:]
    after = torch.load(run / "checkpoint.pt", weights_only=True)
    assert after["agent_steps"] >= 1600 and after["updates"] > before["updates"]
    assert after["progress"]["acted_steps"] > before["progress"]["acted_steps"] >= before["agent_steps"]
    assert yaml.safe_load((run / "config.yaml").read_text())["acting_threads"] == 3
    steps = [int(r["agent_steps"]) for r in metrics_rows(run)]
    assert steps == sorted(steps) and steps[-1] == after["agent_steps"]


def test_two_learner_ranks_each_with_two_acting_threads(tmp_path):
    done = train_cli("--env", "memory:cue_delay?delay=2", *COMMON, "--num-workers", "4", "--learners", "2",
                     "--acting-threads", "2", "--total-steps", "800", "--runs-dir", str(tmp_path), "--name", "m")
    assert done.returncode == 0, done.stderr[-3000:]
    payload = torch.load(tmp_path / "m" / "checkpoint.pt", weights_only=True)
    assert payload["agent_steps"] == payload["updates"] * 4 * 10 * 2 >= 800
    assert "2 learner ranks" in done.stdout
