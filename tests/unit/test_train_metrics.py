"""Training metrics: normalised returns per family."""

import pytest

from fwrl.envs.worker_pool import EpisodeRecord
from fwrl.runner.run_metrics import Episodes, normaliser


def test_atari_human_normalised_return():
    episodes = Episodes(("Pong",), normalise=normaliser("atari:Pong"))
    episodes.add(EpisodeRecord(-20.7, 800, task=0, worker=0))
    episodes.add(EpisodeRecord(14.6, 800, task=0, worker=1))
    row = episodes.per_task()
    assert row == {"normalised_return": pytest.approx((-3.05 + 20.7) / (14.6 + 20.7))}


def test_families_without_constants_log_no_normalised_score():
    assert normaliser("memory:cue_delay") is None
    assert Episodes(("cue_delay",)).per_task() == {}
