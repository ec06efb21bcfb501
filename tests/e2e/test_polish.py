"""Everyday polish (issue 25): missing libraries are refused up front, budgets are kept, the bench's
time shares add up per thread, input errors come back without importing torch, argparse takes no
abbreviations, YAML errors name their line and column, ``--resume`` says where it resumes.

Everything runs through ``fwrl.launch.cli.main`` (in-process, or in a subprocess where the import
graph is the point) on ``memory:`` tasks with tiny agents, so the file takes well under a minute
on a quiet 2-core machine.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from cli_runs import run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = ["--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1", "--envs-per-worker", "4",
        "--batch-size", "4", "--unroll-length", "5", "--log-interval", "1"]


def assert_refused(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("fwrl: error:"), err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


# ----------------------------------------------------------------------------- 1: missing libraries

# (family or backend, env spec, extra flags, modules made unimportable, what the message must name)
MISSING = {
    "atari": ("atari:Pong", [], ["ale_py"], "pip install -e '.[atari]'"),
    "procgen": ("procgen:bigfish", [], ["procgen", "envpool"], "pip install -e '.[procgen]'"),
    "minatar": ("minatar:breakout", [], ["minatar"], "pip install -e '.[minatar]'"),
    "dmlab": ("dmlab:rooms_watermaze", [], ["deepmind_lab"], "docker/Dockerfile.dmlab"),
    "gym-module": ("gym:fwrl_no_such_package:Thing-v0", [], [], "cannot import module 'fwrl_no_such_package'"),
    "envpool": ("atari:Pong?vector=envpool", [], ["envpool"], "pip install -e '.[envpool]'"),
    "ray-backend": ("memory:cue_delay", ["--backend", "ray"], ["ray"], "pip install -e '.[ray]'"),
}


@pytest.fixture
def no_process_starts(monkeypatch):
    """Starting a worker pool (a process, a Ray actor) or training fails the test."""
    import fwrl.envs.backends as backends
    import fwrl.runner.train as train

    def forbidden(*args, **kwargs):
        raise AssertionError("a worker pool or a training run was started although a library is missing")

    import fwrl.evaluation.episodes as episodes

    monkeypatch.setattr(backends, "make_pool", forbidden)
    monkeypatch.setattr(episodes, "make_pool", forbidden)
    monkeypatch.setattr(train, "train", forbidden)


@pytest.fixture(scope="module")
def memory_checkpoint(tmp_path_factory) -> Path:
    """A fresh agent's checkpoint for ``memory:cue_delay`` (no training: evaluate only reads it)."""
    from fwrl.agents.checkpoint import save_checkpoint
    from fwrl.envs.registry import describe_env
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.agent import build_model

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "core": "lstm", "core_options": {"hidden_size": 16}})
    info = describe_env(config.env)
    model = build_model(config, info)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    path = tmp_path_factory.mktemp("agent") / "checkpoint.pt"
    save_checkpoint(path, model=model, optimizer=optimizer, scheduler=scheduler, agent_steps=0, updates=0,
                    config=config.to_dict(), env_info=info.to_dict())
    return path


@pytest.mark.parametrize("case", sorted(MISSING))
@pytest.mark.parametrize("command", ["train", "bench throughput", "bench envs", "evaluate", "sweep"])
def test_missing_library_is_refused_before_any_folder_or_process(case, command, tmp_path, monkeypatch,
                                                                 no_process_starts, memory_checkpoint):
    env, flags, modules, hint = MISSING[case]
    for module in modules:  # importing it now fails, as where it is not installed
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    argv = {
        "train": ["train", "--env", env, *flags, "--runs-dir", runs],
        "bench throughput": ["bench", "throughput", "--env", env, *flags],
        "bench envs": ["bench", "envs", "--env", env, *flags],
        "evaluate": ["evaluate", memory_checkpoint, "--env", env, *flags, "--out", runs / "eval.json"],
        "sweep": ["sweep", runs / "sweep", "--env", env, *flags],
    }[command]
    if command == "evaluate" and case == "gym-module":
        pytest.skip("evaluate checks --env against the agent's spaces; the module check is the same call")
    code, _, err = run_cli(argv)
    assert_refused(code, err, hint)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a file or folder was written"


