"""The popgym family: POPGym's tasks (Morad et al. 2023) with its baselines' observation protocol,
refused names and options, and its metric (MMER) in fwrl report."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from fwrl.envs.registry import describe_env, make_env
from fwrl.errors import FwrlError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("popgym") is None,
                                reason="popgym is not installed (pip install -e '.[popgym]')")


@pytest.mark.parametrize("spec,message", [
    ("popgym:RepeatFrist", "unknown popgym game 'RepeatFrist'; valid choices: Autoencode"),
    ("popgym:RepeatFirst?difficulty=extreme", "difficulty 'extreme'; valid choices: easy, hard, medium"),
    ("popgym:RepeatFirst?protocol=markov", "protocol 'markov'; valid choices: baseline, raw"),
    ("popgym:RepeatFirst?level=3", "unknown option for popgym envs 'level'"),
    ("popgym:RepeatFirst+CountRecall", "one multi-task agent needs games with the same observations and actions"),
])
def test_bad_names_options_and_mixed_spaces_are_one_line_errors(spec, message):
    with pytest.raises(FwrlError, match=message.replace("(", r"\(").replace("?", r"\?")) as caught:
        describe_env(spec)
    assert "\n" not in str(caught.value)


def test_the_baseline_protocol_adds_the_previous_action_and_a_first_step_flag():
    env = make_env("popgym:RepeatPrevious", seed=3)
    obs, _ = env.reset()
    first = np.asarray(obs, dtype=np.float32)
    # the layout's vector: the card (one-hot of 4), the previous action (one-hot of 4), the flag (one-hot of 2)
    assert first.shape == (10,) and first[4:8].tolist() == [1, 0, 0, 0] and first[8:].tolist() == [0, 1]
    for action in (2, 3, 1):
        obs, *_ = env.step(action)
        step = np.asarray(obs, dtype=np.float32)
        assert step[4:8].argmax() == action and step[8:].tolist() == [1, 0]  # what the agent did, not first
    assert describe_env("popgym:RepeatPrevious?protocol=raw").obs_shape == (4,)


def test_difficulty_picks_the_packages_class_and_its_episode_length():
    lengths = {}
    for difficulty in ("easy", "hard"):
        env = make_env(f"popgym:RepeatFirst?difficulty={difficulty}", seed=0)
        env.reset()
        steps, done = 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            steps, done = steps + 1, terminated or truncated
            assert abs(reward) <= 1.0
        assert terminated and not truncated  # the deck ran out: the task's own end
        lengths[difficulty] = steps
    assert lengths["hard"] > lengths["easy"]  # more decks, a longer memory


def test_popgym_runs_are_scored_by_mmer_and_normalised_as_popgym_scales_them(tmp_path):
    """fwrl report's score of a POPGym run is the best mean return over training (MMER), of another
    family's run the last one; POPGym's returns count as they are (already in [-1, 1])."""
    from fwrl.evaluation.scores import normalisation_kind, normalise
    from fwrl.launch.report.collect import load_run
    from fwrl.settings.config import TrainConfig, save_config

    for env, expected in (("popgym:RepeatFirst", 0.8), ("memory:cue_delay", 0.2)):
        run = tmp_path / env.replace(":", "-")
        run.mkdir()
        save_config(TrainConfig(env=env, core="gru"), run / "config.yaml")
        (run / "metrics.csv").write_text("agent_steps,episodes,mean_return\n100,5,-0.5\n200,9,0.8\n300,14,0.2\n")
        (score,) = load_run(run).scores.values()
        assert score.value == pytest.approx(expected)
    assert normalisation_kind("popgym") == "popgym" and normalise("popgym", "RepeatFirst", -0.25) == -0.25


def test_an_agent_trains_on_a_popgym_task(tmp_path):
    from fwrl.runner.train import train
    from fwrl.settings.config import build_config

    config = build_config("popgym", {"env": "popgym:RepeatPrevious", "core": "gru", "core_options": {"hidden_size": 16},
                                     "num_workers": 1, "envs_per_worker": 2, "batch_size": 2, "unroll_length": 10,
                                     "total_steps": 200, "log_interval": 1e9, "checkpoint_interval": 1e9})
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "budget" and result.updates >= 10
