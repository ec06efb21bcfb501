"""Runs of the fwrl command line, in a subprocess for the tests that need a whole process (signals,
several learner ranks, exit codes) or in the test's own (``run_cli``), and their metrics."""

from __future__ import annotations

import contextlib
import csv
import io
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "fwrl.launch.cli"]


def train_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``fwrl train ARGS`` in a subprocess, its output captured."""
    return subprocess.run([*CLI, "train", *args], capture_output=True, text=True, timeout=timeout)


def run_cli(argv: list) -> tuple[int, str, str]:
    """``fwrl.launch.cli.main(argv)`` in this process: (exit status, stdout, stderr)."""
    from fwrl.launch.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def metrics_rows(run: Path) -> list[dict]:
    """The rows of a run folder's ``metrics.csv``."""
    with (Path(run) / "metrics.csv").open() as f:
        return list(csv.DictReader(f))
