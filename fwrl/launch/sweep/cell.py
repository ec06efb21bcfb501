"""The per-cell entry point every executor runs: ``python -m fwrl.launch.sweep.cell SWEEP CELL`` (through
:mod:`fwrl.utils.run_module`, so that a clone of fwrl in the current folder is not imported instead).

It trains the cell (``fwrl train``, with ``--resume`` where the run folder has a
checkpoint), evaluates it where asked (``fwrl evaluate``), and keeps the cell's
status file current (``fwrl.launch.sweep.status``), all output appended to
``SWEEP/logs/CELL.log``. A cell already done exits at once; a run that reached
its budget is not trained again (only evaluated, if that is still missing).

Signals: SIGTERM, SIGINT and SIGHUP go on to the running command (fwrl train
writes a checkpoint and exits 128 + the signal); the cell is then
``interrupted`` and this exits 128 + the signal. With ``--stop-with-parent``
(the local and ray executors) the cell stops the same way when the process
that started it dies, so no orphaned run goes on.

Exit status: 0 done; 1 failed; 75 stopped early by a time limit
(``max_seconds``, resumable), or another runner holds the cell; 128 + N after signal N.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from fwrl.envs.spec import parse_env_spec
from fwrl.errors import FwrlError
from fwrl.launch.sweep.status import CellLock, evaluation_done, log_path, now_iso, read_status, write_status
from fwrl.utils.run_module import module_command

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
EXIT_LATER = 75  # EX_TEMPFAIL: not finished, run the cell again later
CLI = module_command("fwrl.launch.cli")  # python -m fwrl.launch.cli, with this fwrl whatever the folder holds


def cell_command(sweep_dir: Path, cell: str, evaluate: bool, eval_episodes: int | None,
                 eval_workers: int | None = None, stop_with_parent: bool = False) -> list[str]:
    """The command line that runs one cell (what the executors start)."""
    cmd = module_command("fwrl.launch.sweep.cell", str(sweep_dir), cell)
    if evaluate:
        cmd.append("--evaluate")
        if eval_episodes is not None:
            cmd += ["--eval-episodes", str(eval_episodes)]
        if eval_workers:
            cmd += ["--eval-workers", str(eval_workers)]
    if stop_with_parent:
        cmd.append("--stop-with-parent")
    return cmd


def trained_steps(run_dir: Path) -> int:
    """The agent steps of the run's last metrics row (0 without a metrics.csv or a checkpoint)."""
    if not (run_dir / "checkpoint.pt").is_file():
        return 0
    from fwrl.launch.plot import read_metrics, series

    try:
        steps, _ = series(read_metrics(run_dir), "agent_steps")
    except FwrlError:
        return 0
    return int(max(steps, default=0))


