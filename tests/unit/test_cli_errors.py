"""Malformed command lines and config files, generated (hypothesis): every one is refused the same way.

``fwrl.launch.cli.main(argv)`` runs in-process and must return exactly 2,
with stderr starting ``fwrl: error:``, naming the bad setting and value, no
Python traceback, and nothing created: no run folder, no output file, no
worker started (the entry points that would start work fail the test if
reached). Bad values come from the settings models themselves (types,
bounds, choices), so a new setting is covered when it is added.
"""

from __future__ import annotations

import contextlib
import io
import os
import string
import tempfile
from pathlib import Path

import pytest
import yaml
from annotated_types import Ge, Gt, Le, Lt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fwrl.errors import FwrlError
from fwrl.launch.cli import main
from fwrl.settings.config import BenchConfig, EvaluateConfig, PlotConfig, TrainConfig
from fwrl.memory_modules import core_config_class, core_names
from fwrl.utils.settings import base_type, choices_of

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORDS = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12)
ENV = ["--env", "memory:cue_delay"]  # cheap to describe, so the checks that need the env stay fast


@pytest.fixture(autouse=True, scope="module")
def no_work_starts():
    """Reaching training, evaluation, plotting or a benchmark means a bad value got through."""
    import fwrl.launch.bench.envs as bench_envs
    import fwrl.launch.bench.throughput as bench_throughput
    import fwrl.evaluation.evaluate as evaluate
    import fwrl.launch.plot as plot
    import fwrl.runner.train as train

    def forbidden(*args, **kwargs):
        raise AssertionError("work started although the input was bad")

    with pytest.MonkeyPatch.context() as mp:
        for module, name in [(train, "train"), (evaluate, "evaluate"), (plot, "plot_runs"),
                             (bench_throughput, "measure_throughput"),
                             (bench_throughput, "measure_env_steps"), (bench_envs, "measure_env_steps")]:
            mp.setattr(module, name, forbidden)
        yield


def _bounds(info) -> dict[str, float]:
    out = {}
    for m in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if hasattr(m, key) and isinstance(m, (Ge, Gt, Le, Lt)):
                out[key] = getattr(m, key)
    return out


def bad_values(info, for_yaml: bool = False) -> st.SearchStrategy:
    """Values a setting must refuse: wrong type, out of its bounds, not one of its choices."""
    kind = base_type(info.annotation)
    choices = choices_of(kind)
    if choices is not None:
        return WORDS.filter(lambda w: w not in choices)
    if kind not in (int, float):
        return st.nothing()
    options = [st.sampled_from(["abc", "1,5", "nan", "inf", "-inf", "0x10", "one"])]
    if kind is int:
        options.append(st.sampled_from(["2.5", "1e-3", "7.25"]))
        options.append(st.floats(min_value=-1e6, max_value=1e6).filter(lambda x: not x.is_integer()))
    if for_yaml:
        options.append(st.booleans())
    b = _bounds(info)
    if kind is int:
        if "ge" in b:
            options.append(st.integers(min_value=b["ge"] - 10**6, max_value=b["ge"] - 1))
        if "gt" in b:
            options.append(st.integers(min_value=b["gt"] - 10**6, max_value=b["gt"]))
        if "le" in b:
            options.append(st.integers(min_value=b["le"] + 1, max_value=b["le"] + 10**6))
        if "lt" in b:
            options.append(st.integers(min_value=b["lt"], max_value=b["lt"] + 10**6))
    else:
        if "ge" in b:
            options.append(st.floats(min_value=b["ge"] - 1e6, max_value=b["ge"], exclude_max=True))
        if "gt" in b:
            options.append(st.floats(min_value=b["gt"] - 1e6, max_value=b["gt"]))
        if "le" in b:
            options.append(st.floats(min_value=b["le"], max_value=b["le"] + 1e6, exclude_min=True))
        if "lt" in b:
            options.append(st.floats(min_value=b["lt"], max_value=b["lt"] + 1e6))
    return st.one_of(options)


