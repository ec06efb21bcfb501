"""The container and cluster recipes, run for real (docker/smoke.sh), and what they rely on.

- ``FWRL_CONTAINER_SMOKE=1 python -m pytest tests/e2e/test_container_smoke.py`` runs
  docker/smoke.sh (root on Debian; about 30 minutes on 2 cores): the CPU image built from
  a local base, the quickstart in it, a Ray cluster of containers losing a node, a
  one-node SLURM cluster running and cancelling docker/slurm-train.sh, the CUDA image.
  ``FWRL_SMOKE_PARTS`` chooses parts (docker/smoke.sh's header). Off by default: CI's
  run stays within its budget.
- Always: the script is valid bash, and a ``fwrl train --backend ray`` driver stops on
  SIGTERM with its final checkpoint (what ``scancel`` and the Kubernetes / SLURM time
  limits send; ``ray.init`` replaces the driver's SIGTERM handler, fwrl puts its own back).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "docker" / "smoke.sh"


def test_smoke_script_is_executable_valid_bash():
    assert SMOKE.stat().st_mode & 0o111, f"{SMOKE} is not executable"
    subprocess.run(["bash", "-n", str(SMOKE)], check=True)
    text = SMOKE.read_text()
    assert "set -euo pipefail" in text
    # every image is built from the repository's own Dockerfiles, with the base as a build arg
    for dockerfile in ("docker/Dockerfile.cpu", "docker/Dockerfile"):
        assert f"build_image {dockerfile} " in text
    assert '--build-arg BASE="$BASE_IMAGE"' in text
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", "--severity=warning", str(SMOKE), str(ROOT / "docker" / "slurm-train.sh")],
                       check=True)


@pytest.mark.skipif(os.environ.get("FWRL_CONTAINER_SMOKE") != "1",
                    reason="opt-in: FWRL_CONTAINER_SMOKE=1 runs docker/smoke.sh (root, ~30 min)")
def test_container_smoke():
    if os.geteuid() != 0:
        pytest.skip("docker/smoke.sh needs root (apt-get, podman, SLURM daemons)")
    done = subprocess.run([str(SMOKE)], capture_output=True, text=True, timeout=3 * 3600)
    out = done.stdout + done.stderr
    print(out)
    assert done.returncode == 0, out[-6000:]
    assert "SMOKE: PASS" in out
    parts = os.environ.get("FWRL_SMOKE_PARTS", "image ray ray-lost slurm cuda").split()
    for part in parts:
        assert f"PASS  {part}:" in out or f"SKIP  {part}:" in out, f"part {part} did not pass"


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_ray_driver_stops_on_sigterm_with_a_checkpoint(tmp_path):
    import torch

    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "fwrl.launch.cli", "train", "--backend", "ray", "--ray-address", "local",
           "--preset", "quickstart", "--num-workers", "1", "--total-steps", "100000000", "--log-interval", "0.5",
           "--runs-dir", str(tmp_path), "--name", "sigterm"]
    ckpt = tmp_path / "sigterm" / "checkpoint.pt"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 240
        while not ckpt.exists():  # the first checkpoint follows the first update
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no first checkpoint within 240 s"
            time.sleep(0.5)
        first = torch.load(ckpt, weights_only=True)["agent_steps"]
        while _last_logged_steps(tmp_path / "sigterm") <= first:  # an update after that checkpoint: however
            assert proc.poll() is None, proc.stdout.read()[-3000:]  # busy the machine, the stop has news to save
            assert time.monotonic() < deadline + 120, "no update after the first checkpoint within 120 s"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "stopped by signal SIGTERM" in out, out[-3000:]
    assert torch.load(ckpt, weights_only=True)["agent_steps"] > first


def _last_logged_steps(run) -> int:
    """The agent steps of the last row of ``run``'s metrics.csv (0 before the first)."""
    import csv

    try:
        with (run / "metrics.csv").open() as f:
            rows = list(csv.DictReader(f))
    except FileNotFoundError:
        return 0
    return int(rows[-1]["agent_steps"]) if rows and rows[-1].get("agent_steps") else 0


def test_smoke_reads_the_steps_of_fwrl_trains_final_line(tmp_path):
    """docker/smoke.sh compares the steps of ``fwrl train``'s last line with the checkpoint's:
    its parser reads both forms of that line (inside the budget, and past it by part of a batch)."""
    from fwrl.runner.train_progress import steps_text

    parser = next(line for line in SMOKE.read_text().splitlines() if line.startswith("reported_steps()"))
    for steps, total, expected in ((30_400, 300_000, "30400"), (300_160, 300_000, "300160")):
        out = tmp_path / f"job-{steps}.out"
        out.write_text(f"fwrl train: run folder /runs/x\nrun /runs/x: {steps_text(steps, total, 320)}, 95 updates, "
                       "2,560 episodes, mean return 0.95; stopped by signal SIGTERM after 31.9 s; checkpoint "
                       "/runs/x/checkpoint.pt\n")
        got = subprocess.run(["bash", "-c", f'{parser}\nreported_steps "$1"', "bash", str(out)],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert got == expected, (steps_text(steps, total, 320), got)