def test_evaluate_checks_the_runs_own_env_and_backend(tmp_path, monkeypatch, no_process_starts, memory_checkpoint):
    """Without --env, evaluate checks the env the agent was trained on (and the worker backend)."""
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = run_cli(["evaluate", memory_checkpoint, "--backend", "ray", "--out", tmp_path / "e.json"])
    assert_refused(code, err, "pip install -e '.[ray]'")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- 2: budgets

BUDGET = 6.0
# The limit counts from main() to its return. What is kept back for the stop is measured (the last
# update, the last checkpoint) plus fwrl.runner.stopping.STOP_ALLOWANCE (2 s, for closing the worker
# and the interpreter's exit); here the measured ones take milliseconds, so the run ends about two
# seconds early. The tolerance is for a loaded 2-core machine, where closing a worker process or the
# last metrics row can be slow.
TOLERANCE = 1.5


def test_max_seconds_counts_start_up_and_stop(tmp_path):
    began = time.monotonic()
    code, out, err = run_cli(["train", "--env", "memory:cue_delay?delay=3", *TINY, "--total-steps", "1e9",
                              "--max-seconds", BUDGET, "--runs-dir", tmp_path, "--name", "timed"])
    wall = time.monotonic() - began
    assert code == 0, err
    assert "stopped by time limit" in out and f"limit {BUDGET:g} s, start-up and stop included" in out, out
    assert wall < BUDGET + TOLERANCE, f"{wall:.2f} s for a {BUDGET:g} s limit"
    rows = list(csv.DictReader((tmp_path / "timed" / "metrics.csv").open()))
    assert int(rows[-1]["updates"]) >= 1, "the run never learnt: the limit was spent before the first update"
    assert (tmp_path / "timed" / "checkpoint.pt").is_file()


def test_max_seconds_counts_closing_a_hung_worker(tmp_path):
    """A worker hung in a step when the limit comes (its step timeout far off) is killed within
    the limit, not waited on for the pool's 5 s of grace (issue 55 item 10)."""
    env = "chaos:cue_delay?delay=3&hang_every=30&hang_seconds=600&only_worker=1"
    began = time.monotonic()
    code, out, err = run_cli(["train", "--env", env, *TINY, "--num-workers", "2", "--step-timeout", "600",
                              "--total-steps", "1e9", "--max-seconds", BUDGET, "--runs-dir", tmp_path,
                              "--name", "hung"])
    wall = time.monotonic() - began
    assert code == 0, err
    assert "stopped by time limit" in out, out
    assert wall < BUDGET + TOLERANCE, f"{wall:.2f} s for a {BUDGET:g} s limit"


def test_step_budget_overshoot_is_below_one_batch_and_said_so(tmp_path):
    """B 4 x T 5 = 20 steps per update; a budget of 210 takes 11 updates, 220 steps; acting stops
    once the last batch's rollouts are done; --resume says where it continues."""
    code, out, err = run_cli(["train", "--env", "memory:cue_delay?delay=3", *TINY, "--total-steps", 210,
                              "--runs-dir", tmp_path, "--name", "steps"])
    assert code == 0, err
    assert "220 agent steps: budget 210 reached in whole batches of 20 steps, the last one 10 past it" in out, out
    assert "11 updates" in out and "stopped by budget" in out, out
    last = list(csv.DictReader((tmp_path / "steps" / "metrics.csv").open()))[-1]
    slots, unroll = 4, 5
    # one rollout per slot under way when the last batch was done, plus each slot's first extra step
    assert int(last["acted_steps"]) <= 220 + slots * (unroll + 1), last
    assert int(last["rollout_columns"]) >= 44, last

    code, out, err = run_cli(["train", "--name", "steps", "--runs-dir", tmp_path, "--resume", "--total-steps", 260])
    assert code == 0, err
    assert f"resuming {tmp_path / 'steps'} from its checkpoint at 220 agent steps (11 updates)" in err, err
    assert "260 / 260 agent steps (100.0%)" in out, out


