"""``output_scale_learned``: the fast-weight block's readout scale as one trained scalar."""

from __future__ import annotations

import torch

from fwrl.agents.model import AgentNet

OBS = (4, 10, 10)


def _batch(T=3, B=2):
    return {"obs": torch.rand(T, B, *OBS), "reward": torch.zeros(T, B), "done": torch.zeros(T, B, dtype=torch.bool)}


def test_a_learned_scale_starts_at_output_scale_and_trains():
    torch.manual_seed(0)
    fixed = AgentNet(OBS, 3, "rdn", {"output_scale": 0.1}, stem="minatar")
    torch.manual_seed(0)
    learned = AgentNet(OBS, 3, "rdn", {"output_scale": 0.1, "output_scale_learned": True}, stem="minatar")
    assert "core.output_gain" not in fixed.state_dict() and learned.state_dict()["core.output_gain"] == 0.1
    batch = _batch()
    out_fixed, _ = fixed(batch, fixed.initial_state(2))
    out_learned, _ = learned(batch, learned.initial_state(2))
    torch.testing.assert_close(out_learned["policy_logits"], out_fixed["policy_logits"])  # same start
    out_learned["baseline"].sum().backward()
    assert learned.core.output_gain.grad is not None and learned.core.output_gain.grad.abs() > 0
