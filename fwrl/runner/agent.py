"""The agent of a run: the learner's device, the model a config describes, a trained agent loaded back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwrl.agents.checkpoint import load_checkpoint, load_model_weights
from fwrl.agents.model import AgentNet, default_stem, with_stem_defaults
from fwrl.envs.registry import EnvInfo
from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, saved_settings


def pick_device(name: str) -> torch.device:
    """``auto`` (CUDA where torch sees a GPU, else CPU) or a device name; a missing GPU is a FwrlError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise FwrlError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise FwrlError(f"device {name!r} was asked for, but torch sees no CUDA GPU here; use --device cpu.")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise FwrlError(f"device {name!r} was asked for, but torch sees {torch.cuda.device_count()} CUDA GPU(s).")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise FwrlError(f"device {name!r} was asked for, but torch sees no Apple GPU here; use --device cpu.")
    return device


def build_model(config: TrainConfig, info: EnvInfo) -> AgentNet:
    """The agent network of ``config`` for an env described by ``info``."""
    stem = None if config.stem == "auto" else config.stem
    return AgentNet(info.obs_shape, info.num_actions, config.core, config.core_options, stem,
                    extra_size=info.extra_size, action_dims=info.action_dims, init=config.init,
                    stem_precision=config.stem_precision)


def resolve_core_options(config: TrainConfig, info: EnvInfo) -> TrainConfig:
    """``config`` with the core options that depend on the env fixed (a fast-weight core's auto
    ``output_scale``, ``head_init`` and SRWM ``input_map``, by the stem: ``fwp_block.stem_defaults``),
    so the run folder records the values the run trained with and a later change of the rule cannot
    change them."""
    stem = default_stem(info.obs_shape) if config.stem == "auto" else config.stem
    options = with_stem_defaults(config.core, config.core_options, stem)
    return config.model_copy(update={"core_options": options})


def load_agent(source: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, dict[str, Any], Path]:
    """The model of a run folder (its ``checkpoint.pt``) or a checkpoint file, and the payload."""
    source = Path(source)
    path = source / "checkpoint.pt" if source.is_dir() else source
    if source.is_dir() and not path.is_file():
        raise FwrlError(f"{source} holds no checkpoint.pt; pass a run folder of fwrl train or a checkpoint file.")
    payload = load_checkpoint(path, map_location=device)
    config = TrainConfig.from_dict(saved_settings(payload["config"]), source=str(path))
    raw = payload["env_info"]
    info = EnvInfo.from_dict(raw)
    model = build_model(config, info).to(device)
    load_model_weights(model, payload["model"], str(path))
    return model.eval(), payload, path
