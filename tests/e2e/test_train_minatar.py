"""``fwrl train`` on a MinAtar game through the command line, on each env-worker backend (the
games themselves: tests/unit/test_envs_minatar.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("minatar", reason="needs MinAtar (pip install 'fwrl[minatar]')")


def test_train_through_the_cli(backend, tmp_path):
    ray = ["--backend", "ray", "--ray-address", backend.ray_address] if backend.name == "ray" else []
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    train = subprocess.run(
        [sys.executable, "-m", "fwrl.launch.cli", "train", "--env", "minatar:breakout", "--core", "lstm",
         "--core-opt", "hidden_size=16", "--num-workers", "2", "--envs-per-worker", "2", "--batch-size", "2",
         "--unroll-length", "10", "--total-steps", "400", "--device", "cpu", "--num-threads", "1",
         "--runs-dir", str(tmp_path), "--name", "mb", *ray],
        capture_output=True, text=True, env=env, timeout=300)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    assert "stopped by budget" in train.stdout
