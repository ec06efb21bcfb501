"""The popgym family: POPGym's tasks (Morad et al. 2023) with its baselines' observation protocol,
the package's episode ends and seeds, bad names and options refused in one line before anything
starts, and its metric, MMER, in fwrl report (aggregates and CIs through the report's machinery).

The env tests need the ``popgym`` package and skip without it; the MMER and report tests do not."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fwrl.errors import FwrlError
from fwrl.evaluation.scores import MMER_WINDOW, mmer, normalisation_kind, normalise

needs_popgym = pytest.mark.skipif(importlib.util.find_spec("popgym") is None,
                                  reason="popgym is not installed (pip install -e '.[popgym]')")


def _play(spec: str, seed: int, actions, worker_index: int = 0):
    """Observations, rewards and (terminated, truncated) of one episode of ``spec`` under ``actions``
    (cycled), as a worker's env gives them."""
    from fwrl.envs.registry import make_env

    env = make_env(spec, seed=seed, worker_index=worker_index)
    obs, _ = env.reset()
    observations, rewards = [np.asarray(obs, np.float32)], []
    for t in range(100_000):
        obs, reward, terminated, truncated, _ = env.step(actions[t % len(actions)])
        observations.append(np.asarray(obs, np.float32))
        rewards.append(float(reward))
        if terminated or truncated:
            env.close()
            return observations, rewards, (terminated, truncated)
    raise AssertionError(f"{spec}: no episode end in 100,000 steps")


# ----------------------------------------------------------------------------- specs and refusals

@needs_popgym
def test_short_names_difficulty_and_several_games():
    from fwrl.envs.env_group import spec_task_index
    from fwrl.envs.registry import describe_env, make_env

    def made(spec, worker=0):
        return type(make_env(spec, worker_index=worker).unwrapped).__name__

    assert made("popgym:RepeatFirst") == "RepeatFirstEasy"  # easy by default
    assert made("popgym:RepeatFirst?difficulty=medium") == "RepeatFirstMedium"
    assert made("popgym:CountRecall?difficulty=hard") == "CountRecallHard"
    spec = "popgym:RepeatFirst+RepeatPrevious?difficulty=hard"  # ProcGen's convention: worker i plays game i mod n
    assert [made(spec, w) for w in range(3)] == ["RepeatFirstHard", "RepeatPreviousHard", "RepeatFirstHard"]
    assert [spec_task_index(spec, w) for w in range(3)] == [0, 1, 0]
    info = describe_env(spec)
    assert info.task_names == ("RepeatFirst", "RepeatPrevious") and info.obs_shape == (10,)
    # the three cart-poles agree in what the agent sees (a vector of 6, 2 actions), bounds aside
    assert describe_env("popgym:PositionOnlyCartPole+VelocityOnlyCartPole+NoisyPositionOnlyCartPole").obs_shape == (6,)


@needs_popgym
@pytest.mark.parametrize("spec,parts", [
    ("popgym:RepeatFrist", ["unknown popgym game 'RepeatFrist'", "did you mean RepeatFirst",
                            "valid choices: Autoencode"]),
    ("popgym:countrecall", ["did you mean CountRecall?"]),
    ("popgym:RepeatFirstHard", ["did you mean popgym:RepeatFirst?difficulty=hard"]),
    ("popgym:popgym-CountRecallMedium-v0", ["did you mean popgym:CountRecall?difficulty=medium"]),
    ("popgym:PositionOnlyPendulum", ["its action is continuous", "valid choices: Autoencode"]),
    ("popgym:RepeatFirst?difficulty=Medium", ["difficulty 'Medium'", "did you mean difficulty=medium?",
                                              "valid choices: easy, hard, medium."]),
    ("popgym:RepeatFirst?difficulty=extreme", ["difficulty 'extreme'", "valid choices: easy, hard, medium."]),
    ("popgym:RepeatFirst?protocol=markov", ["protocol 'markov'", "valid choices: baseline, raw."]),
    ("popgym:RepeatFirst?level=3", ["unknown option for popgym envs 'level'", "difficulty, protocol"]),
    ("popgym:RepeatFirst+CountRecall", ["same observation and action sizes", "RepeatFirst: observations 10, actions 4",
                                        "CountRecall: observations 33, actions 27",
                                        "Games that agree at difficulty easy: ", "RepeatFirst+RepeatPrevious"]),
])
def test_bad_names_options_and_mixed_sizes_are_one_line_errors(spec, parts):
    from fwrl.envs.registry import check_installed, describe_env

    for check in (check_installed, describe_env):
        with pytest.raises(FwrlError) as caught:
            check(spec)
        message = str(caught.value)
        assert "\n" not in message and all(p in message for p in parts), message
    if "did you mean" not in " ".join(parts):
        assert "did you mean" not in message  # nothing close: no guess


