"""Short end-to-end training on ProcGen: one game, and a multi-task pair with per-task logs."""

import csv

import pytest
import torch

pytest.importorskip("procgen", reason="procgen is not installed: pip install 'fwrl[procgen]' && "
                                      "pip install --no-deps procgen2 gym3")

from fwrl.settings.config import TrainConfig  # noqa: E402
from fwrl.runner.train import train  # noqa: E402


def _config(env: str) -> TrainConfig:
    return TrainConfig(env=env, core="lstm", core_options={"hidden_size": 32}, num_workers=2,
                       envs_per_worker=2, batch_size=2, unroll_length=5, total_steps=40,
                       log_interval=0.5, checkpoint_interval=1e9)


def test_single_game(tmp_path):
    result = train(_config("procgen:coinrun?distribution=easy&num_levels=10"), tmp_path)
    assert result.stopped_by == "budget" and result.agent_steps >= 40
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert payload["env_info"]["obs_shape"] == [3, 64, 64] and payload["env_info"]["num_actions"] == 15


def test_multi_task_pair_logs_per_task(tmp_path):
    result = train(_config("procgen:bigfish+fruitbot?distribution=easy&num_levels=200"), tmp_path)
    assert result.stopped_by == "budget"
    with (tmp_path / "metrics.csv").open() as f:
        header = next(csv.reader(f))
    assert "return/bigfish" in header and "return/fruitbot" in header and "normalised_return" in header
    payload = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert payload["env_info"]["task_names"] == ["bigfish", "fruitbot"]


def test_per_task_and_normalised_aggregate_hand_computed():
    from fwrl.envs.worker_pool import EpisodeRecord
    from fwrl.runner.run_metrics import Episodes, normaliser

    episodes = Episodes(("bigfish", "fruitbot"), normalise=normaliser("procgen:bigfish+fruitbot?distribution=easy"))
    episodes.add(EpisodeRecord(20.5, 10, task=0, worker=0))
    row = episodes.per_task()
    assert row["normalised/bigfish"] == pytest.approx((20.5 - 1) / (40 - 1))
    assert row["normalised_return"] != row["normalised_return"], "NaN until every task has an episode"
    episodes.add(EpisodeRecord(-1.5, 10, task=1, worker=1))
    episodes.add(EpisodeRecord(32.4, 10, task=1, worker=1))
    row = episodes.per_task()
    assert row["return/fruitbot"] == pytest.approx(15.45)
    fruitbot = (15.45 + 1.5) / (32.4 + 1.5)
    assert row["normalised_return"] == pytest.approx((0.5 + fruitbot) / 2)
