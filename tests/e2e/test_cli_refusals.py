"""Bad input is refused up front, through the command line: one ``fwrl: error:`` message naming
what to change (exit status 2, no traceback), before any folder is written or any process started.

A library the env family or the worker backend needs and that is missing (with the README's install
command), a stem too big for the env's frames, a SLURM sweep without ``sbatch``, a flag for another
core, a file that is no checkpoint, an unknown core in a sweep, an abbreviated flag, broken YAML
(its line and column), a value out of its range. Everything runs through ``fwrl.launch.cli.main``
in this process on small envs and tiny agents.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli_runs import assert_refused, run_cli, write_memory_checkpoint

REPO = Path(__file__).resolve().parents[2]


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
    import fwrl.evaluation.episodes as episodes
    import fwrl.runner.train as train

    def forbidden(*args, **kwargs):
        raise AssertionError("a worker pool or a training run was started although a library is missing")

    monkeypatch.setattr(backends, "make_pool", forbidden)
    monkeypatch.setattr(episodes, "make_pool", forbidden)
    monkeypatch.setattr(train, "train", forbidden)


@pytest.fixture(scope="module")
def memory_checkpoint(tmp_path_factory) -> Path:
    """A fresh agent's checkpoint for ``memory:cue_delay`` (no training: evaluate only reads it)."""
    return write_memory_checkpoint(tmp_path_factory.mktemp("agent"))


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


def test_missing_library_message_reads_well_and_names_the_readmes_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "minatar", None)  # importing it fails, as where it is not installed
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["train", "--env", "minatar:breakout", "--runs-dir", "runs"])
    assert_refused(code, err, "'minatar', needed for MinAtar envs, is not installed", "pip install -e '.[minatar]'",
                   one_line=True)
    assert "envs needs" not in err and "fwrl[minatar]" not in err
    readme = (REPO / "README.md").read_text()
    assert "pip install -e '.[atari]'" in readme  # the form the message gives is the README's
    assert list(tmp_path.iterdir()) == []


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
                   "Stems that fit: impala, minatar", one_line=True)
    assert list(tmp_path.iterdir()) == []


def test_a_slurm_sweep_dry_run_refuses_a_stem_that_does_not_fit(tmp_path, monkeypatch):
    pytest.importorskip("minatar")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["sweep", "sw", "--env", "minatar:breakout", "--core", "lstm", "rdn", "--stem", "nature",
                              "--executor", "slurm", "--dry-run"])
    assert_refused(code, err, "stem 'nature' does not fit", "Stems that fit: impala, minatar", one_line=True)
    assert out == "" and list(tmp_path.iterdir()) == []


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
    assert fitting_stems((8,)) == ["mlp", "popgym"]
    assert "popgym" not in fitting_stems((4, size, size))


def test_slurm_without_sbatch_is_refused_before_the_sweep_folder_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no sbatch (nor squeue) here
    code, _, err = run_cli(["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "feedforward",
                            "--executor", "slurm"])
    assert_refused(code, err, "needs sbatch", "--dry-run", one_line=True)
    assert list(tmp_path.iterdir()) == [], "the sweep folder was written before the refusal"


@pytest.mark.parametrize("argv", [
    ["train", "--env", "memory:cue_delay", "--core", "lstm", "--elstm-grad", "rtrl", "--runs-dir", "runs"],
    ["bench", "throughput", "--env", "memory:cue_delay", "--elstm-grad", "rtrl"],
    ["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "rdn", "--elstm-grad", "rtrl"],
])
def test_elstm_grad_on_another_core_says_what_it_is(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv)
    assert_refused(code, err, "--elstm-grad", "applies to", "elstm only", one_line=True)
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

    good = write_memory_checkpoint(tmp_path / "run").read_bytes()
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
    assert_refused(code, err, needle, str(path), one_line=True)
    for torch_words in ("weights_only=False", "weights_only` set to `False", "Re-running", "pop from empty list",
                        "miniz", "\x1b["):
        assert torch_words not in err, err
    assert not (tmp_path / "e.json").exists()


def test_an_unknown_core_in_a_sweep_reads_forwards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["sweep", "sw", "--env", "memory:cue_delay", "--core", "rdnn", "--seed", "1", "2"])
    assert_refused(code, err, "unknown core 'rdnn' in sweep cell ", "valid choices:", one_line=True)
    assert "unknown core in sweep cell" not in err
    assert list(tmp_path.iterdir()) == []


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


def test_readme_bad_input_example_fails_as_it_says():
    """README: a value out of its range names the setting, the value and what is valid."""
    readme = (REPO / "README.md").read_text()
    assert "`--core rdn --core-opt head_dim=-1`" in readme
    code, _, err = run_cli(["train", "--preset", "quickstart", "--core", "rdn", "--core-opt", "head_dim=-1"])
    assert_refused(code, err, "head_dim=-1", "valid: an integer with x >= 1")


