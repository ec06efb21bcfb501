"""Config, presets and resume rules."""

import pytest

from fwrl.errors import FwrlError
from fwrl.launch.cli import _validate
from fwrl.launch.config import TrainConfig, build_config, check_resume, load_preset, preset_names


def test_every_preset_builds_a_valid_config():
    assert {"quickstart", "rfwp-atari", "srwm-procgen-easy", "srwm-procgen-memory", "r2ac-dmlab",
            "r2ac-procgen-chaser", "r2ac-atari"} <= set(preset_names())
    for name in preset_names():
        config = build_config(name, {})
        if config.env.startswith("dmlab:"):
            continue  # needs the deepmind_lab engine (docker/Dockerfile.dmlab) to describe
        if config.env.startswith("procgen:"):
            pytest.importorskip("procgen")
        _validate(config)


def test_rfwp_atari_preset_matches_reference_section_4():
    c = build_config("rfwp-atari", {})
    assert (c.num_workers * c.envs_per_worker, c.batch_size, c.unroll_length) == (48, 32, 50)
    assert (c.learning_rate, c.rmsprop_alpha, c.rmsprop_eps, c.rmsprop_momentum) == (6e-4, 0.99, 0.01, 0.0)
    assert (c.grad_norm_clip, c.entropy_cost, c.baseline_cost, c.discount, c.reward_clip) == (40, 0.01, 0.5, 0.99, 1)


def test_overrides_are_typed_and_core_change_drops_preset_core_options():
    c = build_config("r2ac-atari", {"total_steps": "1000", "core": "lstm"})
    assert c.total_steps == 1000 and c.core == "lstm" and c.core_options == {}
    c = build_config("r2ac-atari", {"core_options": {"hidden_size": "64"}})
    assert c.core_options == {"hidden_size": "64", "grad": "rtrl"}
    c = build_config("quickstart", {"core_options": {"hidden_size": 32}})
    assert c.core_options == {"forget_bias": 1.0, "hidden_size": 32}
    assert build_config("quickstart", {"core": "feedforward"}).core_options == {}
    with pytest.raises(FwrlError, match="needs a int"):
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
