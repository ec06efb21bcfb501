"""What a new user still tripped on (issue 39): each item's behaviour, through the command line.

Everything runs through ``fwrl.launch.cli.main`` (in-process, or in a fresh interpreter where
the import graph is the point) on small envs and tiny agents; nothing trains for long.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]


def assert_refused(code: int, err: str, *needles: str) -> None:
    """One ``fwrl: error:`` paragraph, exit status 2, no traceback, naming each needle."""
    assert code == 2, err
    assert err.startswith("fwrl: error:"), err
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def cli_in_subprocess(argv: list, cwd: Path, heavy: str = "torch") -> tuple[int, str, bool]:
    """``main(argv)`` in a fresh interpreter: (exit status, stderr, whether module ``heavy`` was imported)."""
    script = textwrap.dedent(f"""
        import sys
        from fwrl.launch.cli import main
        code = main({[str(a) for a in argv]!r})
        print("IMPORTED=" + str({heavy!r} in sys.modules))
        sys.exit(code)
    """)
    environ = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr, "IMPORTED=True" in proc.stdout


# ----------------------------------------------------------------------------- 1: a stem that does not fit

@pytest.mark.parametrize("command", ["train", "info", "sweep", "bench"])
def test_a_stem_too_big_for_the_frames_is_refused_naming_the_stems_that_fit(command, tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    monkeypatch.chdir(tmp_path)
    argv = {"train": ["train", "--env", "minatar:breakout", "--stem", "nature", "--runs-dir", "runs"],
            "info": ["info", "--env", "minatar:breakout", "--stem", "nature"],
            "sweep": ["sweep", "sw", "--env", "minatar:breakout", "--stem", "nature"],
            "bench": ["bench", "throughput", "--env", "minatar:breakout", "--stem", "nature"]}[command]
    code, _, err = run_cli(argv)
    assert_refused(code, err, "stem 'nature' does not fit", "minatar:breakout", "at least 36x36",
                   "Stems that fit: impala, minatar")
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_the_stem_before_importing_torch(tmp_path):
    pytest.importorskip("minatar")
    code, err, torch_imported = cli_in_subprocess(["train", "--env", "minatar:breakout", "--stem", "nature"],
                                                  tmp_path)
    assert code == 2 and "stem 'nature' does not fit" in err, err
    assert not torch_imported
    assert list(tmp_path.iterdir()) == []


def test_bench_picks_the_stem_as_train_does(tmp_path, monkeypatch):
    """Without --env the bench runs its own Pong with the nature stem; with --env, stem auto."""
    pytest.importorskip("minatar")
    code, out, err = run_cli(["bench", "throughput", "--env", "minatar:breakout", "--print-config"])
    assert code == 0, err
    assert "stem: auto" in out, out
    code, out, err = run_cli(["bench", "throughput", "--print-config"])
    assert code == 0, err
    assert "stem: nature" in out and "env: atari:Pong" in out, out


@pytest.mark.parametrize("size", [35, 36])
def test_the_stems_shape_rule_is_the_convolutions(size):
    """``smallest_frame`` agrees with what the nature stem's convolutions take."""
    from fwrl.agents.model import NatureStem, make_stem
    from fwrl.agents.stem_shapes import fitting_stems, smallest_frame
    from fwrl.errors import FwrlError

    assert smallest_frame("nature") == 36 and smallest_frame("minatar") == 3 and smallest_frame("impala") == 1
    if size >= smallest_frame("nature"):
        assert NatureStem((4, size, size)).flat_size > 0
        assert "nature" in fitting_stems((4, size, size))
    else:
        with pytest.raises(FwrlError, match="at least 36x36"):
            make_stem("nature", (4, size, size))
    assert fitting_stems((8,)) == ["mlp"]


# ----------------------------------------------------------------------------- 6: slurm without sbatch