def test_no_episode_finished_says_so_not_nan():
    from types import SimpleNamespace

    from fwrl.launch.cli import _result_text
    from fwrl.settings.config import TrainConfig

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "total_steps": 2000, "max_seconds": 30})
    result = SimpleNamespace(agent_steps=1600, updates=1, episodes=0, mean_return=float("nan"),
                             mean_success=float("nan"), stopped_by="time limit", wall_seconds=29.4)
    text = _result_text(result, config, 1600)
    assert "no episode finished yet" in text and "nan" not in text, text
    assert "1 update," in text and "after 29.4 s (limit 30 s" in text, text


def test_filling_counts_the_rollouts_the_learner_waits_for():
    from fwrl.settings.config import TrainConfig
    from fwrl.runner.train_progress import Progress

    config = TrainConfig.from_dict({"env": "memory:cue_delay", "batch_size": 32, "unroll_length": 50})
    progress = Progress(config, "runs/x")
    row = {"agent_steps": 0, "updates": 0, "acted_steps": 2222, "rollout_columns": 24, "time": 3.0}
    assert progress.status(row) == ("filling the first batch: 24 of 32 rollouts of 50 steps ready "
                                    "(2,222 agent steps acted)")
    row["rollout_columns"] = 40
    assert progress.status(row).startswith("first update running: its batch of 32 rollouts x 50 steps is ready")


# ----------------------------------------------------------------------------- 3: time shares

def test_stage_split_at_interval_ends():
    """A stage under way when an interval is collected counts in each interval only its own part
    (a wait that began before an interval cannot make its share exceed 100%)."""
    from fwrl.agents.stage_timer import StageTimer

    timer = StageTimer()
    with timer.stage("learner_idle"):
        time.sleep(0.15)
        first, first_wall = timer.collect()
        time.sleep(0.05)
    second, second_wall = timer.collect()
    assert first["learner_idle"] <= first_wall and second["learner_idle"] <= second_wall
    assert 0.03 < second["learner_idle"] < 0.1, second


def test_bench_throughput_shares_sum_to_100_percent_per_thread(tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3, "--json-path", out])
    assert code == 0, err
    record = json.loads(out.read_text())
    threads = record["thread_shares"]
    assert set(threads) == {"acting", "learner"}
    for thread, shares in threads.items():
        assert all(0 <= value <= 1 for value in shares.values()), (thread, shares)
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.005), (thread, shares)
    assert "share of this thread's wall time" in stdout
    assert " 0 steps/s" not in err


def test_bench_throughput_measures_learner_ranks_acting_in_their_processes(tmp_path):
    """``--learners 2``: two ranks, each acting in its own process over half the workers; the rate
    counts both ranks' steps (rank 0's rows), the record and the table say how many ranks."""
    out = tmp_path / "bench.json"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3,
                                 "--num-workers", 2, "--learners", 2, "--json-path", out])
    assert code == 0, err
    # the ranks' launcher left this process's own signal handlers in place (it installs its own)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    record = json.loads(out.read_text())
    assert record["learners"] == 2 and record["acting_threads"] == 1
    assert record["steps_per_second"] > 0 and record["updates"] > 0
    per_update = record["config"]["batch_size"] * record["config"]["unroll_length"] * 2  # every rank's B x T
    assert record["agent_steps"] % per_update == 0, record
    assert record["shares"]["share/learner_allreduce"] > 0  # the ranks summed their gradients
    assert re.search(r"learner ranks\s+│\s+2", stdout), stdout


