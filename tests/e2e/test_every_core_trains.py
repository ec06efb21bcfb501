"""Every registered core trains end to end: a couple of updates of ``train()`` with each core
(tiny configs) on a memory task; the checkpoint loads with ``torch.load(weights_only=True)`` into
a fresh model. That the recurrent cores learn to remember is ``tests/learning/test_learning_cores.py``."""

from __future__ import annotations

import pytest
import torch

from fwrl.agents.checkpoint import load_model_weights
from fwrl.envs.registry import describe_env
from fwrl.settings.config import TrainConfig, build_config
from fwrl.runner.agent import build_model
from fwrl.runner.train import train
from fwrl.memory_modules import core_config_class, core_names
from fwrl.memory_modules.fwp_block import stem_defaults


FWP_TINY = {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16}


def tiny_options(core: str) -> dict:
    if core == "feedforward":
        return {}
    if core in ("lstm", "gru", "elstm"):
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
    # a fast-weight core's auto options are recorded as the values it trained with, the mlp stem's:
    # output_scale 1 and the agent's heads; the SRWM cores' input a LayerNorm and the identity
    fields = core_config_class(core).model_fields
    auto = {key: value for key, value in stem_defaults("mlp").items() if key in fields and fields[key].default is None}
    assert ("output_scale" in auto) == ("output_scale" in fields)
    recorded = {**options, **auto}
    assert saved.core == core and saved.core_options == recorded
    model = build_model(saved, describe_env(saved.env))
    load_model_weights(model, payload["model"], "checkpoint.pt")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, payload["model"][name])
