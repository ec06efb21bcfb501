"""``stem_precision``: the stem under bfloat16 autocast, everything else in float32."""

from __future__ import annotations

import pytest
import torch

from fwrl.agents.model import AgentNet
from fwrl.errors import FwrlError


def _pair(stem: str, obs_shape: tuple[int, ...]) -> tuple[AgentNet, AgentNet]:
    torch.manual_seed(0)
    full = AgentNet(obs_shape, 5, "lstm", {"hidden_size": 16}, stem=stem)
    half = AgentNet(obs_shape, 5, "lstm", {"hidden_size": 16}, stem=stem, stem_precision="bfloat16")
    half.load_state_dict(full.state_dict())
    return full, half


def _inputs(obs_shape, T=3, B=4):
    g = torch.Generator().manual_seed(1)
    return {"obs": torch.randint(0, 256, (T, B, *obs_shape), generator=g, dtype=torch.uint8),
            "reward": torch.randn(T, B, generator=g), "done": torch.zeros(T, B, dtype=torch.bool)}


@pytest.mark.parametrize("stem,obs_shape", [("impala", (3, 64, 64)), ("nature", (4, 84, 84))])
def test_the_stem_computes_in_bfloat16_and_the_rest_in_float32(stem, obs_shape):
    full, half = _pair(stem, obs_shape)
    seen = []
    half.stem.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    conv = next(m for m in half.stem.modules() if isinstance(m, torch.nn.Conv2d))
    conv.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    inputs = _inputs(obs_shape)
    out_full, _ = full(inputs, full.initial_state(4))
    out_half, _ = half(inputs, half.initial_state(4))
    assert seen == [torch.bfloat16, torch.bfloat16]  # the first convolution and the stem's output
    assert out_half["policy_logits"].dtype == torch.float32 and out_half["baseline"].dtype == torch.float32
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 0.2% per op); the stems' features differ from
    # float32's by ~0.5% relative (benchmarks/results/cpu_cores/stem_precision.md): 5% / 0.02 leaves room for
    # the heads' sums of them, and no room for a stem that computed something else
    torch.testing.assert_close(out_half["policy_logits"], out_full["policy_logits"], rtol=0.05, atol=0.02)
    (out_half["baseline"].sum() + out_half["policy_logits"].sum()).backward()
    (out_full["baseline"].sum() + out_full["policy_logits"].sum()).backward()
    for (name, p_half), p_full in zip(half.named_parameters(), full.parameters()):
        assert p_half.dtype == torch.float32 and p_half.grad.dtype == torch.float32, name
        cos = torch.nn.functional.cosine_similarity(p_half.grad.flatten(), p_full.grad.flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))  # the same gradient to bf16's rounding


def test_float32_is_the_default_and_unchanged():
    full, _ = _pair("impala", (3, 64, 64))
    again = AgentNet((3, 64, 64), 5, "lstm", {"hidden_size": 16}, stem="impala", stem_precision="float32")
    again.load_state_dict(full.state_dict())
    inputs = _inputs((3, 64, 64))
    with torch.no_grad():
        a, _ = full(inputs, full.initial_state(4))
        b, _ = again(inputs, again.initial_state(4))
    assert full.stem_precision == "float32" and torch.equal(a["policy_logits"], b["policy_logits"])


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(FwrlError, match="float16.*bfloat16|bfloat16.*float16"):
        AgentNet((3, 64, 64), 5, "lstm", {"hidden_size": 16}, stem="impala", stem_precision="float16")


def test_the_setting_reaches_the_model_of_a_run():
    from fwrl.envs.registry import describe_env
    from fwrl.runner.agent import build_model
    from fwrl.settings.config import build_config

    config = build_config(None, {"env": "minatar:breakout", "core": "feedforward", "stem_precision": "bfloat16"})
    assert build_model(config, describe_env(config.env)).stem_precision == "bfloat16"