@needs_popgym
def test_the_command_line_refuses_a_bad_spec_before_anything_starts(tmp_path, monkeypatch):
    import fwrl.runner.train as train
    from fwrl.launch.cli import main

    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("training started for a bad spec"))
    for spec, said in (("popgym:RepeatFrist", "did you mean RepeatFirst"),
                       ("popgym:RepeatFirst?difficulty=hardd", "did you mean difficulty=hard")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["train", "--env", spec, "--runs-dir", str(tmp_path / "runs")])
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("fwrl: error:") and said in lines[0], lines
        assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- the observation protocol

@needs_popgym
def test_the_baseline_protocol_adds_the_previous_action_and_a_first_step_flag():
    """RepeatPrevious: the card (one-hot of 4), the previous action (one-hot of 4; the null action 0
    at the first step), the first-step flag (one-hot of 2: [0, 1] is 1). After an episode the next
    one starts with the flag set and the null action again."""
    actions = [2, 3, 1, 0, 3]
    observations, _, _ = _play("popgym:RepeatPrevious", 3, actions)
    first, *rest = observations
    assert first.shape == (10,) and first[4:8].tolist() == [1, 0, 0, 0] and first[8:].tolist() == [0, 1]
    for t, obs in enumerate(rest):
        assert obs[4:8].argmax() == actions[t % len(actions)] and obs[4:8].sum() == 1  # what the agent did
        assert obs[8:].tolist() == [1, 0]  # not the first step
    from fwrl.envs.registry import describe_env, make_env

    env = make_env("popgym:RepeatPrevious", seed=3)
    env.reset()
    for t in range(len(rest)):
        obs, _, terminated, truncated, _ = env.step(actions[t % len(actions)])
    assert terminated and np.asarray(env.reset()[0])[8:].tolist() == [0, 1]  # a new episode: flagged again
    assert describe_env("popgym:RepeatPrevious?protocol=raw").obs_shape == (4,)  # the card alone
    raw, _, _ = _play("popgym:RepeatPrevious?protocol=raw", 3, actions)
    assert all(np.array_equal(a[:4], b) for a, b in zip(observations, raw))  # the same cards, nothing added


@needs_popgym
def test_the_protocol_with_a_vector_observation_and_a_multi_discrete_action():
    from fwrl.envs.registry import describe_env

    # the cart's position and the pole's angle (2), the previous action (one-hot of 2), the flag (2)
    observations, _, _ = _play("popgym:PositionOnlyCartPole", 0, [1])
    assert observations[0][2:].tolist() == [1, 0, 0, 1] and observations[1][2:].tolist() == [0, 1, 1, 0]
    # Battleship: a hit or miss (one-hot of 2), the previous shot (one-hot of 8 + one-hot of 8), the flag (2)
    info = describe_env("popgym:Battleship")
    assert info.obs_shape == (20,) and info.action_dims == (8, 8)
    observations, _, _ = _play("popgym:Battleship", 0, [np.array([5, 2])])
    assert observations[1][2:10].argmax() == 5 and observations[1][10:18].argmax() == 2
    assert observations[0][18:].tolist() == [0, 1] and observations[1][18:].tolist() == [1, 0]


# ----------------------------------------------------------------------------- episodes and seeds

