"""First updates on real Pong frames do not throw a fresh agent's policy or value around.

One batch of Pong (B 8, T 50, acted by a fresh feed-forward agent after 100
random steps, so the frames are mid-game) and 10 RMSProp updates on it at the
rfwp-atari settings (lr 6e-4, eps 0.01, clip 40, entropy cost 0.01),
:func:`fwrl.runner.probe.probe`: every fast-weight core with the nature stem
(the cheaper one), and rdn with the impala stem as well. Bounds:

- the first update moves no logit by more than LOGIT_STEP and no value by more
  than VALUE_STEP (the LSTM: 0.04-0.14 and 0.2-0.4);
- the policy's mean entropy stays above ENTROPY_FLOOR nats (uniform: ln 6 = 1.79);
- the value stays within VALUE_BOUND of the batch's discounted returns (mean
  absolute distance after every update; about 0.35-0.45 at init; the LSTM
  reaches 1.7-1.9 on this batch with the nature stem).

Behind these stems the fast-weight block's default is the papers' output scale
of 1 with small heads (``head_init`` "small": orthogonal gains 0.01 / 0.1). The
papers' block with the agent's heads (``head_init=agent``) breaks the bounds
(``test_the_papers_block_breaks_the_bounds``): its first steps move the logits
by 0.7-1.6 and the values by 3-4.4, its value drifts 3.8-4.8 from the returns,
and rdn's policy falls to 0.23 nats here with the impala stem.

The LSTM fails differently on Pong: RMSProp drives its gate pre-activations
beyond +-5 (flat sigmoid and tanh) through the stem's large common offset;
``input_norm`` (a LayerNorm on the core's input) prevents it
(``test_lstm_input_norm_keeps_the_gates_out_of_saturation``).
"""

from __future__ import annotations

import pytest
import torch

from fwrl.agents.losses import impala_loss
from fwrl.agents.model import AgentNet
from fwrl.agents.optim import clip_grad_norm
from fwrl.runner.probe import collect_batch, probe

pytest.importorskip("ale_py", reason="needs the Atari envs (pip install 'fwrl[atari]')")


LOGIT_STEP = 0.4
VALUE_STEP = 1.0
ENTROPY_FLOOR = 0.5
VALUE_BOUND = 3.0
B, T = 8, 50
OBS = (4, 84, 84)
CORES = ["linear_transformer", "delta_net", "rdn", "delta_rnn", "delta_lstm", "srwm", "fake_sr", "sr_delta_net"]


@pytest.fixture(scope="module")
def pong_batch():
    torch.manual_seed(0)
    actor = AgentNet(OBS, 6, "feedforward", stem="nature")
    return collect_batch("atari:Pong", actor, B, T, seed=0)


def _probe(batch, core, stem, options=None, seed=0):
    torch.manual_seed(seed)
    model = AgentNet(OBS, 6, core, options, stem=stem)
    return probe(model, batch, updates=10, learning_rate=6e-4)


def _within_bounds(result) -> bool:
    return (result.first_logit_change < LOGIT_STEP and result.first_value_change < VALUE_STEP
            and min(result.entropy) > ENTROPY_FLOOR and max(result.value_error) < VALUE_BOUND)


@pytest.mark.parametrize("core,stem", [(core, "nature") for core in CORES] + [("rdn", "impala")])
def test_first_updates_keep_policy_and_value(pong_batch, core, stem):
    result = _probe(pong_batch, core, stem)
    assert _within_bounds(result), result.to_dict()


def test_the_papers_block_breaks_the_bounds(pong_batch):
    """The papers' block (output_scale 1, the agent's heads) fails what the test above asks: the
    bounds can fail."""
    result = _probe(pong_batch, "rdn", "impala", {"output_scale": 1.0, "head_init": "agent"})
    assert not _within_bounds(result), result.to_dict()
    assert result.first_value_change > 2 * VALUE_STEP, result.to_dict()


SATURATED = 5.0  # |pre-activation| beyond which sigmoid and tanh have no slope


def _gate_saturation(model: AgentNet, batch) -> float:
    """Share of the first LSTM layer's gate pre-activations (input part plus biases) beyond SATURATED."""
    gates = []
    lstm = model.core.lstm
    hook = lstm.register_forward_pre_hook(
        lambda m, args: gates.append(args[0] @ m.weight_ih_l0.T + m.bias_ih_l0 + m.bias_hh_l0))
    with torch.no_grad():
        model(batch, model.initial_state(B))
    hook.remove()
    pre = torch.cat([g.reshape(-1, g.shape[-1]) for g in gates])
    return float((pre.abs() > SATURATED).float().mean())


@pytest.mark.parametrize("input_norm", [False, True])
def test_lstm_input_norm_keeps_the_gates_out_of_saturation(pong_batch, input_norm):
    """10 RMSProp updates at lr 1e-3 (the MinAtar LSTM's rate; B 8, eps 0.01, clip 40) on the Pong
    batch: the plain LSTM (orthogonal stem, as the pong-cpu preset) has 47% of its gate
    pre-activations beyond +-5 (fresh: 0%), so the gates pass no gradient; with input_norm, 0%
    (benchmarks/learning/pong_gate_saturation.py shows the same on random-policy rollouts)."""
    torch.manual_seed(0)
    model = AgentNet(OBS, 6, "lstm", {"input_norm": input_norm}, stem="nature", init="orthogonal")
    assert _gate_saturation(model, pong_batch) == 0.0
    optimiser = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.99, eps=0.01)
    for _ in range(10):
        outputs, _ = model(pong_batch, model.initial_state(B))
        loss, _ = impala_loss(outputs, pong_batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(model.parameters(), 40.0)
        optimiser.step()
    saturation = _gate_saturation(model, pong_batch)
    if input_norm:
        assert saturation < 0.05, saturation
    else:
        assert saturation > 0.25, saturation
