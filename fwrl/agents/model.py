"""The IMPALA agent network: vision stem + memory core + policy/baseline heads.

PAPERS.md §1:

- ``impala`` stem (the default): for channels (16, 32, 32): Conv3x3 s1 p1,
  MaxPool 3x3 s2 p1, two residual blocks ``x + Conv(ReLU(Conv(ReLU(x))))``;
  then ReLU, flatten, Linear -> 256, ReLU. Frames are uint8 / 255.
- ``nature`` stem (Nature DQN): Conv 32 8x8/4, Conv 64 4x4/2, Conv 64 3x3/1,
  Linear -> 512, all ReLU.
- ``minatar`` stem for small frames such as MinAtar's 10x10 (Young & Tian 2019,
  their network): Conv 16 3x3/1 (no padding), ReLU, flatten, Linear -> 128, ReLU.
- ``mlp`` stem for flat vector observations: Linear -> 256, ReLU, twice.
- ``popgym`` stem for flat vector observations, POPGym's baselines' (Morad et al. 2023;
  ``popgym/baselines/ray_models/base_model.py`` and ``ppo.py``, PAPERS.md §5): Linear -> 128,
  LayerNorm without affine parameters, Linear -> 128, LeakyReLU. Half the mlp stem's width, so a
  core behind it reads 129 inputs instead of 257 (the GRU's products shrink by a quarter).
- Core input = concat(stem features, obs_extra, clamp(reward, -1, 1)), where
  ``obs_extra`` is the flat float vector an env with a Dict / Tuple observation
  hands beside its image (``EnvInfo.extra_size`` entries; none for most envs);
  the last action is not fed. Heads: policy Linear(core_out -> sum(action_dims)),
  one categorical per action dimension (``fwrl.agents.policy``), baseline
  Linear(core_out -> 1).
- Acting samples from softmax(logits); evaluation is greedy (argmax).
- Initialisation (``init``): ``torch`` keeps PyTorch's defaults everywhere
  (torchbeast's choice); ``orthogonal`` gives the stem's convolutions and linear
  layers orthogonal weights with gain sqrt(2) and zero biases, the last
  convolution of each impala residual block zero weights (the block starts as
  the identity), and the heads orthogonal weights with gain 0.01 (policy) and 1
  (baseline), as the PPO / A2C Atari agents do (Huang et al. 2022, "The 37
  implementation details of PPO"). The core keeps its own (paper) init. With
  PyTorch's defaults each ReLU layer shrinks the signal by about 0.4, so on Pong
  frames the nature stem's features have an rms of 0.014 and vary by 0.0002
  between frames (impala: 0.034 / 0.001); with ``orthogonal`` 0.52 / 0.010
  (impala: 0.81 / 0.028): the core sees the ball from the first update.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fwrl.agents import policy
from fwrl.agents.stem_shapes import SMALL_FRAME, STEMS, check_stem, default_stem  # noqa: F401  (re-exported)
from fwrl.envs.step_record import DONE, OBS, OBS_EXTRA, REWARD
from fwrl.errors import FwrlError, unknown_choice
from fwrl.memory_modules import build_core, core_config_class
from fwrl.memory_modules.base import State
from fwrl.memory_modules.fwp_block import stem_defaults

INITS = ("torch", "orthogonal")
STEM_PRECISIONS = ("float32", "bfloat16")  # what the stem computes in (AgentNet's stem_precision)


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaStem(nn.Module):
    """IMPALA "large" ResNet stem (Espeholt et al. 2018, Fig. 3 right)."""

    def __init__(self, obs_shape: tuple[int, ...], channels=(16, 32, 32), out_size: int = 256):
        super().__init__()
        c, h, w = obs_shape
        layers: list[nn.Module] = []
        for out_c in channels:
            layers += [
                nn.Conv2d(c, out_c, 3, padding=1),
                nn.MaxPool2d(3, stride=2, padding=1),
                _ResidualBlock(out_c),
                _ResidualBlock(out_c),
            ]
            c = out_c
            h, w = (h + 1) // 2, (w + 1) // 2
        self.convs = nn.Sequential(*layers)
        self.flat_size = c * h * w
        self.fc = nn.Linear(self.flat_size, out_size)
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.convs(x))
        return F.relu(self.fc(x.flatten(1)))


class NatureStem(nn.Module):
    """Nature-DQN stem (Mnih et al. 2015)."""

    def __init__(self, obs_shape: tuple[int, ...], out_size: int = 512):
        super().__init__()
        c, h, w = obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        )
        with torch.no_grad():
            self.flat_size = self.convs(torch.zeros(1, c, h, w)).numel()
        self.fc = nn.Linear(self.flat_size, out_size)
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.fc(self.convs(x).flatten(1)))


class MinAtarStem(nn.Module):
    """The MinAtar paper's network body (Young & Tian 2019): one 3x3 convolution, one linear layer."""

    def __init__(self, obs_shape: tuple[int, ...], channels: int = 16, out_size: int = 128):
        super().__init__()
        c, h, w = obs_shape
        if h < 3 or w < 3:
            raise FwrlError(f"stem 'minatar' needs frames of at least 3x3, got {h}x{w}.")
        self.conv = nn.Conv2d(c, channels, 3, stride=1)
        self.flat_size = channels * (h - 2) * (w - 2)
        self.fc = nn.Linear(self.flat_size, out_size)
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.fc(F.relu(self.conv(x)).flatten(1)))