def test_bench_throughput_profiles_the_acting_thread_per_call(tmp_path):
    report = tmp_path / "profile" / "acting.md"
    code, _, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2], "--stem", "auto",
                            "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3, "--profile-seconds", 2,
                            "--profile-path", report])
    assert code == 0, err
    text = report.read_text()
    calls = int(re.search(r"Profiled window: ([\d,]+) acting calls", text).group(1).replace(",", ""))
    assert calls > 10, text[:400]
    stages = {name: int(count.replace(",", "")) for name, count in re.findall(r"^\| fwrl/(\w+) \| ([\d,]+) \|", text, re.M)}
    assert {"env_wait", "inference_forward", "rollout_bookkeeping"} <= set(stages), text[:800]
    assert "acting_call" not in stages
    # a call that served workers has two forward ranges (the forward, the actions' copy to the host)
    assert stages["inference_forward"] % 2 == 0 and 0 < stages["inference_forward"] <= 2 * calls, stages
    assert "## Ops by own CPU time" in text and "aten::" in text
    assert not list(report.parent.glob("*.tmp*"))  # written atomically


def test_bench_throughput_acting_only_measures_acting_without_updates(tmp_path):
    """``--acting-only``: the learner makes no update; every batch goes back to the store unread and
    counts as agent steps, so the rate is the acting path's alone (and the run does not stall on a
    full store); with learner ranks it is refused."""
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3,
                                 "--acting-only", "--json-path", out])
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["acting_only"] is True and record["updates"] == 0
    per_batch = record["config"]["batch_size"] * record["config"]["unroll_length"]
    assert record["agent_steps"] > 0 and record["agent_steps"] % per_batch == 0, record
    assert record["shares"]["share/learner_backward"] == 0
    assert "none (--acting-only" in stdout
    code, _, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", "--learners", 2,
                            "--acting-only"])
    assert_refused(code, err, "drop --learners or --acting-only")


@pytest.mark.parametrize("flags, needle", [
    (["--profile-seconds", 0], "profile_seconds=0 is not valid"),
    (["--paths", "all"], "--profile-path profiles one measured run"),
    (["--learners", 2], "--learners 2 runs 2: drop --learners or --profile-path"),
])
def test_bench_throughput_refuses_a_profile_it_cannot_take(tmp_path, flags, needle):
    report = tmp_path / "p.md"
    code, _, err = run_cli(["bench", "throughput", "--env", "atari:Pong", *flags, "--profile-path", report])
    assert_refused(code, err, needle)
    assert not report.exists()


# ----------------------------------------------------------------------------- 4: the import graph