@needs_popgym
@pytest.mark.parametrize("game", ["Autoencode", "Battleship", "Concentration", "CountRecall", "HigherLower",
                                  "MineSweeper", "MultiarmedBandit", "NoisyPositionOnlyCartPole",
                                  "PositionOnlyCartPole", "RepeatFirst", "RepeatPrevious", "VelocityOnlyCartPole"])
def test_episodes_end_as_the_package_ends_them_with_returns_in_its_bounds(game):
    from fwrl.envs.registry import make_env

    env = make_env(f"popgym:{game}", seed=1)
    n = int(np.prod(env.action_space.nvec)) if hasattr(env.action_space, "nvec") else env.action_space.n
    actions = np.random.default_rng(0).integers(n, size=997)
    if hasattr(env.action_space, "nvec"):
        actions = [np.array(np.unravel_index(a, env.action_space.nvec)) for a in actions]
    _, rewards, (terminated, truncated) = _play(f"popgym:{game}", 1, actions)
    assert terminated or truncated
    low = 0.0 if "CartPole" in game else -1.0  # the package's scaling (popgym/envs/*.py)
    assert low - 1e-9 <= sum(rewards) <= 1.0 + 1e-9


@needs_popgym
def test_terminations_and_truncations_reach_the_step_record_as_the_package_says():
    """RepeatFirst ends when its deck is dealt (a termination: no bootstrap); MultiarmedBandit at its
    episode length (the package calls it a truncation: the worker keeps the last observation to
    bootstrap from). Lengths are the package's: 51 / 831 steps (1 and 16 decks), 200 / 600 pulls."""
    from fwrl.envs.env_group import EnvGroup
    from fwrl.envs.step_record import DONE, FINAL_OBS, TRUNCATED, StepRecord
    from fwrl.envs.worker_pool import PoolSettings

    for spec, length, cut in (("popgym:RepeatFirst", 51, False), ("popgym:RepeatFirst?difficulty=hard", 831, False),
                              ("popgym:MultiarmedBandit", 200, True),
                              ("popgym:MultiarmedBandit?difficulty=hard", 600, True)):
        group = EnvGroup(PoolSettings(spec, 1, 2, seed=5), 0)
        out = StepRecord.of(group.envs[0].observation_space.shape, "float32").allocate(2)
        group.reset(out)
        for t in range(1, length + 1):
            finished = group.step(np.array([1, 2]), out)
            assert bool(out[DONE].any()) == (t == length) and (not finished) == (t < length), (spec, t)
        assert out[DONE].all() and out[TRUNCATED].tolist() == [cut, cut], spec
        assert out[FINAL_OBS].any(axis=1).tolist() == [cut, cut]  # the cut episode's last observation
        assert [r.episode_step for r in finished] == [length, length]
        assert all(abs(r.episode_return) <= 1 + 1e-9 for r in finished)
        group.close()


@needs_popgym
def test_a_seed_repeats_the_episodes_and_seeds_differ():
    actions = list(np.random.default_rng(0).integers(4, size=60))
    a = _play("popgym:RepeatFirst?difficulty=medium", 7, actions)
    b = _play("popgym:RepeatFirst?difficulty=medium", 7, actions)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0])) and a[1] == b[1]
    firsts = {_play("popgym:HigherLower", s, [0])[0][0].tobytes() for s in range(8)}
    assert len(firsts) > 1, "the first card differs between seeds"


# ----------------------------------------------------------------------------- MMER

def test_mmer_is_the_best_mean_over_rows_whose_window_is_full():
    means = [0.9, math.nan, 0.2, 0.5, 0.4, 0.45]
    episodes = [3, 60, 100, 150, 300, None]  # the first row's mean is of 3 episodes: luck, not counted
    assert mmer(means, episodes) == mmer(means, episodes, window=MMER_WINDOW)
    best = mmer(means, episodes)
    assert (best.value, best.rows, best.full) == (0.5, 3, True)
    best = mmer(means, episodes, tasks=2)  # two games share the episodes: 200 before each window is full
    assert (best.value, best.rows, best.full) == (0.4, 1, True)
    best = mmer([0.1, 0.3, 0.2], [10, 20, 30])  # no full window in the whole run: the best of what there is
    assert (best.value, best.rows, best.full) == (0.3, 3, False)
    assert mmer([math.nan, math.nan], [1, 2]) is None
    assert mmer([-0.7, -0.2, -0.4], [100, 200, 300]).value == -0.2  # returns below 0 (POPGym's lie in [-1, 1])