def resume_flags(saved: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """Flags for the resource settings the sweep changed since the run started (``fwrl train --resume`` takes
    them): ``saved`` is the run's config.yaml, ``wanted`` the cell's config now."""
    from fwrl.launch.flags import flag_name
    from fwrl.launch.sweep.plan import RESOURCE_CHANGES

    flags = []
    for key in sorted(RESOURCE_CHANGES):
        if key not in wanted or saved.get(key) == wanted[key]:
            continue
        value = wanted[key]
        if isinstance(value, bool):
            flags.append(flag_name(key) if value else "--no-" + flag_name(key)[2:])
        else:
            flags += [flag_name(key), str(value)]
    return flags


class Runner:
    """Runs the commands of one cell, passing a stop signal on to the one that runs."""

    def __init__(self, log, stop_with_parent: bool):
        self.log = log
        self.child: subprocess.Popen | None = None
        self.forward: int | None = None  # the signal the running command gets on a stop (None: the one that came)
        self.signal = 0
        self.parent = os.getppid() if stop_with_parent else None
        for s in STOP_SIGNALS:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.signal:
            return
        self.signal = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(self.forward or signum)

    def run(self, cmd: list[str], forward: int | None = None) -> int:
        """Run ``cmd`` (output to the log) to its end; on a stop it gets ``forward`` (default: the signal
        that came). Not started once a stop came: returns 128 + that signal."""
        if self.signal:
            return 128 + self.signal
        self.log.write(f"[{now_iso()}] $ {' '.join(cmd)}\n")
        self.log.flush()
        self.forward = forward
        self.child = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if self.signal:  # it came while the command started
            self.child.send_signal(forward or self.signal)
        while True:
            try:
                code = self.child.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            if self.parent is not None and os.getppid() != self.parent and not self.signal:
                self.log.write(f"[{now_iso()}] the process that started this cell is gone: stopping it\n")
                self._on_signal(signal.SIGTERM, None)
        self.child = None
        self.log.write(f"[{now_iso()}] exit status {code}\n")
        self.log.flush()
        return code


def last_line(path: Path, limit: int = 400) -> str:
    """The last line of the log that is not one of the runner's own (the error, usually)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 20000))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        line = line.strip()
        if line and not line.startswith("[20"):
            return line[:limit]
    return ""


def run_cell(sweep_dir: Path, name: str, evaluate: bool = False, eval_episodes: int | None = None,
             eval_workers: int | None = None, stop_with_parent: bool = False) -> int:
    """Train (and evaluate) one cell of the sweep in ``sweep_dir``; returns the exit status (module docstring)."""
    from fwrl.launch.sweep.plan import cell_settings

    sweep_dir = Path(sweep_dir).resolve()
    settings = cell_settings(sweep_dir, name)
    total_steps = int(settings.get("total_steps", 0))
    status = read_status(sweep_dir, name)
    if status and status["state"] == "done" and (not evaluate or evaluation_done(status, eval_episodes)):
        return 0
    lock = CellLock(sweep_dir, name)
    if not lock.acquire():
        print(f"cell {name} is running in another process; nothing to do here", file=sys.stderr)
        return EXIT_LATER
    log_file = log_path(sweep_dir, name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    run_dir, config_file = sweep_dir / "runs" / name, sweep_dir / "configs" / f"{name}.yaml"
    started = time.time()
    attempt = int((status or {}).get("attempt", 0)) + 1
    with log_file.open("a") as log:
        log.write(f"\n[{now_iso()}] fwrl sweep: cell {name}, attempt {attempt}, on {os.uname().nodename}\n")
        log.flush()
        runner = Runner(log, stop_with_parent)
        base = dict(state="running", attempt=attempt, started=now_iso(), ended=None, seconds=None, exit_code=None,
                    log=str(log_file), pid=os.getpid(), message="", job_id=os.environ.get("SLURM_ARRAY_JOB_ID"),
                    total_steps=total_steps)
        if not (status and status["state"] == "done"):
            base.update(evaluated=False, eval_episodes=None)
        write_status(sweep_dir, name, phase="train", **base)

        def finish(state: str, code: int, phase: str, message: str = "") -> int:
            """Write the cell's end; the runner's exit status (module docstring) for it."""
            write_status(sweep_dir, name, state=state, exit_code=code, phase=phase, ended=now_iso(),
                         seconds=round(time.time() - started, 1), message=message,
                         agent_steps=trained_steps(run_dir))
            log.write(f"[{now_iso()}] fwrl sweep: cell {name} {state}{f' ({message})' if message else ''}\n")
            return {"done": 0, "failed": 1}.get(state, code)

        def stopped_by() -> str:
            return f"stopped by {signal.Signals(runner.signal).name}"

        steps = trained_steps(run_dir)
        if steps < total_steps:
            if (run_dir / "checkpoint.pt").is_file():
                saved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
                cmd = CLI + ["train", "--runs-dir", str(sweep_dir / "runs"), "--name", name, "--resume",
                             *resume_flags(saved, settings)]
            else:
                _clear_failed_start(run_dir, log)
                cmd = CLI + ["train", "--config", str(config_file), "--runs-dir", str(sweep_dir / "runs"),
                             "--name", name]
            code = runner.run(cmd)
            if runner.signal:
                return finish("interrupted", 128 + runner.signal, "train", stopped_by())
            if code != 0:
                return finish("failed", code, "train", last_line(log_file))
            steps = trained_steps(run_dir)
            if steps < total_steps:
                finish("interrupted", code, "train", f"stopped at {steps:,} of {total_steps:,} agent steps "
                       "(time limit)")
                return EXIT_LATER
        if evaluate:
            cmd = CLI + ["evaluate", str(run_dir)]
            if eval_episodes is not None:
                cmd += ["--episodes", str(eval_episodes)]
            if eval_workers:
                tasks = parse_env_spec(str(settings.get("env", ""))).num_tasks if settings.get("env") else 1
                cmd += ["--num-workers", str(tasks * max(1, eval_workers // tasks))]  # a multiple of the games
            code = runner.run(cmd, forward=signal.SIGINT)  # fwrl evaluate stops its workers on Ctrl-C
            if runner.signal:
                return finish("interrupted", 128 + runner.signal, "evaluate", stopped_by())
            if code != 0:
                return finish("failed", code, "evaluate", last_line(log_file))
            write_status(sweep_dir, name, evaluated=True, eval_episodes=eval_episodes)
        return finish("done", 0, "evaluate" if evaluate else "train")


def _clear_failed_start(run_dir: Path, log) -> None:
    """A run folder without a checkpoint is an attempt that failed before its first update: its metrics
    and events would mix with the new attempt's, so they go (its output stays in the log)."""
    leftovers = [p for p in (run_dir / "metrics.csv", run_dir / "tensorboard", run_dir / "config.yaml") if p.exists()]
    for path in leftovers:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if leftovers:
        log.write(f"[{now_iso()}] removed {', '.join(p.name for p in leftovers)} of an earlier attempt that "
                  "left no checkpoint\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fwrl.launch.sweep.cell", allow_abbrev=False,
                                     description="Train (and evaluate) one cell of an fwrl sweep.")
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("cell")
    parser.add_argument("--evaluate", action="store_true")
    parser.add_argument("--eval-episodes", type=int)
    parser.add_argument("--eval-workers", type=int)
    parser.add_argument("--stop-with-parent", action="store_true")
    args = parser.parse_args(argv)
    try:
        return run_cell(args.sweep_dir, args.cell, args.evaluate, args.eval_episodes, args.eval_workers,
                        args.stop_with_parent)
    except FwrlError as exc:
        print(f"fwrl sweep cell: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
