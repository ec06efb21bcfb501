"""``fwrl sweep``: grids, the local / ray / slurm executors, resuming, failures, bad input.

The sweeps are of tiny runs (memory tasks, one env worker, a few hundred agent
steps), so a cell takes seconds, most of it process start-up. The sweep command
runs in a subprocess (``python -m fwrl.launch.cli sweep``) where a signal is sent
to it or it starts a Ray of its own, else through fwrl's main in the test's process
(``cli``: no interpreter and torch start-up); its cells are processes either way.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fwrl.launch.cli import build_parser, main
from fwrl.launch.sweep.arguments import grid_from_args
from fwrl.launch.sweep.grid import expand
from fwrl.launch.sweep.options import SweepConfig
from fwrl.launch.sweep.plan import load_sweep, write_sweep
from fwrl.launch.sweep.slurm import array_ranges
from fwrl.launch.sweep.status import read_status, write_status

TINY = ["--core-opt", "hidden_size=8", "--num-workers", "1", "--envs-per-worker", "1", "--batch-size", "2",
        "--unroll-length", "5", "--total-steps", "200", "--log-interval", "0.5", "--checkpoint-interval", "1"]
ENVS = ["memory:cue_delay?delay=2", "memory:copy?length=2&delay=1"]
FAILING_WRAPPER = '''
import multiprocessing


def in_workers_only(env):
    """Lets the learner describe the env, then fails in every env worker: a run that fails at run time."""
    if multiprocessing.current_process().name != "MainProcess":
        raise RuntimeError("failwrap: this env cannot start in a worker")
    return env
'''


def sweep(cwd: Path, *args: str, env: dict | None = None, timeout: float = 400) -> subprocess.CompletedProcess:
    """``fwrl sweep ARGS`` in a subprocess (cwd: a test folder, so nothing there shadows a module)."""
    return subprocess.run([sys.executable, "-m", "fwrl.launch.cli", "sweep", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def states(folder: Path) -> dict[str, str]:
    return {c.name: (read_status(folder, c.name) or {"state": "pending"})["state"] for c in load_sweep(folder).cells}


def commands_in_log(folder: Path, cell: str) -> list[str]:
    path = folder / "logs" / f"{cell}.log"
    return [line.split("$ ", 1)[1] for line in path.read_text().splitlines() if "] $ " in line] if path.exists() else []


def _logged_steps(run: Path) -> int:
    """The agent steps of the last row of a run's metrics.csv (0 before it has one)."""
    from cli_runs import metrics_rows

    try:
        rows = metrics_rows(run)
    except FileNotFoundError:
        return 0
    return int(rows[-1]["agent_steps"] or 0) if rows else 0


def grid_of(*argv: str):
    args = build_parser().parse_args(["sweep", "unused", *argv])
    from fwrl.launch.flags import given_settings

    return grid_from_args(args, SweepConfig.parse(given_settings(args, SweepConfig)))


# ----------------------------------------------------------------------------- grids

def test_grid_file_axes_bundles_and_common_core_options(tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({
        "env": ENVS,
        "core": ["lstm", {"label": "elstm-rtrl", "core": "elstm", "elstm_grad": "rtrl", "unroll_length": 7},
                 "feedforward"],
        "seed": [1, 2],
        "total_steps": 1000,
        "core_options": {"hidden_size": 8},
    }, sort_keys=False))  # axes in the file's order
    cells = expand(grid_of("--grid", str(grid_file), "--batch-size", "4"))
    assert len(cells) == 2 * 3 * 2
    by_name = {c.name: c for c in cells}
    elstm = by_name["memory-cue_delay-delay=2__elstm-rtrl__seed-2"].config
    assert (elstm.core, elstm.core_options["grad"], elstm.core_options["hidden_size"], elstm.unroll_length,
            elstm.seed, elstm.total_steps, elstm.batch_size) == ("elstm", "rtrl", 8, 7, 2, 1000, 4)
    lstm = by_name["memory-copy-length=2-delay=1__lstm__seed-1"].config
    assert lstm.core_options == {"hidden_size": 8} and lstm.unroll_length == 50 and lstm.env == ENVS[1]
    assert by_name["memory-copy-length=2-delay=1__feedforward__seed-1"].config.core_options == {}  # no hidden_size
    # a flag with several values replaces the file's axis; with one value it replaces it by a common setting
    cells = expand(grid_of("--grid", str(grid_file), "--core", "lstm", "rdn", "--seed", "3"))
    assert [c.name for c in cells] == ["memory-cue_delay-delay=2__lstm", "memory-cue_delay-delay=2__rdn",
                                       "memory-copy-length=2-delay=1__lstm", "memory-copy-length=2-delay=1__rdn"]
    assert {c.config.seed for c in cells} == {3}


