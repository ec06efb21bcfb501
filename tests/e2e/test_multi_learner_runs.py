"""Several learner ranks as a user runs them (``fwrl train --learners N``, gloo on the CPU): one run
folder, global agent steps, resume across rank counts, a killed rank; learning with two ranks is
``tests/learning/test_multi_learner_learning.py``."""

import csv
import os
import signal
import subprocess
import time

import torch
from cli_runs import CLI, metrics_rows, run_cli, train_cli
from processes import alive, children, descendants

QUICK = ["--env", "memory:cue_delay?delay=2", "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "2",
         "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "10", "--device", "cpu",
         "--num-threads", "1", "--log-interval", "1"]


def _rank_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except (FileNotFoundError, PermissionError):
        return None
    return int(env[b"RANK"]) if b"RANK" in env and b"LOCAL_RANK" in env else None


def test_two_ranks_write_one_run_and_resume_on_one_and_back_on_two(tmp_path):
    run = tmp_path / "r"
    first = train_cli(*QUICK, "--learners", "2", "--total-steps", "800", "--runs-dir", str(tmp_path), "--name", "r")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "2 learner ranks" in first.stdout
    # (.lock: the one writer's lock, fwrl.runner.rundir.RunDir.lock; run.json: the run's id, rank 0's;
    # episodes.csv: every finished episode of both ranks, written by rank 0)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoint.pt", "config.yaml", "episodes.csv",
                                                     "metrics.csv", "run.json", "tensorboard"]
    with (run / "episodes.csv").open() as f:
        workers = {int(row["worker"]) for row in csv.DictReader(f)}
    assert workers == {0, 1}, workers  # run-wide workers: rank 1's one worker is worker 1 in rank 0's file
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    per_update = 4 * 10 * 2  # B x T x ranks: agent steps count every rank's columns
    assert payload["agent_steps"] == payload["updates"] * per_update >= 800
    assert payload["scheduler"]["steps_per_update"] == per_update
    # one rank: in this process (run_cli), without an interpreter and torch start-up
    code, _, err = run_cli(["train", "--resume", "--learners", "1", "--total-steps", "1600", "--runs-dir", tmp_path,
                            "--name", "r"])
    assert code == 0, err[-3000:]
    middle = torch.load(run / "checkpoint.pt", weights_only=True)
    assert middle["agent_steps"] >= 1600 and middle["scheduler"]["steps_per_update"] == 4 * 10
    assert middle["updates"] - payload["updates"] == (middle["agent_steps"] - payload["agent_steps"]) // 40
    two = train_cli("--resume", "--learners", "2", "--total-steps", "2400", "--runs-dir", str(tmp_path), "--name", "r")
    assert two.returncode == 0, two.stderr[-3000:]
    last = torch.load(run / "checkpoint.pt", weights_only=True)
    assert last["agent_steps"] >= 2400 and last["scheduler"]["steps_per_update"] == per_update
    steps = [int(r["agent_steps"]) for r in metrics_rows(run)]
    assert steps == sorted(steps) and steps[-1] == last["agent_steps"]  # one metrics.csv, global steps


def test_a_killed_rank_stops_the_run_with_a_checkpoint_and_leaves_no_process(tmp_path):
    proc = subprocess.Popen([*CLI, "train", *QUICK, "--learners", "2", "--dist-timeout", "60", "--total-steps",
                             "100000000", "--runs-dir", str(tmp_path), "--name", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "k" / "checkpoint.pt"
    try:
        deadline = time.monotonic() + 120
        while not ckpt.exists():  # the first checkpoint comes right after the first update
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.3)
        everything = descendants(proc.pid)
        ranks = {_rank_of(p): p for p in children(proc.pid)}  # the launcher's children are the ranks (their env
        # workers inherit RANK too, one level further down)
        assert 0 in ranks and 1 in ranks, ranks
        os.kill(ranks[1], signal.SIGKILL)
        started = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and took < 60 + 30, (proc.returncode, took)  # inside the process-group timeout
    assert "learner rank 1" in err, err[-3000:]
    payload = torch.load(ckpt, weights_only=True)
    assert payload["updates"] >= 1
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in everything):
        time.sleep(0.2)
    assert not [p for p in everything if alive(p)], "processes outlived the run"
    code, out, err = run_cli(["train", "--resume", "--learners", "1", "--total-steps", payload["agent_steps"] + 200,
                              "--runs-dir", tmp_path, "--name", "k"])
    assert code == 0 and "stopped by budget" in out, err[-2000:]


