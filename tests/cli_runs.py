"""Runs of the fwrl command line in a subprocess, and their metrics, for the tests that need a
whole process (signals, several learner ranks, exit codes)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "fwrl.launch.cli"]


def train_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``fwrl train ARGS`` in a subprocess, its output captured."""
    return subprocess.run([*CLI, "train", *args], capture_output=True, text=True, timeout=timeout)


def metrics_rows(run: Path) -> list[dict]:
    """The rows of a run folder's ``metrics.csv``."""
    with (Path(run) / "metrics.csv").open() as f:
        return list(csv.DictReader(f))
