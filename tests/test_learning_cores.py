"""Every core trains end to end; the recurrent fast-weight cores learn to remember (issue 3).

- ``test_every_core_trains_end_to_end`` (quick): a couple of updates of
  ``train()`` with each registered core (tiny configs) on a memory task; the
  checkpoint loads with ``torch.load(weights_only=True)`` into a fresh model.
- ``test_recurrent_core_solves_cue_delay`` (slow): each recurrent core reaches
  >= 0.9 success on ``memory:cue_delay`` (chance 0.5) with a small one-layer
  config and the quickstart settings (lr 2e-3, unroll 40, batch 8).
  ``feedforward`` and ``fake_sr`` are not recurrent (fake_sr is y = W_y phi(x)
  with slow weights only, paper 002 Sec. 4.3: it has no state), and the LSTM
  has its own test in ``test_learning.py``.
"""

from __future__ import annotations

import pytest
from learning_attempts import SEEDS, reaches
import torch

from fwrl.agents.checkpoint import load_model_weights
from fwrl.envs.registry import describe_env
from fwrl.launch.settings.config import TrainConfig, build_config
from fwrl.launch.training.agent import build_model
from fwrl.launch.training.train import train
from fwrl.memory_modules import core_config_class, core_names

NOT_RECURRENT = {"feedforward", "fake_sr"}
FWP_TINY = {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16}


def tiny_options(core: str) -> dict:
    if core == "feedforward":
        return {}
    if core in ("lstm", "elstm"):
        return {"hidden_size": 16}
    return dict(FWP_TINY)


E2E_CASES = [(core, tiny_options(core)) for core in core_names()] + [("elstm", {"hidden_size": 16, "grad": "rtrl"})]


@pytest.mark.parametrize("core,options", E2E_CASES, ids=[f"{c}-{o['grad']}" if "grad" in o else c for c, o in E2E_CASES])
def test_every_core_trains_end_to_end(core, options, tmp_path):
    config = build_config(None, {
        "env": "memory:cue_delay?delay=3", "core": core, "core_options": options, "num_workers": 1,
        "envs_per_worker": 2, "batch_size": 2, "unroll_length": 5, "total_steps": 20, "seed": 3,
        "log_interval": 1e9, "checkpoint_interval": 1e9,
    })
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "budget" and result.updates == 2 and result.agent_steps == 20
    payload = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    assert payload["agent_steps"] == 20 and payload["updates"] == 2
    saved = TrainConfig.from_dict(payload["config"])
    # a fast-weight core's output_scale (auto) is recorded as the value it trained with: 1 behind the mlp stem
    recorded = {**options, "output_scale": 1.0} if "output_scale" in core_config_class(core).model_fields else options
    assert saved.core == core and saved.core_options == recorded
    model = build_model(saved, describe_env(saved.env))
    load_model_weights(model, payload["model"], "checkpoint.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, payload["model"][name])


def test_learning_settings_cover_every_recurrent_core():
    assert set(CUE_DELAY) | NOT_RECURRENT | {"lstm"} == set(core_names())


# ----------------------------------------------------------------------------- learning (slow)

FWP_SMALL = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "head_dim": 16, "ff_dim": 64}
# The self-referential cores with their RL defaults (no LayerNorm before the layer, softmax of the raw
# residual stream as phi, paper 002 App. B) carry almost no trace of the cue at initialisation (the
# query-step logits differ by ~1e-5 between cues, vs ~1e-2 for delta_net) and stay at chance on this
# task within 250k steps; with the LayerNorm and phi = identity they learn it in ~20k steps.
SR_SMALL = {**FWP_SMALL, "pre_norm": True, "input_map": "identity"}
# core: (core options, agent steps); each reached >= 0.9 with seeds 1 and 2 (the learning curves are in
# the issue 3 report: all fast-weight cores are at 1.0 by 30k-45k steps with seed 2)
CUE_DELAY = {
    "linear_transformer": (FWP_SMALL, 60_000),
    "delta_net": (FWP_SMALL, 60_000),
    "rdn": (FWP_SMALL, 60_000),
    "delta_rnn": (FWP_SMALL, 60_000),
    "delta_lstm": (FWP_SMALL, 60_000),
    "srwm": (SR_SMALL, 100_000),
    "sr_delta_net": (SR_SMALL, 100_000),
    # forget_bias 3 keeps the element-wise memory open at the start (f ~ 0.95); with the default 0
    # (f ~ 0.5) the eLSTM stays at chance within 300k steps.
    "elstm": ({"hidden_size": 64, "forget_bias": 3.0, "grad": "bptt"}, 150_000),
}


@pytest.mark.slow
@pytest.mark.parametrize("core", sorted(CUE_DELAY))
def test_recurrent_core_solves_cue_delay(core, tmp_path):
    options, steps = CUE_DELAY[core]

    def success(seed: int) -> float:
        config = build_config("quickstart", {"core": core, "core_options": options, "total_steps": steps,
                                             "seed": seed, "log_interval": 1e9, "checkpoint_interval": 1e9})
        result = train(config, tmp_path / f"{core}-{seed}")
        assert result.stopped_by == "budget"
        return result.mean_success

    passed, scores = reaches(success, 0.9)
    assert passed, f"{core} success {scores} (seeds {SEEDS[:len(scores)]}) after {steps} steps"