def _cli_in_subprocess(argv: list[str], cwd: Path) -> tuple[int, str, bool]:
    """Run ``main(argv)`` in a fresh interpreter; (exit status, stderr, whether torch was imported)."""
    script = textwrap.dedent(f"""
        import sys
        from fwrl.launch.cli import main
        code = main({argv!r})
        print("TORCH_IMPORTED=" + str("torch" in sys.modules))
        sys.exit(code)
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr, "TORCH_IMPORTED=True" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["train", "--env", "atari:Pongg"], "unknown atari game 'Pongg'. Did you mean Pong"),
    (["train", "--env", "memory:cue_delay", "--core", "lstmm"], "unknown core 'lstmm'; valid choices:"),
    (["train", "--env", "atarii:Pong"], "unknown env family 'atarii'"),
    (["bench", "throughput", "--env", "memory:cue_delai"], "unknown memory game 'cue_delai'"),
    (["info", "--env", "memory:cue_delay", "--core", "rdnn"], "unknown core 'rdnn'"),
])
def test_a_typo_is_reported_without_importing_torch(argv, message, tmp_path):
    if any(a.startswith("atari:") for a in argv):
        pytest.importorskip("ale_py")
    code, err, torch_imported = _cli_in_subprocess(argv, tmp_path)
    assert code == 2 and message in err, err
    assert len(err) < 400, f"a {len(err)}-character message for one typo: {err[:200]}..."  # not 104 game names
    assert not torch_imported, "torch was imported before the typo was reported"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["info"], ["info", "--cores"], ["info", "--presets"]])
def test_info_lists_the_cores_without_importing_torch(tmp_path, argv):
    """``fwrl info`` alone: a line per core and the presets (30 lines, not 574); ``--cores``: every option.
    Printed into a pipe, the tables keep every row on one line at their natural width (rich draws 80
    columns off a terminal: headers cut to ``step…``, envs cut)."""
    script = textwrap.dedent(f"""
        import sys
        from fwrl.launch.cli import main
        code = main({argv!r})
        print("TORCH_IMPORTED=" + str("torch" in sys.modules))
        sys.exit(code)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH_IMPORTED=False" in proc.stdout
    lines = proc.stdout.splitlines()
    if argv == ["info", "--cores"]:
        assert "rdn:" in proc.stdout and "head_dim" in proc.stdout
    else:
        assert "meaning" not in proc.stdout and len(lines) < 60  # no option tables
        assert any(line.startswith("│ memory:cue_delay?delay=10") or "│ memory:cue_delay?delay=10 " in line
                   for line in lines)  # the quickstart preset's env, whole
    if argv == ["info"]:
        assert any(line.startswith("│ rdn ") for line in lines) and "fwrl info --cores" in proc.stdout


def test_core_catalogue_is_the_registrys():
    """The shipped catalogue (fwrl info, the --core check) matches the registry; after changing a core
    or its options, write it again: python -m fwrl.settings.core_catalog."""
    from fwrl.settings import core_catalog

    shipped = json.loads(core_catalog.CATALOGUE.read_text())
    live = core_catalog.live_catalogue()
    assert shipped == live, (
        "fwrl/settings/core_catalog.json is stale: run python -m fwrl.settings.core_catalog")


# ----------------------------------------------------------------------------- 5: small inconsistencies

@pytest.mark.parametrize("argv, bad", [
    (["train", "--total-step", "5"], "--total-step"),
    (["bench", "throughput", "--secon", "3"], "--secon"),
    (["sweep", "sw", "--exec", "local"], "--exec"),
    (["bench", "kernels", "--cor", "rdn"], "--cor"),
])
def test_argparse_abbreviations_are_refused(argv, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv)
    assert_refused(code, err, bad)
    assert list(tmp_path.iterdir()) == []


BROKEN_YAML = "env: memory:cue_delay\nbatch_size: [1, 2\nseed: 3\n"


@pytest.mark.parametrize("flag", ["--config", "--preset", "--grid"])
def test_yaml_errors_name_line_and_column(flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("broken.yaml").write_text(BROKEN_YAML)
    argv = ["sweep", "sw", "--grid", "broken.yaml"] if flag == "--grid" else ["train", flag, "broken.yaml"]
    code, _, err = run_cli(argv)
    assert_refused(code, err, "broken.yaml: line 3, column 5: expected ',' or ']'",
                   "while parsing a flow sequence at line 2, column 13")


def test_bench_kernels_json_path_and_its_deprecated_alias(capsys):
    from fwrl.launch.bench import kernels as benchmark

    assert benchmark._parser().parse_args(["--json-path", "a.json"]).json_path == "a.json"
    assert benchmark._parser().parse_args(["--json", "b.json"]).json_path == "b.json"


def test_missing_triton_names_the_extra(monkeypatch):
    from fwrl.launch.bench import kernels as benchmark

    for name in [m for m in sys.modules if m == "triton" or m.startswith(("triton.", "fwrl.kernels.triton"))
                 or m.startswith("fwrl.kernels.") and ".fused_recurrent" in m]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)
    args = benchmark._parser().parse_args(["--core", "rdn", "--dry-run"])
    inputs = benchmark._inputs("rdn", (2, 3, 1, 4), torch.float32, "cpu")
    (runner, note, _), = benchmark._triton_runners("rdn", args, inputs).values()
    assert runner is None and "pip install -e '.[kernels]'" in note, note


def test_readme_bad_input_example_fails_as_it_says():
    """README: a value out of its range names the setting, the value and what is valid."""
    readme = (REPO / "README.md").read_text()
    assert "`--core rdn --core-opt head_dim=-1`" in readme
    code, _, err = run_cli(["train", "--preset", "quickstart", "--core", "rdn", "--core-opt", "head_dim=-1"])
    assert_refused(code, err, "head_dim=-1", "valid: an integer with x >= 1")


def test_evaluation_table_drops_empty_columns():
    from fwrl.evaluation.results import shown_table

    row = {"task": "cue_delay", "split": "test", "episodes": 10, "mean": 0.5, "std": 0.5, "repeats": 1,
           "std_of_repeat_means": None, "normalised": None, "published": []}
    header, rows = shown_table({"aggregates": [row]})
    assert header == ["task", "split", "episodes", "return (mean ± sd)"], header
    header, _ = shown_table({"aggregates": [{**row, "success": 0.5, "normalised": 0.2}]})
    assert "normalised x100" in header and "success" in header and "published" not in header


def test_info_probe_writes_its_figures_to_json(tmp_path):
    """``fwrl info --probe --json-path``: the probe's settings and figures, for scripts (the GPU suite)."""
    out = tmp_path / "probe" / "rdn.json"
    code, stdout, err = run_cli(["info", "--env", "memory:cue_delay?delay=3", "--core", "rdn", "--probe",
                                 "--probe-updates", "2", "--batch-size", "2", "--unroll-length", "6",
                                 "--json-path", out])
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["settings"]["core"] == "rdn" and data["settings"]["batch_size"] == 2
    assert data["settings"]["updates"] == 2 and len(data["entropy"]) == 2 == len(data["value_error"])
    assert data["init_grad_norm"] > 0 and data["first_logit_change"] > 0
    assert f"{data['init_grad_norm']:.3g}" in stdout.replace(",", "")
    assert [p.name for p in out.parent.iterdir()] == ["rdn.json"]


def test_info_probe_reference_probes_a_second_core_on_the_same_batch(tmp_path):
    """``--probe-reference lstm``: the LSTM probed too, and each figure printed as a multiple of its."""
    out = tmp_path / "rdn.json"
    code, stdout, err = run_cli(["info", "--env", "memory:cue_delay?delay=3", "--core", "rdn", "--probe",
                                 "--probe-updates", "1", "--batch-size", "2", "--unroll-length", "6",
                                 "--probe-reference", "lstm", "--json-path", out])
    assert code == 0, err
    data = json.loads(out.read_text())
    reference = data["reference"]
    assert reference["core"] == "lstm" and data["settings"]["core"] == "rdn"
    assert reference["init_grad_norm"] > 0 and reference["init_grad_norm"] != data["init_grad_norm"]
    assert "reference init probe: memory:cue_delay?delay=3 / lstm / B 2, T 6" in stdout
    ratio = data["init_grad_norm"] / reference["init_grad_norm"]
    assert f"gradient norm: {reference['init_grad_norm']:.4g} -> {ratio:.2g}x" in stdout, stdout
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--probe", "--probe-reference", "lsmt"])
    assert_refused(code, err, "'lsmt'", "lstm", "rdn")
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--probe-reference", "lstm"])
    assert_refused(code, err, "--probe-reference", "--probe")


def test_info_json_path_needs_probe(tmp_path):
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--json-path", tmp_path / "p.json"])
    assert_refused(code, err, "--json-path", "--probe")
    assert not (tmp_path / "p.json").exists()