def test_core_options_axis_and_preset_options_dropped_for_another_core(tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text("core_options: [{hidden_size: 8}, {label: wide, hidden_size: 16}]\n")
    cells = expand(grid_of("--grid", str(grid_file), "--preset", "quickstart", "--core", "lstm", "rdn"))
    names = {c.name: c.config for c in cells}
    assert set(names) == {"hidden_size-8__lstm", "hidden_size-8__rdn", "wide__lstm", "wide__rdn"}
    assert names["wide__lstm"].core_options["hidden_size"] == 16
    assert names["hidden_size-8__lstm"].core_options.get("forget_bias") == 1.0  # the quickstart preset's
    assert "forget_bias" not in names["hidden_size-8__rdn"].core_options  # dropped with the preset's core


def test_array_ranges():
    assert array_ranges([7, 0, 2, 3, 4]) == "0,2-4,7"
    assert array_ranges([5]) == "5"


# ----------------------------------------------------------------------------- local executor

def test_local_sweep_finishes_then_starts_nothing_then_resumes_only_what_is_left(tmp_path):
    folder = tmp_path / "sw"
    args = [str(folder), "--env", ENVS[0], "--core", "lstm", "feedforward", "--seed", "1", "2", "--parallel", "2",
            *TINY]
    code, _, err = cli("sweep", *args)
    assert code == 0, err[-3000:]
    cells = load_sweep(folder).cells
    assert len(cells) == 4 and set(states(folder).values()) == {"done"}
    for cell in cells:
        run = folder / "runs" / cell.name
        assert (run / "checkpoint.pt").is_file() and (run / "metrics.csv").is_file()
        assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == cell.config.seed
    assert "ETA" in err and "4 done" in err

    before = {p.name: p.stat().st_mtime_ns for p in (folder / "status").glob("*.json")}
    logs = {p.name: p.read_text() for p in (folder / "logs").glob("*.log")}
    code, _, err = cli("sweep", *args)
    assert code == 0, err
    assert "nothing to start: 4 of 4 cells done" in err
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "status").glob("*.json")} == before
    assert {p.name: p.read_text() for p in (folder / "logs").glob("*.log")} == logs  # no run started

    # an interrupted sweep: one cell never started (no status, no run), one left 'running' by a runner that died
    gone, stale = cells[1].name, cells[3].name
    (folder / "status" / f"{gone}.json").unlink()
    shutil.rmtree(folder / "runs" / gone)
    write_status(folder, stale, state="running", pid=999_999_999)
    code, _, err = cli("sweep", *args)
    assert code == 0, err[-3000:]
    assert "2 of 4 cells to run" in err
    assert set(states(folder).values()) == {"done"}
    assert (folder / "runs" / gone / "checkpoint.pt").is_file()
    assert commands_in_log(folder, gone)[-1].split(" train ")[1].startswith("--config")  # trained afresh
    assert len(commands_in_log(folder, stale)) == 1  # its run had reached the budget: not trained again
    for name, mtime in before.items():
        if name not in (f"{gone}.json", f"{stale}.json"):
            assert (folder / "status" / name).stat().st_mtime_ns == mtime, name