def test_slurm_without_sbatch_is_refused_before_the_sweep_folder_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no sbatch (nor squeue) here
    code, _, err = run_cli(["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "feedforward",
                            "--executor", "slurm"])
    assert_refused(code, err, "needs sbatch", "--dry-run")
    assert list(tmp_path.iterdir()) == [], "the sweep folder was written before the refusal"


# ----------------------------------------------------------------------------- 7: error texts that mislead

def memory_checkpoint(folder: Path) -> Path:
    """A fresh agent's checkpoint for ``memory:cue_delay`` (evaluate and resume only read it)."""
    import torch

    from fwrl.agents.checkpoint import save_checkpoint
    from fwrl.envs.registry import describe_env
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.agent import build_model

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


@pytest.mark.parametrize("argv", [
    ["train", "--env", "memory:cue_delay", "--core", "lstm", "--elstm-grad", "rtrl", "--runs-dir", "runs"],
    ["bench", "throughput", "--env", "memory:cue_delay", "--elstm-grad", "rtrl"],
    ["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "rdn", "--elstm-grad", "rtrl"],
])
def test_elstm_grad_on_another_core_says_what_it_is(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv)
    assert_refused(code, err, "--elstm-grad", "applies to", "elstm only")
    assert "unknown core option 'grad'" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case, needle", [
    ("metrics.csv", "is a text file, not an fwrl checkpoint"),
    ("truncated", "damaged or truncated checkpoint"),
    ("garbled", "not a readable fwrl checkpoint"),
    ("pickled object", "holds Python objects beyond tensors"),
    ("empty", "is empty (0 bytes)"),
])
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_is(case, needle, tmp_path):
    import torch

    good = memory_checkpoint(tmp_path / "run").read_bytes()
    path = tmp_path / ("metrics.csv" if case == "metrics.csv" else "checkpoint.pt")
    if case == "metrics.csv":
        path.write_text("time,agent_steps,mean_return\n1.0,400,0.5\n")
    elif case == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif case == "garbled":
        garbled = bytearray(good)
        for i in range(200, 260):  # inside the first member (data.pkl): the archive stays whole
            garbled[i] ^= 0xFF
        path.write_bytes(bytes(garbled))
    elif case == "pickled object":
        torch.save({"format": "fwrl-checkpoint-v1", "model": Path("x")}, path)
    else:
        path.write_bytes(b"")
    code, _, err = run_cli(["evaluate", path, "--out", tmp_path / "e.json"])
    assert_refused(code, err, needle, str(path))
    for torch_words in ("weights_only=False", "weights_only` set to `False", "Re-running", "pop from empty list",
                        "miniz", "\x1b["):
        assert torch_words not in err, err
    assert not (tmp_path / "e.json").exists()


def test_missing_library_message_reads_well_and_names_the_readmes_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # importing it fails, as where it is not installed
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["train", "--env", "minatar:breakout", "--runs-dir", "runs"])
    assert_refused(code, err, "'minatar', needed for MinAtar envs, is not installed", "pip install -e '.[minatar]'")
    assert "envs needs" not in err and "fwrl[minatar]" not in err
    readme = (REPO / "README.md").read_text()
    assert "pip install -e '.[atari]'" in readme  # the form the message gives is the README's
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- 10: sweeps

def tiny_sweep(folder: Path, *argv: str):
    """A sweep folder of ``argv``'s grid (written, nothing run); returns the Sweep."""
    from fwrl.launch.cli import build_parser
    from fwrl.launch.flags import given_settings
    from fwrl.launch.sweep.arguments import grid_from_args
    from fwrl.launch.sweep.grid import expand
    from fwrl.launch.sweep.options import SweepConfig
    from fwrl.launch.sweep.plan import write_sweep

    args = build_parser().parse_args(["sweep", str(folder), *argv])
    grid = grid_from_args(args, SweepConfig.parse(given_settings(args, SweepConfig)))
    return write_sweep(folder, grid, expand(grid))