def typed_settings(model, exclude=()) -> list[str]:
    return [n for n, info in model.model_fields.items() if n not in exclude
            and (choices_of(info.annotation) is not None or base_type(info.annotation) in (int, float))]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@st.composite
def bad_setting(draw, model, exclude=(), for_yaml: bool = False):
    """(setting name, bad value) for a numeric or choice setting of ``model``."""
    name = draw(st.sampled_from(typed_settings(model, exclude)))
    return name, draw(bad_values(model.model_fields[name], for_yaml))


@st.composite
def bad_core_option(draw):
    """(argv, setting, value): a bad value of a core's option, or an unknown option."""
    core = draw(st.sampled_from([c for c in core_names() if core_config_class(c).model_fields]))
    fields = core_config_class(core).model_fields
    if draw(st.booleans()):
        key = draw(WORDS.filter(lambda w: w not in fields))
        return ["--core", core, "--core-opt", f"{key}=1"], key, key
    key = draw(st.sampled_from(typed_settings(core_config_class(core))))
    value = text(draw(bad_values(fields[key])))
    return ["--core", core, "--core-opt", f"{key}={value}"], key, value


def run(argv: list[str], cwd: Path) -> str:
    """``fwrl argv`` in ``cwd``; the checks every refusal must pass; returns stderr."""
    err = io.StringIO()
    before = sorted(p.name for p in cwd.iterdir())
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        os.chdir(old)
    message = err.getvalue()
    assert code == 2, (argv, message)
    assert message.startswith("fwrl: error: "), (argv, message)
    assert "Traceback" not in message, (argv, message)
    assert sorted(p.name for p in cwd.iterdir()) == before, f"{argv} created files"
    return message


def names_it(message: str, setting: str, value) -> None:
    assert setting in message or flag(setting) in message, (setting, message)
    shown = text(value)
    if shown.strip():
        assert shown in message or repr(value) in message, (value, message)


# ----------------------------------------------------------------------------- the properties

@SETTINGS
@given(case=bad_setting(TrainConfig))
def test_train_flag_with_a_bad_value(case):
    name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run(["train", *ENV, "--runs-dir", "runs", flag(name), text(value)], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=bad_core_option(), command=st.sampled_from(["train", "info", "bench-throughput"]))
def test_core_option_with_a_bad_value_or_name(case, command):
    argv, name, value = case
    prefix = {"train": ["train", "--runs-dir", "runs"], "info": ["info"],
              "bench-throughput": ["bench", "throughput"]}[command]
    with tempfile.TemporaryDirectory() as tmp:
        message = run([*prefix, *ENV, *argv], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=bad_setting(TrainConfig, for_yaml=True) | WORDS.filter(
    lambda w: w not in TrainConfig.model_fields).map(lambda key: (key, key)),  # an unknown key names itself
    how=st.sampled_from(["--config", "--preset"]))
def test_yaml_file_with_a_bad_setting(case, how):
    """A YAML file (``--config FILE`` or ``--preset FILE``) with a bad value or an unknown key."""
    name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "mine.yaml").write_text(yaml.safe_dump({"env": "memory:cue_delay", name: value}))
        message = run(["train", how, "mine.yaml", "--runs-dir", "runs"], folder)
    names_it(message, name, value)