def test_ctrl_c_stops_the_running_cell_with_a_checkpoint_and_a_rerun_resumes_it(tmp_path):
    """Ctrl-C (SIGINT) to the sweep reaches the running cell as SIGINT, which its status names."""
    folder = tmp_path / "sw"
    args = [str(folder), "--env", ENVS[0], "--core", "lstm", "--seed", "1", "2", *TINY, "--total-steps", "1000000"]
    proc = subprocess.Popen([sys.executable, "-m", "fwrl.launch.cli", "sweep", *args, "--parallel", "1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = folder / "runs" / "seed-1"
    try:
        deadline = time.monotonic() + 120
        # trained (a metrics row past 0 steps: what the status counts) and checkpointed
        while not ((first / "checkpoint.pt").exists() and _logged_steps(first) > 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (first / "checkpoint.pt").exists(), "the first cell wrote no checkpoint"
        assert _logged_steps(first) > 0, "the first cell logged no trained steps"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    status = read_status(folder, "seed-1")
    assert status["state"] == "interrupted" and status["exit_code"] == 130 and status["agent_steps"] > 0
    assert status["message"] == "stopped by SIGINT"
    assert read_status(folder, "seed-2") is None  # never started
    assert "run the same command again to resume" in out

    # the rerun resumes seed-1 from its checkpoint; a session limit (a resource setting) keeps it short. Both
    # cells at once (--parallel, not a setting of theirs), each with room for updates after its start-up (which
    # counts in the limit) on a loaded machine; in this process (cli): no interpreter and torch start-up
    steps_before = status["agent_steps"]
    code, _, err = cli("sweep", *args, "--parallel", "2", "--max-seconds", "15")
    assert code == 75, err[-3000:]  # stopped by the time limit: not finished
    resumed = commands_in_log(folder, "seed-1")[-1]
    assert "--resume" in resumed and "--max-seconds 15.0" in resumed
    status = read_status(folder, "seed-1")
    assert status["state"] == "interrupted" and "time limit" in status["message"]
    assert status["agent_steps"] > steps_before
    assert read_status(folder, "seed-2")["state"] == "interrupted"


def test_a_failing_cell_is_reported_with_its_log_and_the_others_finish(tmp_path, monkeypatch):
    (tmp_path / "failwrap.py").write_text(FAILING_WRAPPER)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"env_wrappers": [[], ["failwrap:in_workers_only"]]}))
    folder = tmp_path / "sw"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the cells'
    monkeypatch.syspath_prepend(str(tmp_path))  # the sweep's, which checks the wrappers before any cell starts
    monkeypatch.delitem(sys.modules, "failwrap", raising=False)  # forgotten after the test
    code, _, err = cli("sweep", str(folder), "--grid", str(grid), "--env", ENVS[0], "--core", "lstm", "--parallel",
                       "2", *TINY)
    assert code == 1, err[-3000:]
    assert states(folder) == {"env_wrappers-none": "done", "env_wrappers-in_workers_only": "failed"}
    status = read_status(folder, "env_wrappers-in_workers_only")
    log = folder / "logs" / "env_wrappers-in_workers_only.log"
    assert status["exit_code"] == 2 and Path(status["log"]) == log.resolve()
    assert "failed 5 times in a row" in status["message"] and "failwrap" in log.read_text()
    assert "FAILED   env_wrappers-in_workers_only" in err and str(log.resolve()) in err
    code, out, _ = cli("sweep", str(folder), "--status")
    assert code == 1 and "2 cells: 1 done, 0 running, 1 failed, 0 pending" in out


# ----------------------------------------------------------------------------- slurm executor

def _slurm_sweep(tmp_path: Path) -> tuple[Path, list[str]]:
    folder = tmp_path / "sw"
    args = [str(folder), "--env", ENVS[0], "--core", "lstm", "feedforward", "--seed", "1", "2", *TINY]
    cells = expand(grid_of(*args[1:]))
    write_sweep(folder, None, cells)
    for i in (0, 2):  # two cells finished (and evaluated with 3 episodes)
        write_status(folder, cells[i].name, state="done", exit_code=0, evaluated=True, eval_episodes=3)
    return folder, args


