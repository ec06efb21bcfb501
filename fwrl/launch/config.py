"""Training configuration: one dataclass, YAML presets, command-line overrides.

A run's ``config.yaml`` is this dataclass as a mapping. ``--resume`` reloads
it; only the keys in ``RESUMABLE_CHANGES`` may differ on the command line
(more steps, other worker counts, logging), everything that shapes the model
or the learning problem must stay the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from fwrl.errors import FwrlError, unknown_choice


@dataclass
class TrainConfig:
    # what to learn
    env: str = "atari:Pong"
    core: str = "lstm"
    core_options: dict[str, Any] = field(default_factory=dict)
    stem: str = "auto"  # impala | nature | mlp | auto (impala for frames, mlp for vectors)
    env_wrappers: list[str] = field(default_factory=list)  # module:callable, applied in each worker
    # actors
    backend: str = "local"  # local | ray
    ray_address: str = "auto"
    num_workers: int = 4
    envs_per_worker: int = 2
    step_timeout: float = 60.0
    # learner (REFERENCE §4)
    batch_size: int = 32
    unroll_length: int = 50
    total_steps: int = 50_000_000
    max_seconds: float = 0.0  # stop (with a checkpoint) after this wall time; 0 = no limit
    learning_rate: float = 6e-4
    rmsprop_alpha: float = 0.99
    rmsprop_eps: float = 0.01
    rmsprop_momentum: float = 0.0
    grad_norm_clip: float = 40.0
    entropy_cost: float = 0.01
    baseline_cost: float = 0.5
    discount: float = 0.99
    reward_clip: float = 1.0
    truncation: str = "auto"  # time-limit ends: bootstrap | terminate | auto (terminate for atari, else bootstrap)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int = 0  # torch threads for the learner; 0 = allowed cores minus a share for local env workers
    inference_graph: bool = False  # replay the acting forward as CUDA graphs (CUDA only)
    # vision (R2AC protocol)
    load_vision_from: str = ""
    freeze_vision: bool = False
    # bookkeeping
    seed: int = 1
    checkpoint_interval: float = 600.0  # seconds between checkpoint.pt writes
    milestone_interval: int = 0  # agent steps between kept milestone checkpoints; 0 = none
    log_interval: float = 5.0  # seconds between metrics rows
    eval_every: int = 0  # agent steps between evaluations during training; 0 = none
    eval_episodes: int = 10

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "config") -> "TrainConfig":
        valid = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in data.items():
            if key not in valid:
                raise unknown_choice(f"key in {source}", key, valid)
            kwargs[key] = coerce(key, value)
        return cls(**kwargs)


RESUMABLE_CHANGES = {
    "total_steps", "max_seconds", "num_workers", "envs_per_worker", "step_timeout", "device", "num_threads",
    "checkpoint_interval", "milestone_interval", "log_interval", "backend", "ray_address",
    "eval_every", "eval_episodes", "inference_graph",
}

_DEFAULTS = TrainConfig()


def coerce(key: str, value: Any) -> Any:
    """Convert a command-line string to the type of the field ``key``."""
    default = getattr(_DEFAULTS, key)
    if isinstance(default, dict):
        if not isinstance(value, Mapping):
            raise FwrlError(f"config key {key!r} must be a mapping, got {value!r}.")
        return dict(value)
    if isinstance(value, str) and not isinstance(default, str):
        try:
            if isinstance(default, bool):
                low = value.lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return low in ("true", "1", "yes")
            return type(default)(float(value)) if isinstance(default, int) else type(default)(value)
        except ValueError:
            raise FwrlError(f"config key {key!r} needs a {type(default).__name__}, got {value!r}.") from None
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    return value


# ----------------------------------------------------------------------- presets

def preset_names() -> list[str]:
    folder = resources.files("fwrl.launch") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> dict[str, Any]:
    if name not in preset_names():
        raise unknown_choice("preset", name, preset_names())
    text = (resources.files("fwrl.launch") / "presets" / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    TrainConfig.from_dict(data, source=f"preset {name}")  # validate keys early
    return data


def build_config(preset: str | None, overrides: Mapping[str, Any]) -> TrainConfig:
    data: dict[str, Any] = {}
    if preset:
        data.update(load_preset(preset))
    core_options = dict(data.get("core_options", {}))
    if "core" in overrides and overrides["core"] != data.get("core", _DEFAULTS.core):
        core_options = {}  # a preset's core options belong to its core
    core_options.update(overrides.get("core_options", {}))
    data.update({k: v for k, v in overrides.items() if k != "core_options"})
    data["core_options"] = core_options
    return TrainConfig.from_dict(data)


def check_resume(saved: TrainConfig, overrides: Mapping[str, Any]) -> TrainConfig:
    """The saved config with the allowed overrides; other differences are an error."""
    data = saved.to_dict()
    bad = []
    for key, value in overrides.items():
        if key == "core_options":
            merged = {**data["core_options"], **value}
            if merged != data["core_options"]:
                bad.append(key)
            continue
        value = coerce(key, value)
        if value != data[key]:
            if key in RESUMABLE_CHANGES:
                data[key] = value
            else:
                bad.append(key)
    if bad:
        details = ", ".join(f"{k} (run has {data[k]!r})" for k in bad)
        raise FwrlError(
            f"cannot resume with a different {details}: these settings define the model or the "
            f"learning problem. Settings that may change on resume: {', '.join(sorted(RESUMABLE_CHANGES))}. "
            "Start a new run (another --name) to change the others."
        )
    return TrainConfig.from_dict(data)


def save_config(config: TrainConfig, path: Path) -> None:
    from fwrl.launch.rundir import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def read_config(path: Path) -> TrainConfig:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise FwrlError(f"cannot read run config {path}: {exc}.") from None
    if not isinstance(data, dict):
        raise FwrlError(f"run config {path} is not a mapping of settings.")
    return TrainConfig.from_dict(data, source=str(path))