def test_popgym_scores_are_normalised_as_popgym_scales_them():
    assert normalisation_kind("popgym") == "popgym"
    assert normalise("popgym", "RepeatFirst", -0.25) == -0.25 and normalise("popgym", "CountRecall", 0.75) == 0.75


def _run(folder: Path, env: str, core: str, seed: int, rows: list[dict], evaluation: float | None = None) -> Path:
    """A run folder as fwrl train (and fwrl evaluate) leave it, with these metrics rows."""
    from fwrl.settings.config import TrainConfig, config_yaml

    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(config_yaml(TrainConfig.from_dict(
        {"env": env, "core": core, "seed": seed, "total_steps": 1000})))
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    if evaluation is not None:
        task = env.split(":", 1)[1].split("?")[0]
        (folder / "evaluation.json").write_text(json.dumps({"env": env, "aggregates": [
            {"task": task, "split": "test", "repeats": 1, "episodes": 30, "mean": evaluation}]}))
    return folder


def _curve(values: list[float], start_episodes: int = 50) -> list[dict]:
    return [{"time": i, "agent_steps": 1000 * (i + 1), "episodes": start_episodes * (i + 1), "mean_return": v}
            for i, v in enumerate(values)]


def test_a_popgym_run_is_scored_by_mmer_even_when_evaluated(tmp_path):
    from fwrl.launch.report.collect import load_run

    values = [0.95, -0.5, 0.8, 0.2]  # the first row (50 episodes) is not a full window
    evaluated = _run(tmp_path / "p", "popgym:RepeatFirst", "gru", 1, _curve(values), evaluation=0.1)
    (score,) = load_run(evaluated).scores.values()
    assert (score.value, score.source, score.note) == (0.8, "mmer", "")
    (score,) = load_run(_run(tmp_path / "m", "memory:cue_delay", "gru", 1, _curve(values))).scores.values()
    assert (score.value, score.source) == (0.2, "training")  # other families: the last mean
    (score,) = load_run(_run(tmp_path / "e", "memory:cue_delay", "gru", 1, _curve(values), 0.1)).scores.values()
    assert (score.value, score.source) == (0.1, "evaluation")
    (score,) = load_run(_run(tmp_path / "s", "popgym:RepeatFirst", "gru", 1, _curve([0.3, 0.6], 10))).scores.values()
    assert score.value == 0.6 and "fewer than 100 episodes" in score.note
    # a multi-task run: each game's MMER from its own column
    rows = [{"agent_steps": 1000 * (i + 1), "episodes": 150 * (i + 1), "mean_return": 0.0,
             "return/RepeatFirst": a, "return/RepeatPrevious": b}
            for i, (a, b) in enumerate([(0.9, 0.9), (0.1, 0.3), (0.4, 0.2), (0.2, 0.25)])]
    run = load_run(_run(tmp_path / "mt", "popgym:RepeatFirst+RepeatPrevious?difficulty=medium", "gru", 1, rows))
    assert {game: s.value for game, s in run.scores.items()} == {
        "popgym:RepeatFirst?difficulty=medium": 0.4, "popgym:RepeatPrevious?difficulty=medium": 0.3}


