"""Config, presets and resume rules; the command line and files go through the settings models."""

import pytest
import torch
import yaml

from fwrl.envs.registry import EnvInfo
from fwrl.errors import FwrlError
from fwrl.launch.cli import main
from fwrl.settings.config import (TrainConfig, build_config, check_resume, load_preset, preset_names,
                                         read_config, save_config)
from fwrl.runner.agent import build_model, resolve_core_options
from fwrl.runner.preflight import check_runnable


def test_every_preset_builds_a_valid_config():
    assert {"quickstart", "rfwp-atari", "srwm-procgen-easy", "srwm-procgen-memory", "r2ac-dmlab",
            "r2ac-procgen-chaser", "r2ac-atari"} <= set(preset_names())
    for name in preset_names():
        config = build_config(name, {})
        if config.env.startswith("dmlab:"):
            continue  # needs the deepmind_lab engine (docker/Dockerfile.dmlab) to describe
        if config.env.startswith("procgen:"):
            pytest.importorskip("procgen")
        if config.env.startswith("atari:"):
            pytest.importorskip("ale_py")
        check_runnable(config)


def test_rfwp_atari_preset_matches_reference_section_4():
    c = build_config("rfwp-atari", {})
    assert (c.num_workers * c.envs_per_worker, c.batch_size, c.unroll_length) == (48, 32, 50)
    assert (c.learning_rate, c.rmsprop_alpha, c.rmsprop_eps, c.rmsprop_momentum) == (6e-4, 0.99, 0.01, 0.0)
    assert (c.grad_norm_clip, c.entropy_cost, c.baseline_cost, c.discount, c.reward_clip) == (40, 0.01, 0.5, 0.99, 1)


def test_overrides_are_typed_and_core_change_drops_preset_core_options():
    c = build_config("r2ac-atari", {"total_steps": "1000", "core": "lstm"})
    assert c.total_steps == 1000 and c.core == "lstm" and c.core_options == {}
    c = build_config("r2ac-atari", {"core_options": {"hidden_size": "64"}})
    assert c.core_options == {"hidden_size": 64, "grad": "rtrl"}  # typed by the core's settings
    c = build_config("quickstart", {"core_options": {"hidden_size": 32}})
    assert c.core_options == {"forget_bias": 1.0, "hidden_size": 32}
    assert build_config("quickstart", {"core": "feedforward"}).core_options == {}
    with pytest.raises(FwrlError, match="batch_size=many .*an integer"):
        build_config(None, {"batch_size": "many"})
    with pytest.raises(FwrlError, match="quickstart"):
        load_preset("quikstart")


def test_resume_allows_budget_changes_only():
    saved = TrainConfig(env="memory:cue_delay", total_steps=100)
    assert check_resume(saved, {"total_steps": "500", "num_workers": "8"}).total_steps == 500
    with pytest.raises(FwrlError, match="learning_rate"):
        check_resume(saved, {"learning_rate": "0.1"})
    with pytest.raises(FwrlError, match="core_options"):
        check_resume(saved, {"core_options": {"hidden_size": "3"}})


# ------------------------------------------------------------------------ one source of truth

SPECIAL_FLAGS = {"core_options": "--core-opt", "env_wrappers": "--env-wrapper"}  # repeatable KEY=VALUE / MODULE:CALLABLE


def test_every_setting_has_a_flag_with_its_default_and_range_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in TrainConfig.model_fields:
        assert SPECIAL_FLAGS.get(name, "--" + name.replace("_", "-")) in text, name
    assert "--discount FLOAT discount factor gamma (default 0.99; 0 <= x <= 1)" in text
    assert "--num-workers INT env worker processes or Ray actors (default 4; x >= 1)" in text


