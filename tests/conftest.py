"""Shared test settings.

Tiny per-step loops are ~100x slower with two torch threads on a busy 2-core
machine (thread hand-offs dominate), so tests run torch single-threaded.
"""

import os
import sys

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")


@pytest.fixture
def fwrl_cli():
    """Command prefix that runs the fwrl CLI of this checkout in a subprocess."""
    return [sys.executable, "-m", "fwrl.launch.cli"]