def test_report_aggregates_the_mmers_of_popgym_runs(tmp_path):
    """Two groups x two games x four seeds: per-game means and the IQM over the MMERs (POPGym's
    normalisation keeps them as they are), with the report's bootstrap CIs."""
    pytest.importorskip("rliable", reason="fwrl report needs rliable (pip install -e '.[report]')")
    from scipy import stats

    from fwrl.launch.cli import main

    rng = np.random.default_rng(3)
    games = ("RepeatFirst", "CountRecall")
    best = {core: {g: rng.uniform(-0.6, 0.9, 4) for g in games} for core in ("gru", "lstm")}
    for core, per in best.items():
        for game, values in per.items():
            for seed, value in enumerate(values, start=1):
                curve = [value + 0.5, value - 0.3, value, value - 0.1]  # a lucky first row, then the best
                _run(tmp_path / "runs" / f"{game}-{core}-{seed}", f"popgym:{game}", core, seed, _curve(curve),
                     evaluation=value - 0.2 if seed == 1 else None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--reps", "500"])
    assert code == 0, err.getvalue()
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    rows = {(r["game"], r["group"]): r for r in report["per_game"]}
    for core, per in best.items():
        for game, values in per.items():
            row = rows[(f"popgym:{game}", core)]
            assert row["scores"] == pytest.approx(list(values)) and row["sources"] == ["mmer"]
            assert row["mean"] == pytest.approx(values.mean())
            assert row["normalised_mean"] == pytest.approx(values.mean())
            assert row["ci"][0] < values.mean() < row["ci"][1]
        matrix = np.stack([per[g] for g in ("RepeatFirst", "CountRecall")], axis=1)
        result = report["aggregates"]["groups"][core]
        assert result["IQM"]["point"] == pytest.approx(stats.trim_mean(matrix, 0.25, axis=None))
        assert result["IQM"]["low"] <= result["IQM"]["point"] <= result["IQM"]["high"]
    assert sorted(report["aggregates"]["games"]) == ["popgym:CountRecall", "popgym:RepeatFirst"]
    assert {g["normalisation"] for g in report["games"]} == {"popgym"}
    assert "(n=4, MMER)" in out.getvalue() and "MMER: POPGym's metric" in out.getvalue()


# ----------------------------------------------------------------------------- training

@needs_popgym
def test_a_multi_task_run_logs_each_games_returns(tmp_path):
    from fwrl.runner.train import train
    from fwrl.settings.config import build_config

    config = build_config("popgym", {"env": "popgym:RepeatFirst+RepeatPrevious", "core": "gru",
                                     "core_options": {"hidden_size": 16}, "num_workers": 2, "envs_per_worker": 2,
                                     "batch_size": 2, "unroll_length": 20, "total_steps": 800, "log_interval": 0.5,
                                     "checkpoint_interval": 1e9})
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "budget"
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    last = rows[-1]
    for game in ("RepeatFirst", "RepeatPrevious"):
        assert -1 <= float(last[f"return/{game}"]) <= 1 and float(last[f"normalised/{game}"]) == float(
            last[f"return/{game}"])
    assert int(last["episodes"]) >= 8  # 4 envs acted at least 200 steps each: 3 episodes of 51 steps apiece


# ----------------------------------------------------------------------------- the popgym stem

def test_the_popgym_stem_is_popgyms_encoder_and_reads_vectors_only():
    """POPGym's baselines' encoder (Linear 128, LayerNorm without affine parameters, Linear 128,
    LeakyReLU): its parameters, its LayerNorm's output, a core behind it reading 128 features plus the
    reward, and frames refused in one line naming the stems that fit."""
    import torch

    from fwrl.agents.model import AgentNet, PopGymStem, make_stem

    stem = make_stem("popgym", (10,))
    assert isinstance(stem, PopGymStem) and stem.out_size == 128
    assert sum(p.numel() for p in stem.parameters()) == (10 * 128 + 128) + (128 * 128 + 128)
    torch.manual_seed(0)
    x = torch.randn(5, 10) * 100 + 7
    normed = stem.net[1](stem.net[0](x))
    torch.testing.assert_close(normed.mean(-1), torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(normed.std(-1, unbiased=False), torch.ones(5), atol=1e-3, rtol=0)
    assert stem(x).shape == (5, 128)
    agent = AgentNet((10,), 4, core="gru", core_options={"hidden_size": 8}, stem="popgym")
    assert agent.core.gru.input_size == 128 + 1  # stem features and the reward
    with pytest.raises(FwrlError, match="stem 'popgym' does not fit.*Stems that fit: impala"):
        make_stem("popgym", (3, 64, 64))