def test_slurm_dry_run_prints_the_array_of_unfinished_cells(tmp_path):
    folder, args = _slurm_sweep(tmp_path)
    code, out, err = cli("sweep", *args, "--executor", "slurm", "--dry-run", "--evaluate", "--eval-episodes", "3",
                         "--parallel", "2", "--sbatch-opt", "partition=gpu", "--sbatch-opt", "time=1:00:00",
                         "--cell-gpus", "1")
    assert code == 0, err
    lines = out.splitlines()
    root = folder.resolve()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --array=1,3%2" in lines
    assert f"#SBATCH --output={root}/logs/slurm-%A_%a.out" in lines
    assert "#SBATCH --cpus-per-task=2" in lines and "#SBATCH --gres=gpu:1" in lines
    assert "#SBATCH --partition=gpu" in lines and "#SBATCH --time=1:00:00" in lines
    assert "#SBATCH --signal=B:TERM@300" in lines
    names = [c.name for c in load_sweep(folder).cells]
    start = lines.index("CELLS=(")
    assert [line.strip() for line in lines[start + 1:start + 1 + len(names)]] == names
    from fwrl.utils import run_module

    assert lines[-1] == (f'exec {sys.executable} {run_module.__file__} fwrl.launch.sweep.cell {root} "$CELL" '
                         "--evaluate --eval-episodes 3 --eval-workers 2")
    assert {p.name for p in (folder / "status").glob("*.json")} == {f"{names[0]}.json", f"{names[2]}.json"}


def test_slurm_submission_with_a_stand_in_sbatch_and_one_array_task_run_here(tmp_path, monkeypatch):
    folder, args = _slurm_sweep(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/sbatch-args\necho "4242;cluster"\n')
    (bin_dir / "squeue").write_text("#!/bin/sh\necho 3\n")  # task 3 still queued, task 1 gone
    for tool in ("sbatch", "squeue"):
        (bin_dir / tool).chmod(0o755)
    plain_path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{plain_path}")
    code, _, err = cli("sweep", *args, "--executor", "slurm")
    assert code == 0, err
    assert "submitted SLURM job array 4242 with 2 cells" in err
    jobs = json.loads((folder / "slurm" / "jobs.json").read_text())
    names = [c.name for c in load_sweep(folder).cells]
    assert jobs[0]["job_id"] == "4242" and jobs[0]["cells"] == [names[1], names[3]]
    script = Path(jobs[0]["script"])
    assert (tmp_path / "sbatch-args").read_text().split() == ["--parsable", str(script)]
    assert read_status(folder, names[1])["state"] == "queued" and read_status(folder, names[1])["job_id"] == "4242"
    # squeue still lists task 3: only cell 1 is submitted again
    code, out, err = cli("sweep", *args, "--executor", "slurm", "--dry-run")
    assert code == 0 and "#SBATCH --array=1" in out.splitlines(), err
    # one array task, as SLURM would start it
    task = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": plain_path, "SLURM_ARRAY_TASK_ID": "1",
                               "SLURM_ARRAY_JOB_ID": "4242"})
    assert task.returncode == 0, task.stderr[-2000:]
    status = read_status(folder, names[1])
    assert status["state"] == "done" and status["job_id"] == "4242"
    assert (folder / "runs" / names[1] / "checkpoint.pt").is_file()


def _slurm_cluster() -> str:
    """Why no SLURM cluster can take a job here ('' where one can)."""
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (no SLURM here)"
    try:
        ping = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo does not answer ({exc})"
    return "" if ping.returncode == 0 else f"no SLURM cluster answers here (sinfo: {ping.stderr.strip()[:120]})"