class MLPStem(nn.Module):
    """Two ReLU layers of 256 for flat vector observations."""

    def __init__(self, obs_shape: tuple[int, ...], out_size: int = 256):
        super().__init__()
        (d,) = obs_shape
        self.net = nn.Sequential(nn.Linear(d, out_size), nn.ReLU(), nn.Linear(out_size, out_size), nn.ReLU())
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class PopGymStem(nn.Module):
    """POPGym's baselines' observation encoder (module docstring): Linear, LayerNorm (no affine),
    Linear, LeakyReLU, all 128 wide."""

    def __init__(self, obs_shape: tuple[int, ...], out_size: int = 128):
        super().__init__()
        (d,) = obs_shape
        self.net = nn.Sequential(nn.Linear(d, out_size), nn.LayerNorm(out_size, elementwise_affine=False),
                                 nn.Linear(out_size, out_size), nn.LeakyReLU())
        self.out_size = out_size

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


STEM_CLASSES = {"impala": ImpalaStem, "nature": NatureStem, "minatar": MinAtarStem, "mlp": MLPStem,
                "popgym": PopGymStem}


def make_stem(name: str, obs_shape: tuple[int, ...]) -> nn.Module:
    if name not in STEMS:
        raise unknown_choice("vision stem", name, STEMS)
    check_stem(name, obs_shape)  # a stem that does not fit: one FwrlError naming those that do
    return STEM_CLASSES[name](obs_shape)


def _orthogonal(layer: nn.Module, gain: float) -> None:
    weight = torch.empty(layer.weight.shape)  # a plain tensor: the layer's may be channels_last
    nn.init.orthogonal_(weight, gain)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if layer.bias is not None:
            layer.bias.zero_()


def init_orthogonal(stem: nn.Module, policy: nn.Linear, baseline: nn.Linear) -> None:
    """The ``orthogonal`` scheme (module docstring) on a stem and the two heads."""
    for module in stem.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            _orthogonal(module, math.sqrt(2.0))
    for module in stem.modules():
        if isinstance(module, _ResidualBlock):
            with torch.no_grad():
                module.conv1.weight.zero_()
                module.conv1.bias.zero_()
    _orthogonal(policy, 0.01)
    _orthogonal(baseline, 1.0)


def with_stem_defaults(core: str, options: Mapping[str, Any] | None, stem: str) -> dict[str, Any]:
    """``options`` with a fast-weight core's auto options (default None: ``output_scale``,
    ``head_init``, the SRWM cores' ``input_map`` and ``pre_norm``) resolved where they are unset or
    None, for the agent's ``stem`` (``fwp_block.stem_defaults``)."""
    options = dict(options or {})
    config_class = core_config_class(core)
    fields = config_class.model_fields
    for key, value in stem_defaults(stem, getattr(config_class, "small_heads_on_atari", True)).items():
        if options.get(key) is None and key in fields and fields[key].default is None:
            options[key] = value
    return options


