"""Runs that survive: every stop signal leaves a loadable checkpoint and the shell's exit status,
even in the first seconds; a resumed run continues its time, episodes and learning-rate schedule;
checkpoints are written in the background with the permissions of any new file."""

import csv
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from cli_runs import run_cli

from fwrl.runner.checkpointing import CheckpointWriter

QUICK = ["--env", "memory:cue_delay?delay=2", "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "2",
         "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "10", "--device", "cpu",
         "--num-threads", "1", "--log-interval", "1"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_stop_signals_leave_a_checkpoint_and_the_shell_exit_status(tmp_path, signum):
    cmd = [sys.executable, "-m", "fwrl.launch.cli", "train", *QUICK, "--total-steps", "10000000",
           "--runs-dir", str(tmp_path), "--name", "run"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "metrics.csv").exists():  # the run is going (well inside 10 s of acting)
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else ""
            time.sleep(0.2)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, out[-2000:]
    assert f"stopped by signal {signal.Signals(signum).name}" in out
    # said when the signal came, not only once the update in progress ended
    assert f"fwrl: {signal.Signals(signum).name} received: stopping after the current update" in out
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert payload["progress"]["elapsed_seconds"] < 10.0 and payload["agent_steps"] >= 0
    for name in ("checkpoint.pt", "config.yaml", "metrics.csv"):
        mode = stat.S_IMODE(os.stat(tmp_path / "run" / name).st_mode)
        assert mode == 0o666 & ~_umask(), (name, oct(mode))
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.endswith(".tmp")]


