"""The recurrent fast-weight cores learn to remember (issue 3); that every core trains end to end
is ``tests/e2e/test_every_core_trains.py``.

- ``test_recurrent_core_solves_cue_delay``: each recurrent core reaches
  >= 0.9 success on ``memory:cue_delay`` (chance 0.5) with a small one-layer
  config and the quickstart settings (lr 2e-3, unroll 40, batch 8).
  ``feedforward`` and ``fake_sr`` are not recurrent (fake_sr is y = W_y phi(x)
  with slow weights only, paper 002 Sec. 4.3: it has no state), and the LSTM
  has its own test in ``test_learning.py``.
"""

from __future__ import annotations

import pytest
from learning_attempts import SEEDS, reaches

from fwrl.settings.config import build_config
from fwrl.runner.train import train
from fwrl.memory_modules import core_names

NOT_RECURRENT = {"feedforward", "fake_sr"}


def test_learning_settings_cover_every_recurrent_core():
    assert set(CUE_DELAY) | NOT_RECURRENT | {"lstm"} == set(core_names())


# ----------------------------------------------------------------------------- learning (slow)

FWP_SMALL = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "head_dim": 16, "ff_dim": 64}
# The self-referential cores with the paper's RL input (no LayerNorm before the layer, softmax of the raw
# residual stream as phi, App. B) carry almost no trace of the cue at initialisation (the query-step
# logits differ by ~1e-5 between cues, vs ~1e-2 for delta_net) and stay at chance on this task within
# 250k steps; behind the mlp stem their auto input is a LayerNorm and phi = identity (fwp_block.
# stem_defaults), which learns it in ~20k steps: these runs check that default.
SR_SMALL = FWP_SMALL
# core: (core options, agent steps); each reached >= 0.9 with seeds 1 and 2 (the learning curves are in
# the issue 3 report: all fast-weight cores are at 1.0 by 30k-45k steps with seed 2)
CUE_DELAY = {
    "linear_transformer": (FWP_SMALL, 60_000),
    "delta_net": (FWP_SMALL, 60_000),
    "rdn": (FWP_SMALL, 60_000),
    "delta_rnn": (FWP_SMALL, 60_000),
    "delta_lstm": (FWP_SMALL, 60_000),
    "gated_delta_net": (FWP_SMALL, 60_000),
    "srwm": (SR_SMALL, 100_000),
    "sr_delta_net": (SR_SMALL, 100_000),
    # forget_bias 3 keeps the element-wise memory open at the start (f ~ 0.95); with the default 0
    # (f ~ 0.5) the eLSTM stays at chance within 300k steps.
    "elstm": ({"hidden_size": 64, "forget_bias": 3.0, "grad": "bptt"}, 150_000),
    # the GRU at the quickstart's settings (the LSTM's claim is the quickstart itself)
    "gru": ({"hidden_size": 64}, 150_000),
}


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