def test_every_setting_is_reachable_from_the_command_line(capsys):
    """A valid non-default value for each setting, given as a flag, lands in the printed config."""
    values = {"env": "atari:Breakout", "core": "rdn", "stem": "nature", "sticky_actions": True,
              "full_action_space": True, "backend": "ray", "ray_address": "10.0.0.1:6379", "device": "cpu",
              "load_vision_from": "pre/checkpoint.pt", "freeze_vision": True, "truncation": "terminate", "inference_graph": True, "dist_backend": "gloo", "init": "orthogonal",
              "acting_priority": "high", "learner_process": "off", "acting_trace": "off", "stem_precision": "bfloat16",
              "rmsprop_bias_correction": True, "wandb": True, "wandb_project": "mine", "wandb_group": "sweep-1",
              "worker_splits": 1,  # the default: ray takes no splits (--worker-splits: test_cli_errors, test_worker_splits)
              "acting_staging": "pack",  # the default: ray shares no arrays (shared: test_acting_staging_reaches_the_config_with_the_local_backend)
              "env_wrappers": ["mypkg.wrappers:Scale", "mypkg.wrappers:Skip"]}
    argv = ["train", "--print-config"]
    for wrapper in values["env_wrappers"]:
        argv += ["--env-wrapper", wrapper]
    for name, info in TrainConfig.model_fields.items():
        if name in SPECIAL_FLAGS:
            continue
        if name not in values:
            default = info.default
            values[name] = default + 1 if isinstance(default, int) else round(min(default + 0.25, 0.5), 3)
        value = values[name]
        if isinstance(value, bool):
            argv.append("--" + name.replace("_", "-"))
        else:
            argv += ["--" + name.replace("_", "-"), str(value)]
    argv += ["--core-opt", "num_heads=2", "--core-opt", "head_dim=8"]
    assert main(argv) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = {**values, "env": "atari:Breakout?sticky=true&full_action_space=true",
                "core_options": {"num_heads": 2, "head_dim": 8, "output_scale": None,
                                 "head_init": None}}  # the changed defaults, pinned
    assert printed == expected
    assert TrainConfig.from_dict(printed).to_dict() == printed


def test_stem_choices_are_the_models_stems():
    from fwrl.agents.model import STEMS
    from fwrl.agents.model import INITS, STEM_PRECISIONS as MODEL_PRECISIONS
    from fwrl.settings.config import INIT_CHOICES, STEM_CHOICES, STEM_PRECISIONS

    assert set(INIT_CHOICES) == set(INITS)
    assert STEM_PRECISIONS == MODEL_PRECISIONS

    assert set(STEM_CHOICES) == {*STEMS, "auto"}