def test_bench_throughput_stopped_by_ctrl_c_says_its_figures_are_partial(tmp_path):
    """Ctrl-C during the measured window: the figures of the shorter window are shown, said to be
    partial (in the JSON too), and the command exits 130 as every other fwrl command."""
    cmd = [sys.executable, "-m", "fwrl.launch.cli", "bench", "throughput", *QUICK[:-2], "--seconds", "60",
           "--warmup", "1", "--ceiling-seconds", "0", "--json-path", str(tmp_path / "b.json")]
    # SIGINT as a terminal delivers it: a test worker (pytest-xdist) may ignore SIGINT, which children inherit
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + 90
        # measuring: a progress line past the warm-up (the window needs two metrics rows after it)
        line = ""
        while "measuring" not in line or "agent steps learnt" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else line
            line = proc.stderr.readline()
        time.sleep(3.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "stopped by SIGINT before the measured window ended: the figures above are partial" in " ".join(err.split())
    assert "agent steps/s" in out
    import json

    assert json.loads((tmp_path / "b.json").read_text())["partial"] is True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_resume_continues_time_episodes_and_the_new_schedule(tmp_path):
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.train import train

    config = TrainConfig(env="memory:cue_delay?delay=2", core="lstm", core_options={"hidden_size": 16},
                         num_workers=2, envs_per_worker=4, batch_size=4, unroll_length=10, total_steps=1000,
                         learning_rate=1e-3, device="cpu", num_threads=1, log_interval=0.02)
    first = train(config, tmp_path)
    assert first.stopped_by == "budget"
    rows = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    end_time, end_episodes = float(rows[-1]["time"]), int(rows[-1]["episodes"])
    assert float(rows[-1]["learning_rate"]) == 0.0  # the old budget ran out
    config.total_steps = 2000
    second = train(config, tmp_path, resume=True)
    assert second.agent_steps >= 2000 and second.episodes > first.episodes
    resumed = list(csv.DictReader((tmp_path / "metrics.csv").open()))[len(rows):]
    assert float(resumed[0]["time"]) > end_time and int(resumed[0]["episodes"]) >= end_episodes
    updated = [row for row in resumed if row["learning_rate"] != ""]  # rows after the first update
    for row in updated:  # every update of the resumed run uses the schedule of the new budget
        steps, lr = int(row["agent_steps"]), float(row["learning_rate"])
        if steps < 2000:
            assert lr == pytest.approx(1e-3 * (1 - steps / 2000), rel=1e-6), row
    assert any(float(row["learning_rate"]) > 0 for row in updated)


def test_checkpoint_writer_writes_in_the_background_and_reports_errors(tmp_path):
    release = threading.Event()
    written = []

    def slow_write(path, payload):
        release.wait(10)
        if payload.get("fail"):
            raise OSError("disk full")
        written.append((path.name, payload["n"]))

    snapshots = iter([{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4, "fail": True}, {"n": 5}])
    writer = CheckpointWriter(lambda: next(snapshots), write=slow_write)
    writer.request(tmp_path / "a.pt")  # taken by the thread, blocked in the write
    time.sleep(0.2)
    writer.request(tmp_path / "b.pt")
    writer.request(tmp_path / "b.pt")  # replaces the snapshot still waiting for b
    assert written == []  # request() did not wait for the disk
    release.set()
    writer.flush()
    assert written == [("a.pt", 1), ("b.pt", 3)]
    writer.request(tmp_path / "c.pt")
    with pytest.raises(OSError, match="disk full"):
        writer.flush()
    writer.request(tmp_path / "d.pt")
    writer.close()
    assert written[-1] == ("d.pt", 5) and writer.written == 3


def test_atomic_write_replaces_whole_files_with_open_permissions(tmp_path):
    from fwrl.utils.files import atomic_write

    path = tmp_path / "f.bin"
    atomic_write(path, lambda f: f.write(b"one"))
    with pytest.raises(RuntimeError):
        atomic_write(path, lambda f: (f.write(b"half"), (_ for _ in ()).throw(RuntimeError("crash"))))
    assert path.read_bytes() == b"one" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert Path(path).exists()


def test_the_same_command_twice_makes_two_runs(tmp_path):
    """Without --name the run folder gets a name of its own (-2, -3, ...), so re-running a command
    works; with --name a folder holding a run is refused (--resume continues it). In this process
    (run_cli): the same command, without an interpreter and torch start-up each time."""
    argv = ["train", *QUICK, "--total-steps", "200", "--runs-dir", tmp_path]
    for _ in range(2):
        code, _, err = run_cli(argv)
        assert code == 0, err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory-cue-delay-lstm", "memory-cue-delay-lstm-2"]
    code, _, err = run_cli(argv + ["--name", "memory-cue-delay-lstm"])
    assert code == 2 and "already holds a run" in err


@pytest.mark.parametrize("delay", [0.3, 0.6, 1.5, 2.5])
def test_ctrl_c_while_the_command_starts_is_not_a_traceback_nor_an_empty_run_folder(tmp_path, delay):
    """Ctrl-C in the first moments (the command line still importing, the run being built) ends with
    130 like a Ctrl-C later, never a traceback from inside an import, and leaves either a run with its
    checkpoint or no run folder at all (not one with a config and nothing to resume)."""
    # SIGINT as a terminal delivers it: a test worker (pytest-xdist) may ignore SIGINT, which children inherit
    proc = subprocess.Popen([sys.executable, "-m", "fwrl", "train", *QUICK, "--total-steps", "20000", "--runs-dir",
                             str(tmp_path / "runs"), "--name", "r"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    run = tmp_path / "runs" / "r"
    assert (run / "checkpoint.pt").is_file() or not run.exists(), sorted(p.name for p in run.iterdir())


def test_ctrl_c_between_taking_the_run_folder_and_training_leaves_no_folder(tmp_path, monkeypatch):
    """A Ctrl-C after the run folder is made and locked but before training starts (the runner still
    importing, the progress display being built) removes the folder, lock file included."""
    import fwrl.runner.slow_start
    from fwrl.launch.cli import main

    def interrupted(*args, **kwargs):
        assert (tmp_path / "runs" / "r" / ".lock").exists()  # the folder is taken when the Ctrl-C comes
        raise KeyboardInterrupt

    monkeypatch.setattr(fwrl.runner.slow_start, "SlowStartHint", interrupted)
    assert main(["train", *QUICK, "--total-steps", "200", "--runs-dir", str(tmp_path / "runs"), "--name", "r"]) == 130
    assert not (tmp_path / "runs" / "r").exists(), sorted(p.name for p in (tmp_path / "runs" / "r").iterdir())


def test_a_ctrl_c_caught_inside_exec_of_a_string_still_exits_130(tmp_path):
    """A Ctrl-C that lands while dataclasses or typing ``exec`` a string (modules being imported) and is
    caught by the command exits 130 under ``python -m`` too: CPython 3.11 otherwise remembers it as
    unhandled and ends the process by SIGINT (status -2) after the 130 was returned."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\n"
        "from fwrl.launch.exits import interrupted\n"
        "try:\n"
        "    exec('raise KeyboardInterrupt')\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(interrupted())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "fwrl: interrupted\n")


def test_one_writer_per_run_folder(tmp_path):
    """A second fwrl train on a run folder in use (the same --name while the first has no checkpoint
    yet, or --resume of a run still training) is refused in one line naming the writer, before it
    writes anything; once the writer is gone (here killed with SIGKILL: no stale lock) --resume takes
    the folder. The writer is a process of its own; the second commands run in this process (run_cli)."""
    cmd = [sys.executable, "-m", "fwrl.launch.cli", "train", *QUICK, "--total-steps", "10000000",
           "--runs-dir", str(tmp_path), "--name", "run"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "run"
    try:
        deadline = time.monotonic() + 60
        while not (run / ".lock").exists():  # the first holds the folder; it has no checkpoint yet
            assert time.monotonic() < deadline and first.poll() is None, first.stdout.read() if first.poll() else ""
            time.sleep(0.05)
        same_name = run_cli(cmd[3:])
        while not ((run / "checkpoint.pt").exists() and (run / "metrics.csv").exists()):
            assert time.monotonic() < deadline and first.poll() is None, first.stdout.read() if first.poll() else ""
            time.sleep(0.2)
        resume = run_cli(cmd[3:] + ["--resume"])
        for code, _, err in (same_name, resume):
            assert code == 2, err[-2000:]
            assert (f"is being written by pid {first.pid} on " in err
                    or (err is same_name[2] and "already holds a run" in err)), err[-2000:]
        assert f"is being written by pid {first.pid} on " in resume[2]
        assert first.poll() is None  # the writer trains on, undisturbed
    finally:
        first.kill()
        first.wait(timeout=60)
    code, _, err = run_cli(cmd[3:-6] + ["--total-steps", "400", "--runs-dir", tmp_path, "--name", "run", "--resume"])
    assert code == 0, err[-2000:]