LONG = ["--env", "memory:cue_delay?delay=3", "memory:copy?length=2&delay=1", "--core", "linear_transformer",
        "lstm", "--learning-rate", "0.002", "0.0006", "--seed", "11", "12", "--total-steps", "1000"]


def test_sweep_status_keeps_each_cell_name_on_one_line(tmp_path):
    sweep = tiny_sweep(tmp_path / "sw", *LONG)
    names = [cell.name for cell in sweep.cells]
    assert max(map(len, names)) > 60  # longer than an 80-column table leaves them
    code, out, _ = run_cli(["sweep", tmp_path / "sw", "--status"])
    assert code == 0
    lines = out.splitlines()
    for name in names:
        assert any(name in line for line in lines), (name, out)


def test_sweep_eta_counts_a_running_cells_time_left(tmp_path):
    """A cell running past the mean duration of the finished ones still has time left: its run says how much."""
    import time as clock

    from fwrl.launch.sweep.plan import CellState
    from fwrl.launch.sweep.sweep_progress import SweepProgress, run_time_left

    states = [CellState("a", "done", {"state": "done", "seconds": 60.0}), CellState("b", "pending", None)]
    progress = SweepProgress("sw", states, 1, out=io.StringIO(), time_left=lambda cell: 58.0)
    progress.start("b")
    progress.started["b"] -= 65  # running for 65 s: past the 60 s mean of the finished cell
    assert progress.eta() == pytest.approx(58.0)
    assert "ETA 0:58" in progress.summary()
    unknown = SweepProgress("sw", states, 1, out=io.StringIO())  # the run has logged no update yet
    unknown.start("b")
    unknown.started["b"] -= 65
    assert unknown.eta() is None and "ETA" not in unknown.summary()

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("time,agent_steps,updates\n10.0,100,1\n60.0,500,5\n")
    left = run_time_left(run, 1000, now=clock.time())
    assert left == pytest.approx(60.0, abs=1.5)  # 500 more steps at 500 steps per 60 s


def test_a_finished_sweep_says_what_comes_next(tmp_path):
    from fwrl.launch.sweep.status import write_status

    sweep = tiny_sweep(tmp_path / "sw", "--env", "memory:cue_delay", "--core", "lstm", "feedforward",
                       "--total-steps", "100")
    for cell in sweep.cells:
        write_status(sweep.path, cell.name, state="done", exit_code=0, seconds=3.0)
    code, _, err = run_cli(["sweep", sweep.path])
    assert code == 0, err
    assert f"next: fwrl report {sweep.path}" in err, err

    from fwrl.launch.sweep.command import _finish

    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        assert _finish(sweep, 0) == 0
    assert f"next: fwrl report {sweep.path}" in captured.getvalue()


def test_the_readmes_sweep_folder_is_ignored_by_git():
    ignored = (REPO / ".gitignore").read_text().split()
    assert "sweeps/" in ignored
    assert "fwrl sweep sweeps/memory" in (REPO / "README.md").read_text()


def test_an_unknown_core_in_a_sweep_reads_forwards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["sweep", "sw", "--env", "memory:cue_delay", "--core", "rdnn", "--seed", "1", "2"])
    assert_refused(code, err, "unknown core 'rdnn' in sweep cell ", "valid choices:")
    assert "unknown core in sweep cell" not in err
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- 5: answers without torch

