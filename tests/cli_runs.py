"""Runs of the fwrl command line, in a subprocess for the tests that need a whole process (signals,
several learner ranks, exit codes) or in the test's own (``run_cli``), their metrics and refusals
(``assert_refused``), and what they read: an agent's checkpoint, a sweep folder."""

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


def assert_refused(code: int, err: str, *needles: str, one_line: bool = False) -> None:
    """An input refused as the command line refuses one: exit status 2, an ``fwrl: error:`` message
    (with ``one_line``, a single line) naming each needle, no traceback."""
    assert code == 2, err
    assert err.startswith("fwrl: error:"), err
    assert "Traceback" not in err, err
    if one_line:
        assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def write_memory_checkpoint(folder: Path) -> Path:
    """A fresh agent's ``checkpoint.pt`` in ``folder`` for ``memory:cue_delay`` (no training: evaluate
    and resume only read it)."""
    import torch

    from fwrl.agents.checkpoint import save_checkpoint
    from fwrl.envs.registry import describe_env
    from fwrl.runner.agent import build_model
    from fwrl.settings.config import TrainConfig

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "core": "lstm", "core_options": {"hidden_size": 16}})
    info = describe_env(config.env)
    model = build_model(config, info)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "checkpoint.pt"
    save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, agent_steps=0, updates=0,
                    config=config.to_dict(), env_info=info.to_dict())
    return path


def tiny_sweep(folder: Path, *argv: str):
    """A sweep folder of ``argv``'s grid as ``fwrl sweep FOLDER ARGV`` writes it (nothing run); returns
    the Sweep."""
    from fwrl.launch.cli import build_parser
    from fwrl.launch.flags import given_settings
    from fwrl.launch.sweep.arguments import grid_from_args
    from fwrl.launch.sweep.grid import expand
    from fwrl.launch.sweep.options import SweepConfig
    from fwrl.launch.sweep.plan import write_sweep

    args = build_parser().parse_args(["sweep", str(folder), *argv])
    grid = grid_from_args(args, SweepConfig.parse(given_settings(args, SweepConfig)))
    return write_sweep(folder, grid, expand(grid))