class AgentNet(nn.Module):
    """Stem + core + heads. ``forward`` runs a whole [T, B] sequence in one call."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        core: str = "lstm",
        core_options: Mapping[str, Any] | None = None,
        stem: str | None = "impala",
        extra_size: int = 0,
        action_dims: tuple[int, ...] | None = None,
        init: str = "torch",
        stem_precision: str = "float32",
    ):
        super().__init__()
        if init not in INITS:
            raise unknown_choice("init scheme", init, INITS)
        if stem_precision not in STEM_PRECISIONS:
            raise unknown_choice("stem precision", stem_precision, STEM_PRECISIONS)
        # bfloat16: the stem's convolutions and linear layer run under autocast, its output back in the
        # model's dtype; weights, gradients, optimiser state, core and heads stay in that dtype
        self.stem_precision = stem_precision
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.extra_size = int(extra_size)
        self.action_dims = tuple(action_dims) if action_dims else (num_actions,)
        if sum(self.action_dims) != num_actions:
            raise FwrlError(f"action_dims {self.action_dims} do not add up to num_actions={num_actions}.")
        self.stem_name = stem or default_stem(self.obs_shape)
        self.stem = make_stem(self.stem_name, self.obs_shape)
        core_options = with_stem_defaults(core, core_options, self.stem_name)
        self.core = build_core(core, self.stem.out_size + self.extra_size + 1, core_options)
        self.policy = nn.Linear(self.core.output_size, num_actions)
        self.baseline = nn.Linear(self.core.output_size, 1)
        self.init = init
        if init == "orthogonal":
            init_orthogonal(self.stem, self.policy, self.baseline)
        for head, gain in zip((self.policy, self.baseline), self.core.head_gains):
            if gain is not None:  # the core asks for its own head init (fwp_block: head_init, *_head_gain)
                _orthogonal(head, gain)
        self.channels_last = len(self.obs_shape) == 3
        if self.channels_last:  # NHWC convolutions are ~10% faster with oneDNN and cuDNN
            self.stem.to(memory_format=torch.channels_last)

    def initial_state(self, batch_size: int, device=None) -> State:
        return self.core.initial_state(batch_size, device)

    def forward(
        self, inputs: Mapping[str, Tensor], state: State, greedy: bool = False, sampler: str = "multinomial",
        generator: torch.Generator | None = None, core_step: Callable[..., tuple[Tensor, State]] | None = None,
    ) -> tuple[dict[str, Tensor], State]:
        """inputs: obs [T, B, *obs_shape], reward [T, B], done [T, B] (bool), and obs_extra
        [T, B, extra_size] when the model has extras.

        Actions ([T, B], or [T, B, D] for D action dimensions) are the argmax of
        the logits (``greedy``) or a sample of softmax(logits): ``torch.multinomial``,
        or with ``sampler="gumbel"`` the argmax of logits plus Gumbel noise (the same
        distribution from ``torch.rand`` alone, so it can be captured in a CUDA graph), drawn
        from ``generator`` (default: torch's global one). ``core_step`` stands in for ``self.core``
        (the acting loop's traced step, :mod:`fwrl.agents.traced_core`).
        """
        obs = inputs[OBS]
        T, B = obs.shape[:2]
        x = obs.reshape(T * B, *obs.shape[2:])
        dtype = self.baseline.weight.dtype  # float32, or float64 where a test asks for exact sums
        x = as_dtype(x / 255.0 if x.dtype == torch.uint8 else x, dtype)  # one op each: the division casts
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        parts = [self._stem(x, dtype).view(T, B, -1)]
        if self.extra_size:
            parts.append(as_dtype(inputs[OBS_EXTRA], dtype))
        parts.append(as_dtype(inputs[REWARD], dtype).clamp(-1.0, 1.0).unsqueeze(-1))
        core_out, state = (core_step or self.core)(torch.cat(parts, dim=-1), state, as_dtype(inputs[DONE], torch.bool))
        logits = self.policy(core_out)
        baseline = self.baseline(core_out).squeeze(-1)
        action = policy.sample(logits, self.action_dims, greedy=greedy, sampler=sampler, generator=generator)
        return {"policy_logits": logits, "baseline": baseline, "action": action}, state


    def _stem(self, x: Tensor, dtype: torch.dtype) -> Tensor:
        """The stem's features of ``x`` in ``dtype``, computed in ``stem_precision``."""
        if self.stem_precision == "float32":
            return self.stem(x)
        # cache_enabled=False: each weight is cast once per forward anyway, and a CUDA graph's capture
        # must not keep casts from outside it
        with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False):
            features = self.stem(x)
        return as_dtype(features, dtype)


def as_dtype(value: Tensor, dtype: torch.dtype) -> Tensor:
    """``value`` in ``dtype``: itself where it already is (no ``to`` call: on the acting path every
    torch call is paid per step, and on a GPU per launch)."""
    return value if value.dtype == dtype else value.to(dtype)


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def layer_table(model: nn.Module, depth: int = 2) -> list[tuple[str, int]]:
    """(module path, parameter count) for modules down to ``depth`` dots."""
    rows: dict[str, int] = {}
    for name, p in model.named_parameters():
        key = ".".join(name.split(".")[:depth]) if "." in name else name
        rows[key] = rows.get(key, 0) + p.numel()
    return list(rows.items())
