"""The init probe's two sides (fwrl.runner.probe): the first step and the steady step.

On one batch of ``memory:cue_delay`` (no library needed): with torch's RMSprop
the first step is larger than the steady one (its square average starts at 0);
with the bias-corrected RMSprop the first step *is* the steady step, to rounding;
a readout scale of 0.1 shrinks the steady step and the heads' input alike.
"""

from __future__ import annotations

import pytest
import torch

from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.runner.probe import collect_batch, format_probe, probe

ENV = "memory:cue_delay?delay=3"


@pytest.fixture(scope="module")
def batch():
    info = describe_env(ENV)
    torch.manual_seed(0)
    actor = AgentNet(info.obs_shape, info.num_actions, "feedforward", stem="mlp")
    return collect_batch(ENV, actor, 4, 8, seed=0, warmup=5), info


def _probe(batch, options=None, **kwargs):
    data, info = batch
    torch.manual_seed(1)
    model = AgentNet(info.obs_shape, info.num_actions, "rdn", {"num_heads": 2, "head_dim": 8, **(options or {})},
                     stem="mlp")
    return probe(model, data, updates=2, **kwargs)


def test_first_step_exceeds_the_steady_step_with_torch_rmsprop(batch):
    result = _probe(batch)
    assert result.first_value_change_mean > 2 * result.steady_value_change_mean > 0, result.to_dict()
    assert result.first_value_change >= result.first_value_change_mean
    assert "steady update" in format_probe(result, "t")


def test_bias_corrected_first_step_is_the_steady_step(batch):
    result = _probe(batch, rmsprop_bias_correction=True)
    assert result.first_value_change_mean == pytest.approx(result.steady_value_change_mean, rel=1e-4)
    assert result.first_logit_change_mean == pytest.approx(result.steady_logit_change_mean, rel=1e-4)


def test_a_readout_scale_shrinks_the_heads_input_and_the_steady_step(batch):
    full, scaled = _probe(batch, {"output_scale": 1.0}), _probe(batch, {"output_scale": 0.1})
    assert scaled.head_input_rms == pytest.approx(0.1 * full.head_input_rms, rel=1e-5)
    assert scaled.steady_value_change_mean < full.steady_value_change_mean