# Issue 71: settings that were accepted and then hung, overloaded the machine or ended in a traceback, and
# input that was taken silently or said unclearly; each is one line naming the value and what is valid, with
# nothing written and no process started. (argv after the command's own flags, what the message names)
MEMORY = ["--env", "memory:cue_delay", "--num-workers", "1", "--device", "cpu"]
MEMORY_2 = ["--env", "memory:cue_delay", "--num-workers", "2", "--device", "cpu"]
ISSUE_71 = {
    "num_threads": (["train", *MEMORY, "--num-threads", "10000"], ["num_threads=10000", "core(s) this process may run on"]),
    "probe_batch": (["info", "--probe", "--env", "memory:cue_delay", "--batch-size", "100000000"],
                    ["--batch-size 100000000 with --probe", "valid: 1..1,024"]),
    "env_delay": (["train", "--env", "memory:cue_delay?delay=100000000000"], ["0 <= delay <= 1,000,000", "100000000000"]),
    "weights_train": (["train", *MEMORY, "--core-opt", "hidden_size=100000000"],
                      ["model weights", "core lstm, hidden_size=100000000", "lower those settings"]),
    "weights_info": (["info", "--env", "memory:cue_delay", "--core-opt", "hidden_size=100000000"],
                     ["for its weights", "hidden_size=100000000"]),
    "nccl_cpu": (["train", *MEMORY_2, "--learners", "2", "--dist-backend", "nccl"],
                 ["dist_backend='nccl'", "device is cpu", "auto or gloo"]),
    "wrapper_join": (["train", *MEMORY, "--env-wrapper", "os.path:join"],
                     ["env wrapper 'os.path:join' failed when called with the env (TypeError", "takes the env alone"]),
    "wrapper_time_limit": (["train", *MEMORY, "--env-wrapper", "gymnasium.wrappers:TimeLimit"],
                           ["'gymnasium.wrappers:TimeLimit' failed when called", "max_episode_steps"]),
    # item 7: taken silently, or said unclearly
    "elstm_grad_against_core_opt": (["train", *MEMORY, "--core", "elstm", "--elstm-grad", "rtrl", "--core-opt",
                                     "grad=bptt"], ["--elstm-grad rtrl and --core-opt grad=bptt", "give one"]),
    "two_presets": (["train", "--preset", "quickstart", "--preset", "pong-cpu"],
                    ["--preset is given twice (--preset quickstart, then --preset pong-cpu)", "give it once"]),
    "core_opt_twice": (["train", *MEMORY, "--core-opt", "hidden_size=8", "--core-opt", "hidden_size=16"],
                       ["--core-opt hidden_size is given twice (hidden_size=8, then hidden_size=16)"]),
    "two_configs": (["sweep", "sw", "--env", "memory:cue_delay", "--config", "a.yaml", "--config", "b.yaml",
                     "--dry-run"], ["--config is given twice (--config a.yaml, then --config b.yaml)"]),
    "acting_priority_cpu": (["train", *MEMORY, "--acting-priority", "high"], ["acting_priority='high'", "device is cpu",
                                                                             "acting_priority normal"]),
    "ray_address_local": (["train", *MEMORY, "--ray-address", "10.0.0.1:6379"],
                          ["--ray-address 10.0.0.1:6379", "backend here is 'local'", "--backend ray"]),
    "ray_address_sweep": (["sweep", "sw", "--env", "memory:cue_delay", "--ray-address", "10.0.0.1:6379", "--dry-run"],
                          ["--ray-address 10.0.0.1:6379", "--executor ray"]),
    "runs_dir_empty": (["train", *MEMORY, "--runs-dir", ""], ["--runs-dir '' names no folder"]),
    "learner_process_ranks": (["train", *MEMORY_2, "--learners", "2", "--learner-process", "on"],
                              ["learner_process='on' serves one learner rank; this run has 2"]),
    "family_alone": (["info", "--env", "memory"], ["names the env family memory but no game",
                                                   "cue_delay, assoc_recall, copy, time_limit"]),
    "switch_with_value": (["train", *MEMORY, "--freeze-vision", "yes"],
                          ["--freeze-vision takes no value (got 'yes')", "--no-freeze-vision turns it off"]),
    "sweep_dry_run_env_option": (["sweep", "sw", "--env", "memory:cue_delay?delay=-1", "--core", "lstm", "--dry-run"],
                                 ["cell ", "0 <= delay <= 1,000,000"]),
    "sweep_dry_run_workers": (["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "--num-workers", "1000",
                               "--dry-run"], ["cell ", "num_workers=1000", "lower those settings"]),
}


@pytest.mark.parametrize("case", sorted(ISSUE_71))
def test_issue_71_bad_input_is_one_line_before_anything_starts(case, tmp_path, monkeypatch, no_process_starts):
    argv, needles = ISSUE_71[case]
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv)
    assert_refused(code, err, *needles, one_line=True)
    assert list(tmp_path.iterdir()) == [], "a file or folder was written"


def test_an_address_space_limit_is_read_before_the_model_is_built(tmp_path):
    """A real ``RLIMIT_AS`` (ulimit -v, prlimit --as) that leaves too little for the model's weights: refused in
    one line naming the limit (at 9f18864: a traceback from inside the run, exit 1)."""
    import resource
    import subprocess

    limit = 1100 * 2**20  # torch imported takes ~650 MiB of it; the weights need ~600 MiB (4 copies of 150)
    done = subprocess.run([sys.executable, "-m", "fwrl.launch.cli", "train", *MEMORY, "--core-opt", "hidden_size=3000",
                           "--envs-per-worker", "1", "--batch-size", "2", "--unroll-length", "5", "--total-steps", "20",
                           "--runs-dir", "runs"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert_refused(done.returncode, done.stderr, "of address space (its limit: ulimit -v, prlimit --as)",
                   "model weights", "hidden_size=3000", one_line=True)
    assert list(tmp_path.iterdir()) == []


def test_a_refusal_after_the_run_folder_was_made_leaves_no_empty_runs_folder(tmp_path, monkeypatch, memory_checkpoint):
    """A refusal from inside the run's build (a vision stem that does not fit, read only then) removes the run
    folder and the runs folder made for it (at 9f18864 an empty runs/ was left)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["train", "--env", "memory:copy?length=2", *MEMORY[2:], "--load-vision-from",
                            memory_checkpoint, "--runs-dir", "runs/deeper"])
    assert_refused(code, err, "do not fit this model")
    assert list(tmp_path.iterdir()) == [], "a file or folder was left"
