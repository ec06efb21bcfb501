"""End to end through the CLI: train Pong briefly, resume, survive SIGKILL, refuse bad input."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from cli_runs import run_cli
from processes import alive, descendants

pytest.importorskip("ale_py", reason="Atari tests need ale-py (pip install 'fwrl[atari]')")

CLI = [sys.executable, "-m", "fwrl.launch.cli"]
PONG = ["--env", "atari:Pong", "--stem", "nature", "--num-workers", "2", "--envs-per-worker", "1",
        "--batch-size", "2", "--unroll-length", "8", "--log-interval", "1"]


def fwrl_here(*args) -> str:
    """``fwrl ARGS`` in this process (no interpreter and torch start-up), which must succeed; its stdout."""
    code, out, err = run_cli(list(args))
    assert code == 0, f"fwrl {' '.join(map(str, args))} exited {code}\n{out}\n{err}"
    return out


def steps_column(run: Path) -> list[int]:
    with (run / "metrics.csv").open() as f:
        return [int(row["agent_steps"]) for row in csv.DictReader(f)]


def test_train_pong_then_resume(tmp_path):
    fwrl_here("train", *PONG, "--total-steps", "64", "--name", "pong", "--runs-dir", tmp_path)
    run = tmp_path / "pong"
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    assert payload["agent_steps"] >= 64 and payload["config"]["env"] == "atari:Pong"
    assert (run / "config.yaml").exists() and any((run / "tensorboard").iterdir())
    first = payload["agent_steps"]
    lr_before = payload["optimizer"]["param_groups"][0]["lr"]
    assert lr_before == pytest.approx(0.0, abs=1e-12), "LR decays to 0 at the budget"

    out = fwrl_here("train", "--name", "pong", "--runs-dir", tmp_path, "--resume", "--total-steps", "128")
    assert "stopped by budget" in out
    payload = torch.load(run / "checkpoint.pt", weights_only=True)
    assert payload["agent_steps"] >= 128 > first
    assert payload["updates"] == payload["agent_steps"] // 16
    steps = steps_column(run)
    assert steps == sorted(steps) and steps[-1] == payload["agent_steps"]
    assert yaml.safe_load((run / "config.yaml").read_text())["total_steps"] == 128


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_kill_mid_run_leaves_checkpoint_and_no_orphans(tmp_path, sig):
    proc = subprocess.Popen([*CLI, "train", *PONG, "--total-steps", "100000000", "--checkpoint-interval", "1",
                             "--name", "k", "--runs-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "k" / "checkpoint.pt"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not ckpt.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    assert ckpt.exists(), "no checkpoint written within 180 s"
    time.sleep(2)
    workers = descendants(proc.pid)
    assert len(workers) >= 2
    os.kill(proc.pid, sig)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if alive(p)], "env workers outlived the learner"
    payload = torch.load(ckpt, weights_only=True)
    assert payload["format"] == "fwrl-checkpoint-v1"
    if sig == signal.SIGTERM:  # a clean stop finishes its writes; SIGKILL may cut one (cleaned on resume)
        assert not [p for p in ckpt.parent.iterdir() if p.name.endswith(".tmp")], "half-written files left"
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM  # 143, the shell's convention
        assert torch.load(ckpt, weights_only=True)["agent_steps"] == steps_column(ckpt.parent)[-1]
    resumed = fwrl_here("train", "--name", "k", "--runs-dir", tmp_path, "--resume",
                        "--total-steps", payload["agent_steps"] + 32)
    assert "stopped by budget" in resumed
    assert torch.load(ckpt, weights_only=True)["agent_steps"] > payload["agent_steps"]
    assert not [p for p in ckpt.parent.iterdir() if p.name.endswith(".tmp")], "half-written files left"


# ------------------------------------------------------------------------ bad input

def _error(*args) -> str:
    """``fwrl ARGS`` in this process (a traceback would raise here): exit status 2; its stderr."""
    code, out, err = run_cli(list(args))
    assert code == 2, (out, err)
    assert "Traceback" not in err
    return err


def test_unknown_env_core_option_errors(tmp_path):
    base = ["train", "--runs-dir", str(tmp_path), "--total-steps", "10"]
    msg = _error(*base, "--env", "atary:Pong")
    assert "'atary'" in msg and all(f in msg for f in ("atari", "dmlab", "gym", "memory", "procgen"))
    assert "Pong" in _error(*base, "--env", "atari:Pongg")
    msg = _error(*base, "--env", "memory:cue_delay", "--core", "lstmm")
    assert "lstm" in msg and "delta_net" in msg
    assert "hidden_size" in _error(*base, "--env", "memory:cue_delay", "--core-opt", "hiden_size=3")
    assert "delay" in _error(*base, "--env", "memory:cue_delay?dealy=3")
    assert "quickstart" in _error(*base, "--preset", "nope")


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "not writable" in _error("train", "--env", "memory:cue_delay", "--runs-dir", str(blocker))


def test_resume_with_incompatible_config_and_corrupt_checkpoint(tmp_path):
    fwrl_here("train", "--env", "memory:cue_delay?delay=1", "--num-workers", "1", "--envs-per-worker", "2",
              "--batch-size", "2", "--unroll-length", "4", "--total-steps", "16", "--name", "r", "--runs-dir", tmp_path)
    msg = _error("train", "--name", "r", "--runs-dir", str(tmp_path), "--resume", "--core", "delta_net")
    assert "core" in msg and "lstm" in msg
    assert "already holds a run" in _error("train", "--env", "memory:cue_delay", "--name", "r",
                                          "--runs-dir", str(tmp_path))
    ckpt = tmp_path / "r" / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    assert "not a readable fwrl checkpoint" in _error("train", "--name", "r", "--runs-dir", str(tmp_path), "--resume")
    torch.save({"weights": torch.zeros(2)}, ckpt)
    assert "not an fwrl checkpoint" in _error("train", "--name", "r", "--runs-dir", str(tmp_path), "--resume")


def test_missing_optional_dependency_names_extra(tmp_path):
    code = ("import sys; sys.modules['ale_py'] = None; from fwrl.launch.cli import main; "
            f"sys.exit(main(['train', '--env', 'atari:Pong', '--runs-dir', {str(tmp_path)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and ".[atari]" in proc.stderr and "Traceback" not in proc.stderr