def test_slurm_submission_to_a_real_cluster(tmp_path):
    reason = _slurm_cluster()
    if reason:
        pytest.skip(reason)
    folder, args = _slurm_sweep(tmp_path)
    result = sweep(tmp_path, *args, "--executor", "slurm")
    assert result.returncode == 0, result.stderr
    job = json.loads((folder / "slurm" / "jobs.json").read_text())[-1]["job_id"]
    subprocess.run(["scancel", job], check=False)


# ----------------------------------------------------------------------------- ray executor

@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'fwrl[ray]')")
def test_ray_executor_runs_and_evaluates_a_tiny_sweep_on_a_local_ray(tmp_path):
    folder = tmp_path / "sw"
    result = sweep(tmp_path, str(folder), "--executor", "ray", "--ray-address", "local", "--evaluate",
                   "--eval-episodes", "2", "--env", ENVS[0], "--core", "lstm", "feedforward", *TINY,
                   env={"RAY_USAGE_STATS_ENABLED": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(states(folder).values()) == {"done"}
    for cell in load_sweep(folder).cells:
        evaluation = json.loads((folder / "runs" / cell.name / "evaluation.json").read_text())
        assert evaluation["episodes"] == 2
        assert read_status(folder, cell.name)["evaluated"] is True


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv, names", [
    (["--executor", "kubernetes", "--core", "lstm"], ["'kubernetes'", "local, ray, slurm"]),
    (["--core", "lstm", "lstmm"], ["'lstmm'", "delta_net", "lstm"]),
    (["--batch-size", "8", "0"], ["batch_size=0", "an integer with x >= 1"]),
    (["--core", "lstm", "--core-opt", "hiden_size=8"], ["'hiden_size'", "hidden_size"]),
    (["--core", "lstm", "--eval-episodes", "3"], ["--eval-episodes 3", "--evaluate"]),
    (["--core", "lstm", "--sbatch-opt", "time=1"], ["--sbatch-opt", "--executor slurm"]),
])
def test_bad_flags_are_one_line_errors_and_create_nothing(tmp_path, argv, names):
    folder = tmp_path / "sw"
    code, out, err = cli("sweep", str(folder), *argv)
    assert code == 2 and err.startswith("fwrl: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert not folder.exists()


@pytest.mark.parametrize("text, names", [
    ("cores: [lstm, rdn]\n", ["'cores'", "core", "seed"]),
    ("core: [lstm, {label: x, cor: rdn}]\n", ["'cor'", "core"]),
    ("seed: []\n", ["axis 'seed'", "empty"]),
    ("discount: [0.9, 1.5]\n", ["discount=1.5", "0 <= x <= 1"]),
    ("core: [lstm, {label: lstm, core: rdn}]\n", ["two items labelled 'lstm'"]),
    ("[1, 2]\n", ["not a mapping"]),
])
def test_bad_grid_files_are_one_line_errors(tmp_path, text, names):
    grid = tmp_path / "grid.yaml"
    grid.write_text(text)
    code, out, err = cli("sweep", str(tmp_path / "sw"), "--grid", str(grid))
    assert code == 2 and err.startswith("fwrl: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert not (tmp_path / "sw").exists()


def test_a_changed_grid_is_refused_and_a_grown_one_adds_cells(tmp_path):
    folder = tmp_path / "sw"
    base = [str(folder), "--env", ENVS[0], "--core", "lstm", "rdn", *TINY]
    write_sweep(folder, None, expand(grid_of(*base[1:])))
    code, _, err = cli("sweep", *base, "--total-steps", "300", "--dry-run")
    assert code == 2 and "changes setting total_steps of cell 'lstm' from 200 to 300" in err
    code, _, err = cli("sweep", str(folder), "--env", ENVS[0], "--core", "lstm", "feedforward", *TINY, "--dry-run")
    assert code == 2 and "the grid has no cell 'rdn'" in err
    code, out, err = cli("sweep", str(folder), "--env", ENVS[0], "--core", "lstm", "rdn", "feedforward", *TINY,
                         "--num-workers", "2", "--dry-run")  # a new cell, and a resource change: allowed
    assert code == 0, err
    assert "3 of 3 cells would run" in out and "feedforward" in out
    code, _, err = cli("sweep", str(tmp_path / "none"))
    assert code == 2 and "no grid was given" in err


def test_the_sweep_folder_alone_evaluates_as_the_sweep_was_started(tmp_path):
    """``fwrl sweep SWEEP`` alone (README: it reuses the stored grid) keeps the sweep's --evaluate and
    --eval-episodes: a cell trained but not yet evaluated (the sweep was stopped in between) is evaluated,
    with the recorded episodes; --no-evaluate and --eval-episodes change what is recorded."""
    folder = tmp_path / "sw"
    grid = ["--env", ENVS[0], "--core", "lstm", "feedforward", *TINY]
    cells = expand(grid_of(*grid))
    write_sweep(folder, None, cells)
    for cell in cells:  # trained and evaluated with 3 episodes
        write_status(folder, cell.name, state="done", evaluated=True, eval_episodes=3)
    code, _, err = cli("sweep", str(folder), *grid, "--evaluate", "--eval-episodes", "3")
    assert code == 0 and "nothing to start: 2 of 2 cells done" in err, err
    assert yaml.safe_load((folder / "sweep.yaml").read_text())["evaluation"] == {"evaluate": True, "eval_episodes": 3}
    write_status(folder, cells[1].name, state="done", evaluated=False, eval_episodes=None)  # stopped before evaluating
    code, out, err = cli("sweep", str(folder), "--dry-run")
    assert code == 0, err
    assert "1 of 2 cells would run (local), each evaluated (3 episodes per task and split)" in out, out
    assert f"to evaluate {cells[1].name}" in " ".join(out.split()), out
    assert "as the sweep was started" in err and "--no-evaluate" in err
    code, out, err = cli("sweep", str(folder), *grid, "--dry-run")  # the grid again, without the flags: the same
    assert code == 0 and "1 of 2 cells would run" in out, out
    code, out, err = cli("sweep", str(folder), "--eval-episodes", "5", "--dry-run")  # all to evaluate again, with 5
    assert code == 0 and "2 of 2 cells would run (local), each evaluated (5 episodes" in out, (out, err)
    code, out, err = cli("sweep", str(folder), "--no-evaluate", "--dry-run")
    assert code == 0 and "0 of 2 cells would run" in out, (out, err)
    code, out, err = cli("sweep", str(folder), "--no-evaluate")  # recorded: the next plain run evaluates nothing
    assert code == 0, err
    code, out, err = cli("sweep", str(folder), "--dry-run")
    assert code == 0 and "0 of 2 cells would run" in out, (out, err)
    code, _, err = cli("sweep", str(folder), "--eval-episodes", "3", "--dry-run")
    assert code == 2 and "--eval-episodes 3 sets the episodes of --evaluate" in err


def test_a_finished_sweep_says_what_next_and_the_extra_it_needs(monkeypatch):
    """The closing hint names fwrl report, and the report extra where rliable is not installed."""
    import importlib.util

    from fwrl.launch.sweep.command import next_step

    real = importlib.util.find_spec
    assert next_step("sw").startswith("next: fwrl report sw")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rliable" else real(name, *a))
    assert next_step("sw").endswith("it needs the report extra: pip install -e '.[report]'")


def test_each_cell_takes_the_presets_settings_for_its_core_under_the_grids(tmp_path):
    grid_file = tmp_path / "grid.yaml"
    grid_file.write_text("core: [gru, srwm, {label: srwm-fast, core: srwm, learning_rate: 0.002}]\n")
    cells = {c.name: c.config for c in expand(grid_of("--grid", str(grid_file), "--preset", "popgym"))}
    assert (cells["gru"].learning_rate, cells["srwm"].learning_rate, cells["srwm-fast"].learning_rate) == (
        0.004, 0.001, 0.002)