def test_num_threads_help_says_what_learner_threads_does():
    from fwrl.runner.concurrency import allowed_cores, learner_threads

    help_text = TrainConfig.model_fields["num_threads"].description
    assert "minus one per local env worker" in help_text and "at most half" in help_text
    cores = allowed_cores()
    config = TrainConfig(num_workers=1, num_threads=0)
    assert learner_threads(config) == max(1, cores - min(1, cores // 2))
    assert learner_threads(TrainConfig(num_threads=3)) == 3


def test_yaml_config_file_and_preset_file_with_flags_on_top(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text("env: memory:cue_delay?delay=3\ncore: elstm\ncore_options:\n  hidden_size: 16\n"
                    "batch_size: 4\ndiscount: 0.9\n")
    over = tmp_path / "over.yaml"
    over.write_text("batch_size: 6\ncore_options:\n  grad: rtrl\n")
    assert main(["train", "--preset", str(mine), "--config", str(over), "--discount", "0.5", "--print-config"]) == 0
    c = TrainConfig.from_dict(yaml.safe_load(capsys.readouterr().out))
    assert (c.env, c.core, c.batch_size, c.discount) == ("memory:cue_delay?delay=3", "elstm", 6, 0.5)
    assert c.core_options == {"hidden_size": 16, "grad": "rtrl"}
    assert build_config(str(mine), {"core": "lstm"}).core_options == {}  # another core drops them
    bad = tmp_path / "bad.yaml"
    bad.write_text("bach_size: 4\n")
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fwrl: error: unknown setting 'bach_size' in config file") and "batch_size" in err


def test_old_run_config_still_loads(tmp_path):
    """A config.yaml as fwrl wrote it before settings were typed (no Atari flags, string options)."""
    old = tmp_path / "config.yaml"
    fields = dict(env="atari:Pong?sticky=true", core="rdn", core_options={"num_layers": "4", "hidden_size": 256},
                  stem="auto", backend="local", ray_address="auto", num_workers=4, envs_per_worker=2,
                  step_timeout=60.0, batch_size=32, unroll_length=50, total_steps=50000000, max_seconds=0.0,
                  learning_rate=0.0006, rmsprop_alpha=0.99, rmsprop_eps=0.01, rmsprop_momentum=0.0,
                  grad_norm_clip=40.0, entropy_cost=0.01, baseline_cost=0.5, discount=0.99, reward_clip=1.0,
                  device="auto", num_threads=0, load_vision_from="", freeze_vision=False, seed=1,
                  checkpoint_interval=600.0, milestone_interval=0, log_interval=5.0, eval_every=0,
                  eval_episodes=10)
    old.write_text(yaml.safe_dump(fields, sort_keys=False))
    config = read_config(old)
    # output_scale's and head_init's defaults changed (to auto) after this config was written: it keeps the old values
    assert config.core_options == {"num_layers": 4, "hidden_size": 256, "output_scale": 1.0, "head_init": "agent"}
    assert config.sticky_actions and not config.full_action_space and config.env == "atari:Pong?sticky=true"
    save_config(config, tmp_path / "again.yaml")
    assert read_config(tmp_path / "again.yaml") == config


def test_changed_core_defaults_are_pinned_in_new_runs_and_kept_in_old_ones(tmp_path):
    """A new config records output_scale and head_init (their defaults changed to auto: None),
    training fixes auto to the values for its stem (scale 1 and small heads behind the Atari stems,
    0.1 and the agent's heads behind minatar's, 1 and the agent's behind mlp) before it writes the
    run folder, so a later change of the rule cannot alter a run; a saved config without them
    predates the change and is read back with 1 and the agent's heads."""
    new = build_config(None, {"core": "rdn"})
    assert new.core_options == {"output_scale": None, "head_init": None}
    assert build_config(None, {"core": "lstm"}).core_options == {}  # the LSTM has no such option
    save_config(new, tmp_path / "new.yaml")
    assert read_config(tmp_path / "new.yaml").core_options == {"output_scale": None, "head_init": None}
    images = EnvInfo(obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, task_names=("pong",))
    small_frames = EnvInfo(obs_shape=(4, 10, 10), obs_dtype="uint8", num_actions=6, task_names=("breakout",))
    vectors = EnvInfo(obs_shape=(7,), obs_dtype="float32", num_actions=2, task_names=("t",))
    assert resolve_core_options(new, images).core_options == {"output_scale": 1.0, "head_init": "small"}
    assert resolve_core_options(new, small_frames).core_options == {"output_scale": 0.1, "head_init": "agent"}
    assert resolve_core_options(new, vectors).core_options == {"output_scale": 1.0, "head_init": "agent"}
    assert build_model(new, images).core.head_gains == (0.01, 0.1)
    assert build_model(new, small_frames).core.output_scale == 0.1
    assert build_model(new, vectors).core.head_gains == (None, None)
    stemmed = build_config(None, {"core": "rdn", "stem": "nature", "core_options": {"output_scale": 0.5}})
    assert resolve_core_options(stemmed, images).core_options == {"output_scale": 0.5, "head_init": "small"}  # given: kept
    old = new.to_dict()
    old["core_options"] = {}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    before = {"output_scale": 1.0, "head_init": "agent"}
    assert read_config(tmp_path / "old.yaml").core_options == before
    assert check_resume(read_config(tmp_path / "old.yaml"), {"total_steps": "7"}).core_options == before
    with pytest.raises(FwrlError, match="head_init"):
        build_config(None, {"core": "rdn", "core_options": {"head_init": "tiny"}})


def test_srwm_input_follows_the_stem_and_old_runs_keep_the_raw_softmax(tmp_path):
    """The SRWM's input (Eq. 5's phi of the layer input, a LayerNorm first or not) is auto: behind
    image stems the paper's RL runs (softmax of the raw stream), behind mlp a LayerNorm and the
    identity (a softmax of the small raw stream is nearly uniform there); a given option is kept,
    the other cores' pre_norm stays on whatever the stem, and a run saved before the change reads
    back the raw softmax."""
    new = build_config(None, {"core": "srwm"})
    assert new.core_options == {"output_scale": None, "head_init": None, "input_map": None, "pre_norm": None}
    images = EnvInfo(obs_shape=(4, 84, 84), obs_dtype="uint8", num_actions=6, task_names=("pong",))
    small_frames = EnvInfo(obs_shape=(4, 10, 10), obs_dtype="uint8", num_actions=6, task_names=("breakout",))
    vectors = EnvInfo(obs_shape=(7,), obs_dtype="float32", num_actions=2, task_names=("t",))
    srwm_input = lambda config, info: {k: resolve_core_options(config, info).core_options[k]
                                       for k in ("input_map", "pre_norm")}
    assert srwm_input(new, images) == srwm_input(new, small_frames) == {"input_map": "softmax", "pre_norm": False}
    assert srwm_input(new, vectors) == {"input_map": "identity", "pre_norm": True}
    model = build_model(new, vectors)
    layers = [m for m in model.modules() if hasattr(m, "input_map")]
    assert layers and all(m.input_map == "identity" for m in layers)
    assert isinstance(model.core.blocks[0].norm1, torch.nn.LayerNorm)
    assert not isinstance(build_model(new, images).core.blocks[0].norm1, torch.nn.LayerNorm)
    given = build_config(None, {"core": "fake_sr", "core_options": {"input_map": "softmax", "pre_norm": False}})
    assert srwm_input(given, vectors) == {"input_map": "softmax", "pre_norm": False}
    delta = build_config(None, {"core": "delta_net"})
    assert "input_map" not in delta.core_options and "pre_norm" not in delta.core_options
    assert resolve_core_options(delta, images).core_options.get("pre_norm", True) is True
    old = new.to_dict()
    old["core_options"] = {}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    assert {k: read_config(tmp_path / "old.yaml").core_options[k] for k in ("input_map", "pre_norm")} == {
        "input_map": "softmax", "pre_norm": False}


def test_atari_flags_are_settings_that_survive_resume():
    c = build_config(None, {"env": "atari:Pong", "sticky_actions": True})
    assert c.env == "atari:Pong?sticky=true" and c.sticky_actions
    assert check_resume(c, {"sticky_actions": True, "total_steps": "5"}).sticky_actions
    assert check_resume(c, {}).env == "atari:Pong?sticky=true"
    plain = build_config(None, {"env": "atari:Pong"})
    with pytest.raises(FwrlError, match="sticky_actions \\(run has False\\)"):
        check_resume(plain, {"sticky_actions": True})
    with pytest.raises(FwrlError, match="full_action_space=true contradicts"):
        build_config(None, {"env": "atari:Pong?full_action_space=false", "full_action_space": True})
    with pytest.raises(FwrlError, match="atari envs only"):
        build_config(None, {"env": "memory:cue_delay", "sticky_actions": True})


def test_resume_compares_core_options_by_value():
    saved = build_config(None, {"env": "memory:cue_delay", "core_options": {"hidden_size": "256"}})
    assert check_resume(saved, {"core_options": {"hidden_size": "256"}}).core_options == {"hidden_size": 256}
    assert check_resume(build_config(None, {"env": "memory:cue_delay"}), {"core_options": {"num_layers": 1}})


def test_core_options_are_typed_with_ranges_and_name_the_valid_ones():
    from fwrl.memory_modules import build_core

    with pytest.raises(FwrlError, match="unknown core option 'hidden' of core rdn; valid choices: dropout, "):
        build_core("rdn", 9, {"hidden": 3})
    for options, pattern in [({"head_dim": "-1"}, "head_dim=-1 .*x >= 1"), ({"dropout": "1"}, "dropout=1 .*0 <= x < 1"),
                             ({"num_layers": "0"}, "num_layers=0"), ({"hidden_size": "2.5"}, "hidden_size=2.5 .*whole"),
                             ({"feature_map": "relu"}, "'relu' .*elu1_sumnorm, softmax, dpfp-1")]:
        with pytest.raises(FwrlError, match=pattern):
            build_core("rdn", 9, options)


def test_env_options_use_the_same_rules():
    from fwrl.envs.registry import resolve

    spec, family = resolve("memory:cue_delay?delay=1e1")
    assert family.validate(spec)["delay"] == 10
    for text, pattern in [("memory:cue_delay?delay=2.5", "delay=2.5 .*whole number"),
                          ("memory:assoc_recall?replacement=maybe", "replacement=maybe .*true or false"),
                          ("memory:cue_delay?delay=nan", "delay=nan")]:
        with pytest.raises(FwrlError, match=pattern):
            resolve(text)


def test_bench_throughput_builds_its_config_like_train(monkeypatch, capsys):
    import fwrl.launch.bench.throughput as bench

    seen = []
    monkeypatch.setattr(bench, "bench_throughput", lambda config, seconds, warmup, **window: seen.append(
        (config, seconds, warmup)) or 0)
    flags = ["--env", "memory:cue_delay", "--stem", "mlp", "--core", "rdn", "--core-opt", "num_layers=1",
             "--device", "cpu", "--batch-size", "4", "--seed", "3"]
    assert main(["bench", "throughput", *flags, "--seconds", "2", "--warmup", "1"]) == 0
    config, seconds, warmup = seen.pop()
    assert (seconds, warmup) == (2.0, 1.0)
    assert main(["train", *flags, "--num-workers", "4", "--envs-per-worker", "1", "--unroll-length", "80",
                 "--print-config"]) == 0
    assert config == TrainConfig.from_dict(yaml.safe_load(capsys.readouterr().out))
    assert main(["bench", "throughput", "--env", "memory:cue_delay", "--stem", "mlp"]) == 0
    config, seconds, warmup = seen.pop()
    assert (config.core, config.num_workers, config.envs_per_worker, config.batch_size, config.unroll_length,
            seconds, warmup) == ("lstm", 4, 1, 8, 80, 60.0, 15.0)
    assert main(["bench", "throughput", "--preset", "quickstart", "--seconds", "1"]) == 0
    assert seen.pop()[0] == build_config("quickstart", {})


def test_preflight_refuses_before_the_run_folder_exists(tmp_path, read_only, capsys):
    from fwrl.runner.preflight import check_runnable

    runs = tmp_path / "runs"
    base = ["train", "--env", "memory:cue_delay", "--runs-dir", str(runs), "--name", "r"]
    for extra, pattern in [(["--stem", "nature"], "stem 'nature' does not fit the observations of memory:cue_delay"),
                           (["--load-vision-from", str(tmp_path / "none.pt")], "load_vision_from"),
                           (["--device", "cuda:7"], "cuda:7")]:
        assert main([*base, *extra]) == 2
        assert pattern in capsys.readouterr().err
    assert not runs.exists()
    # a resumed run does not read load_vision_from again: a moved checkpoint is no error then
    config = build_config(None, {"env": "memory:cue_delay", "load_vision_from": str(tmp_path / "none.pt")})
    check_runnable(config, resume=True)
    tmp_path.joinpath("ro").mkdir()
    read_only(tmp_path / "ro")
    assert main([*base[:3], "--runs-dir", str(tmp_path / "ro")]) == 2
    assert "not writable (Permission denied)" in capsys.readouterr().err
    assert list((tmp_path / "ro").iterdir()) == []


def test_evaluate_leaves_its_workers_their_cores(tmp_path, monkeypatch):
    """``fwrl evaluate`` sets torch's threads by the learner's rule, not torch's every-core default (which
    made a Pong evaluation 15-20x slower on 2 busy cores)."""
    import torch

    from fwrl.runner import concurrency

    monkeypatch.setattr(concurrency, "allowed_cores", lambda: 8)
    assert concurrency.torch_threads(0, 2, "local") == 6 and concurrency.torch_threads(0, 16, "local") == 4
    assert concurrency.torch_threads(0, 16, "ray") == 8 and concurrency.torch_threads(5, 2, "local") == 5
    run, threads = tmp_path / "run", torch.get_num_threads()
    assert main(["train", "--env", "memory:cue_delay?delay=2", "--core", "feedforward", "--total-steps", "64",
                 "--batch-size", "2", "--unroll-length", "4", "--num-workers", "1", "--envs-per-worker", "1",
                 "--runs-dir", str(tmp_path), "--name", "run"]) == 0
    torch.set_num_threads(threads)  # the training set this process's threads: put them back
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    assert main(["evaluate", str(run), "--episodes", "2", "--num-workers", "2"]) == 0
    assert seen == [6], seen


def test_acting_staging_reaches_the_config_with_the_local_backend(capsys):
    """``--acting-staging shared`` (refused with Ray: test_cli_errors' cross-setting checks)."""
    assert main(["train", "--print-config", "--acting-staging", "shared"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["acting_staging"] == "shared"


def test_a_preset_gives_its_per_core_settings_to_that_core_under_every_later_layer(tmp_path):
    preset = tmp_path / "family.yaml"
    preset.write_text("env: memory:cue_delay?delay=2\ncore: lstm\ncore_options:\n  forget_bias: 1.0\n"
                      "learning_rate: 0.004\nbatch_size: 8\n"
                      "per_core:\n  srwm:\n    learning_rate: 0.001\n    core_options:\n      num_layers: 1\n"
                      "  lstm:\n    batch_size: 4\n")
    lstm = build_config(str(preset), {})
    assert (lstm.learning_rate, lstm.batch_size, lstm.core_options) == (0.004, 4, {"forget_bias": 1.0})
    srwm = build_config(str(preset), {"core": "srwm"})
    assert (srwm.learning_rate, srwm.batch_size, srwm.core_options["num_layers"]) == (0.001, 8, 1)
    assert "forget_bias" not in srwm.core_options  # the preset's own core's options stay with it
    assert build_config(str(preset), {"core": "srwm", "learning_rate": "0.002"}).learning_rate == 0.002  # a flag wins
    mine = tmp_path / "mine.yaml"
    mine.write_text("learning_rate: 0.003\nper_core:\n  srwm:\n    batch_size: 2\n")
    srwm = build_config(str(preset), {"core": "srwm"}, config_file=mine)
    assert (srwm.learning_rate, srwm.batch_size) == (0.003, 2)  # --config over the preset's per-core
    assert build_config(str(preset), {"core": "gru"}).learning_rate == 0.004  # no entry: the preset's own


def test_the_popgym_preset_gives_the_fast_weight_cores_their_rate(capsys):
    assert main(["train", "--preset", "popgym", "--core", "srwm", "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["learning_rate"] == 0.001
    assert "the popgym preset's settings for srwm (its per_core): learning_rate 0.001" in err
    assert main(["train", "--preset", "popgym", "--core", "srwm", "--learning-rate", "0.002", "--print-config"]) == 0
    assert "per_core" not in capsys.readouterr().err  # the flag's rate, not the preset's: nothing to say
    assert build_config("popgym", {}).learning_rate == 0.004
    for core in ("srwm", "gated_delta_net", "delta_net", "rdn"):
        assert build_config("popgym", {"core": core}).learning_rate == 0.001
    for core in ("gru", "lstm", "feedforward"):
        assert build_config("popgym", {"core": core}).learning_rate == 0.004


@pytest.mark.parametrize("text, names", [
    ("per_core: 3\n", ["per_core in preset file", "mapping of cores"]),
    ("per_core:\n  srwn:\n    batch_size: 4\n", ["unknown core 'srwn'", "srwm"]),
    ("per_core:\n  srwm: 4\n", ["per_core.srwm in preset file", "not a mapping"]),
    ("per_core:\n  srwm:\n    bach_size: 4\n", ["unknown setting 'bach_size' in per_core.srwm", "batch_size"]),
    ("per_core:\n  srwm:\n    core: lstm\n", ["unknown setting 'core' in per_core.srwm"]),
])
def test_bad_per_core_settings_are_refused_naming_the_choices(tmp_path, text, names):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(FwrlError) as error:
        build_config(str(bad), {})
    for name in names:
        assert name in str(error.value)
