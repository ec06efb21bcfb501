"""An env family's own settings (the learning suite's, for MinAtar): ``fwrl train`` and ``fwrl
sweep`` give every core of the family the settings ``benchmarks/learning/minatar-cpu.yaml`` ran,
and flags, presets, config files and other families keep theirs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runs import run_cli, tiny_sweep

REPO = Path(__file__).resolve().parents[2]


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