@SETTINGS
@given(case=st.one_of(
    bad_setting(TrainConfig).map(lambda c: ([flag(c[0]), text(c[1])], *c)),
    st.sampled_from([(["--env", "cue_delay"], "env", "cue_delay"), (["--env", "nope:x"], "nope", "nope"),
                     (["--core", "lstmm"], "core", "lstmm"), (["--device", "gpu"], "device", "gpu"),
                     (["--load-vision-from", "missing.pt"], "load_vision_from", "missing.pt"),
                     (["--env", "memory:cue_delay?delay=x"], "delay", "x"),
                     (["--eval-every", "10", "--eval-episodes", "0"], "eval_episodes", "0"),
                     (["--num-workers", "2", "--acting-threads", "3"], "acting_threads", "3"),
                     (["--num-workers", "4", "--learners", "2", "--acting-threads", "3"], "acting_threads", "3"),
                     (["--envs-per-worker", "3", "--worker-splits", "2"], "worker_splits", "2"),
                     (["--backend", "ray", "--envs-per-worker", "2", "--worker-splits", "2"], "worker_splits", "ray"),
                     (["--backend", "ray", "--acting-staging", "shared"], "acting_staging", "ray"),
                     (["--sticky-actions"], "sticky_actions", "true"),
                     (["--stem", "nature"], "stem", "nature"),
                     (["--name", "a/b"], "--name", "a/b"),
                     (["--name", ""], "--name", "''"),
                     (["--freeze-vision"], "freeze_vision", "load_vision_from"),  # given empty: not the default name
                     (["--name", "a\nb"], "--name", "control character"),
                     (["--name", "a" * 300], "--name", "300 bytes long"),
                     (["--resume"], "--resume", "--name"),
                     (["--frobnicate", "3"], "--frobnicate", "3"),
                     # more memory than any machine has (the rollout store; the worker processes)
                     (["--batch-size", "1000000000"], "batch_size", "1000000000"),
                     (["--unroll-length", "1000000000"], "unroll_length", "1000000000"),
                     (["--num-workers", "100000"], "num_workers", "100000")])))
def test_train_cross_setting_and_env_checks(case):
    argv, name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run(["train", *ENV, "--runs-dir", "runs", *argv], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=bad_setting(EvaluateConfig) | st.sampled_from([("device", "gpu"), ("env", "")]),
       source=st.sampled_from(["run", "run/checkpoint.pt", "missing"]))
def test_evaluate_with_a_bad_value(case, source):
    name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run(["evaluate", source, flag(name), text(value)], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=bad_setting(PlotConfig) | st.tuples(st.just("size"), st.sampled_from(["big", "10x10", "0x800", "x"])))
def test_plot_with_a_bad_value(case):
    name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run(["plot", "run", flag(name), text(value)], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=st.one_of(
    bad_setting(BenchConfig).map(lambda c: (["bench", "throughput"], *c)),
    bad_setting(BenchConfig, exclude=("warmup",)).map(lambda c: (["bench", "envs"], *c)),
    bad_setting(TrainConfig, exclude=("total_steps", "max_seconds", "log_interval", "checkpoint_interval"))
    .map(lambda c: (["bench", "throughput", *ENV], *c)),
    st.sampled_from(["num_workers", "envs_per_worker", "backend"]).flatmap(
        lambda n: bad_values(TrainConfig.model_fields[n]).map(lambda v: (["bench", "envs"], n, v)))))
def test_bench_with_a_bad_value(case):
    prefix, name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run([*prefix, flag(name), text(value)], Path(tmp))
    names_it(message, name, value)


@SETTINGS
@given(case=st.one_of(
    st.sampled_from(["stem", "core"]).flatmap(lambda n: WORDS.filter(
        lambda w: w not in ("impala", "nature", "mlp", "auto", *core_names())).map(lambda v: (n, v))),
    st.just(("env", "no-family"))))
def test_info_with_a_bad_value(case):
    name, value = case
    with tempfile.TemporaryDirectory() as tmp:
        message = run(["info", flag(name), value], Path(tmp))
    names_it(message, name, value)


MODEL_SETTINGS = [(m, n) for m in (TrainConfig, EvaluateConfig, PlotConfig, BenchConfig) for n in typed_settings(m)]


@SETTINGS
@given(data=st.data(), which=st.sampled_from(MODEL_SETTINGS))
def test_the_strategies_only_make_bad_values(data, which):
    """Every generated value really is refused by its model (a valid one would start work)."""
    model, name = which
    value = data.draw(bad_values(model.model_fields[name], for_yaml=True))
    with pytest.raises(FwrlError, match=name):
        model.parse({name: value})