@pytest.mark.parametrize("argv, message, heavy", [
    (["train", "--env", "memory:cue_delay", "--core", "rdn", "--core-opt", "heads=4"],
     "unknown core option 'heads' of core rdn; valid choices:", "torch"),
    (["train", "--env", "memory:cue_delay", "--core", "rdn", "--core-opt", "head_dim=-1"],
     "core option head_dim=-1 of core rdn is not valid", "torch"),
    (["evaluate", "."], "holds no checkpoint.pt", "torch"),
    (["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "rdnn"], "unknown core 'rdnn' in sweep cell",
     "torch"),
    (["report", "."], "holds no runs", "rliable"),
    (["info", "--env", "memory:cue_delay", "--probe", "--probe-updates", "0"], "--probe-updates 0 is not valid",
     "torch"),
])
def test_these_answers_come_without_the_heavy_imports(argv, message, heavy, tmp_path):
    """README: input errors answer before torch is imported (about a second); report before rliable."""
    code, err, imported = cli_in_subprocess(argv, tmp_path, heavy)
    assert code == 2 and message in err, err
    assert not imported, f"{heavy} was imported before the answer"
    assert list(tmp_path.iterdir()) == []


def test_the_catalogue_checks_core_options_as_the_registry_does():
    """Every option of every core: a bad value gets the registry's own message from the catalogue."""
    from fwrl.errors import FwrlError
    from fwrl.settings.core_catalog import check_core_options
    from fwrl.memory_modules import core_config_class, core_names

    def message(check) -> str | None:
        try:
            check()
        except FwrlError as exc:
            return str(exc)
        return None

    for core in core_names():
        cls = core_config_class(core)
        for name in [*cls.model_fields, "heads"]:
            for value in ("abc", "-1", "2.5", "nan", "0", "1.5", "softmaxx", True):
                real = message(lambda: cls.from_options({name: value}, core=core))
                ours = message(lambda: check_core_options(core, {name: value}))
                assert ours == real or (ours is None and "split the hidden vector" in str(real)), (core, name, value)


# ----------------------------------------------------------------------------- 2: a stale evaluation

def test_report_marks_an_evaluation_of_an_earlier_checkpoint_and_says_so(tmp_path):
    """Evaluated at 209,600 steps, resumed to 300,800: the report's cell is marked and the notes
    (and the terminal) say which run to evaluate again; a current evaluation is not marked."""
    import csv
    import json

    from fwrl.settings.config import TrainConfig, config_yaml

    pytest.importorskip("rliable")
    for name, evaluated_at, seed in (("stale", 209_600, 1), ("fresh", 300_800, 2)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        config = TrainConfig.from_dict({"env": "memory:cue_delay?delay=2", "core": "lstm", "seed": seed,
                                        "total_steps": 300_800})  # finished: the one mark is the stale one
        (run / "config.yaml").write_text(config_yaml(config))
        with (run / "metrics.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["time", "agent_steps", "episodes", "mean_return"])
            for i, steps in enumerate((100_000, 209_600, 300_800)):
                writer.writerow([10 * i, steps, 100 * i, 0.5 + 0.1 * i])
        (run / "evaluation.json").write_text(json.dumps({
            "checkpoint": str(run / "checkpoint.pt"), "agent_steps": evaluated_at, "env": "memory:cue_delay?delay=2",
            "episodes": 10, "repeats": 1,
            "aggregates": [{"task": "cue_delay", "split": "test", "repeats": 1, "episodes": 10, "mean": 0.6}]}))
    out = tmp_path / "out"
    code, stdout, err = run_cli(["report", tmp_path / "runs" / "stale", "--out", out, "--reps", "200",
                                 "--random-episodes", "2"])
    assert code == 0, err
    assert "209,600 agent steps" in err and "300,800" in err and "fwrl evaluate" in err, err
    assert "‡" in stdout, stdout
    report = json.loads((out / "report.json").read_text())
    (score,) = report["runs"][0]["scores"].values()
    assert score["stale"] is True and score["agent_steps"] == 209_600 and score["run_agent_steps"] == 300_800
    assert any("209,600" in note for note in report["notes"])
    assert "‡" in (out / "report.md").read_text()

    code, stdout, err = run_cli(["report", tmp_path / "runs" / "fresh", "--out", tmp_path / "out2", "--reps", "200",
                                 "--random-episodes", "2"])
    assert code == 0, err
    assert "‡" not in stdout and "agent steps" not in err


# ----------------------------------------------------------------------------- 3: evaluate shows progress

def test_evaluate_shows_episodes_done_the_running_mean_and_an_eta(tmp_path):
    checkpoint = memory_checkpoint(tmp_path / "run")
    code, _, err = run_cli(["evaluate", checkpoint.parent, "--episodes", "6", "--repeats", "2", "--num-workers", "1",
                            "--envs-per-worker", "2", "--out", tmp_path / "e.json"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("evaluating memory:cue_delay")]
    assert lines[0].endswith("starting workers ...")
    assert any("(test, repeat 1 of 2)" in line for line in lines), err
    assert lines[-1].startswith("evaluating memory:cue_delay (test, repeat 2 of 2): 12 / 12 episodes, mean return "), err
    assert "elapsed" in lines[-1] and "ETA 0:00" in lines[-1], err


def test_evaluate_progress_eta_is_the_time_per_episode_times_those_left():
    from fwrl.evaluation.evaluate_progress import EvalProgress

    progress = EvalProgress("atari:Pong", console=None)
    progress.started = 100.0
    text = progress.text("test, repeat 1 of 5", 30, 150, -20.5, now=160.0)
    assert text == ("evaluating atari:Pong (test, repeat 1 of 5): 30 / 150 episodes, mean return -20.5, "
                    "elapsed 1:00, ETA 4:00")
    assert "mean return -, elapsed 0:05, ETA -" in progress.text("test", 0, 150, float("nan"), now=105.0)


# ----------------------------------------------------------------------------- 4: the learning suite's settings

def printed_config(*argv) -> tuple[dict, str]:
    import yaml

    code, out, err = run_cli(["train", *argv, "--print-config"])
    assert code == 0, err
    return yaml.safe_load(out), err


@pytest.mark.parametrize("core", ["lstm", "elstm", "feedforward", "rdn", "delta_net", "srwm"])
def test_minatar_runs_take_the_learning_suites_settings(core):
    batch, lr = 8, 0.0012
    config, err = printed_config("--env", "minatar:breakout", "--core", core)
    assert (config["batch_size"], config["learning_rate"]) == (batch, lr)
    assert (config["num_workers"], config["envs_per_worker"], config["unroll_length"]) == (2, 8, 20)
    assert "settings of the learning suite" in err and f"batch_size {batch}" in err, err


def test_the_family_defaults_are_the_learning_suites_grid():
    """The defaults are what benchmarks/learning/minatar-cpu.yaml ran (the README's tuned settings)."""
    import yaml

    from fwrl.settings.family_defaults import family_defaults

    grid = yaml.safe_load((REPO / "benchmarks" / "learning" / "minatar-cpu.yaml").read_text())
    expected = {key: grid[key] for key in ("batch_size", "learning_rate", "num_workers", "envs_per_worker",
                                           "unroll_length")}
    for item in grid["core"]:
        assert family_defaults({}, "minatar:breakout", item["core"]) == expected, item


def test_flags_presets_and_other_families_keep_their_settings(tmp_path):
    config, err = printed_config("--env", "minatar:breakout", "--core", "lstm", "--batch-size", "16",
                                 "--learning-rate", "0.0006")
    assert (config["batch_size"], config["learning_rate"], config["unroll_length"]) == (16, 0.0006, 20)
    mine = tmp_path / "mine.yaml"
    mine.write_text("env: minatar:breakout\nunroll_length: 40\n")
    config, _ = printed_config("--config", mine)
    assert (config["unroll_length"], config["batch_size"]) == (40, 8)
    config, err = printed_config("--env", "atari:Pong", "--core", "rdn")  # the papers' settings stay
    assert (config["batch_size"], config["unroll_length"], config["num_workers"]) == (32, 50, 4)
    assert "learning suite" not in err


def test_a_sweep_gives_every_core_the_familys_settings(tmp_path):
    sweep = tiny_sweep(tmp_path / "sw", "--env", "minatar:breakout", "atari:Pong", "--core", "lstm", "rdn")
    settings = {(cell.config.env, cell.config.core): (cell.config.batch_size, cell.config.learning_rate)
                for cell in sweep.cells}
    assert settings == {("minatar:breakout", "lstm"): (8, 0.0012), ("minatar:breakout", "rdn"): (8, 0.0012),
                        ("atari:Pong", "lstm"): (32, 0.0006), ("atari:Pong", "rdn"): (32, 0.0006)}


def test_bench_without_an_update_in_its_window_says_why_not(tmp_path, monkeypatch):
    """A first batch that takes longer than the window and the wait for a first update after it (1 s
    here, 2 minutes by default): no '0 steps/s', but what the learner waited for."""
    import fwrl.runner.train

    monkeypatch.setattr(fwrl.runner.train, "FIRST_UPDATE_WAIT", 1.0)
    code, out, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay", "--core", "lstm",
                              "--core-opt", "hidden_size=8", "--num-workers", "1", "--envs-per-worker", "1",
                              "--batch-size", "64", "--unroll-length", "400", "--ceiling-seconds", "0",
                              "--warmup", "0", "--seconds", "2"])
    said = err.splitlines()[-1]  # after the bench's own progress lines
    assert code == 2 and said.startswith("fwrl: error: no update finished"), err
    for needle in ("first batch", "--batch-size", "--seconds"):
        assert needle in said, said
    assert "Traceback" not in err and "steps/s" not in out


def test_bench_window_starts_at_the_first_update():
    from fwrl.launch.bench.throughput import window_summary

    rows = [{"time": str(t), "agent_steps": str(s), "updates": str(u), "steps_per_second": "1"}
            for t, s, u in [(1, 0, 0), (5, 0, 0), (9, 0, 0), (12, 640, 1), (13, 1280, 2), (14, 1920, 3)]]
    result = window_summary(rows, warmup=5.0)
    assert (result.agent_steps, result.seconds, result.updates) == (1280, 2.0, 2)  # from 12 s, not from 5 s


def test_a_slow_first_update_says_what_to_change():
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.budget import Budget
    from fwrl.runner.slow_start import SlowStartHint

    class Shown:
        rows: list = []
        started: list = []

        def start(self, budget, deadline):
            self.started.append((budget, deadline))

        def update(self, row):
            self.rows.append(row)

        def stop(self):
            pass

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "core": "rdn", "batch_size": 32, "unroll_length": 50})
    out = io.StringIO()
    hint = SlowStartHint(Shown(), config, after=0.0, out=out)
    budget = Budget.of(config, ranks=2)
    hint.start(budget, 5.0)  # train starts its progress with the run's budget and deadline: they reach the display
    assert Shown.started == [(budget, 5.0)]
    hint.update({"updates": 0, "agent_steps": 0, "rollout_columns": 12, "acted_steps": 700})
    hint.update({"updates": 0, "agent_steps": 0, "rollout_columns": 20, "acted_steps": 1200})
    text = out.getvalue()
    assert text.count("\n") == 1, text  # said once
    assert "12 of 32 rollouts of 50 steps" in text and "--batch-size" in text and "--device cuda" in text
    assert len(Shown.rows) == 2
    quiet = io.StringIO()
    fast = SlowStartHint(Shown(), config, after=0.0, out=quiet)
    fast.start(budget, 5.0)
    fast.update({"updates": 1, "agent_steps": 1600})
    assert quiet.getvalue() == ""


def test_a_slurm_sweep_dry_run_refuses_a_stem_that_does_not_fit(tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["sweep", "sw", "--env", "minatar:breakout", "--core", "lstm", "rdn", "--stem", "nature",
                              "--executor", "slurm", "--dry-run"])
    assert_refused(code, err, "stem 'nature' does not fit", "Stems that fit: impala, minatar")
    assert out == "" and list(tmp_path.iterdir()) == []
