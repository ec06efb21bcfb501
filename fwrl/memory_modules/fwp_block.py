"""The Transformer-style block shared by the fast-weight cores (REFERENCE §2).

    x = input_proj(core_input)                      Linear(D_in -> hidden, bias)
    for each of L layers:
        x = x + out_linear(FWP(LN(x)))              out_linear: Linear(H*dv -> hidden, no bias)
        x = x + W2 ReLU(W1 LN(x))                   hidden -> ff_dim -> hidden
    (no final LayerNorm)

``FWP`` is a :class:`FastWeightLayer` supplied by each core (Linear
Transformer, Delta Net, RDN, Delta RNN, SRWM...). Every layer runs over the
whole sequence at once (so a fused kernel can take the rollout in one call);
its state lives in the core state under ``"l{i}.{name}"``.
"""

from __future__ import annotations

from typing import Callable, Literal

from pydantic import Field
from torch import Tensor, nn

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import FEATURE_MAPS
from fwrl.memory_modules.base import Core, CoreConfig, State

# output_scale under its default (None, "auto"): 0.1 behind a convolutional stem (image frames), 1 (the
# papers' code) behind the MLP stem. See :func:`auto_output_scale`.
PIXEL_OUTPUT_SCALE = 0.1


def auto_output_scale(image_stem: bool) -> float:
    """The ``output_scale`` that ``None`` (auto) stands for.

    The policy and value heads read the block's residual stream, which no LayerNorm closes (as in
    the papers' code). Behind a convolutional stem on game frames, one RMSProp step at the papers'
    learning rate moves that stream enough to swing the policy (Pong, B 8, T 50, rdn with the
    impala stem: first-update logit change 0.92 and value change 3.3, LSTM 0.06 / 0.2; the policy
    collapses within three updates); reading it times 0.1 makes the first updates LSTM-like. The
    scale also slows how fast the heads' inputs move later (RMSProp's steps do not shrink with the
    gradient), which costs memory tasks on vector observations (rdn on memory:cue_delay, quickstart,
    60 k steps: success 0.99 at scale 1, 0.49 at 0.1), so the MLP stem keeps the papers' 1.
    """
    return PIXEL_OUTPUT_SCALE if image_stem else 1.0


class FWPConfig(CoreConfig):
    """Options common to the fast-weight cores (Atari defaults of the RFWP paper).

    Each core narrows ``feature_map`` to the maps it supports (``identity`` is for tests).
    """

    num_layers: int = Field(2, ge=1, description="blocks of a fast-weight layer and a feed-forward layer")
    hidden_size: int = Field(128, ge=1, description="width of the residual stream")
    num_heads: int = Field(4, ge=1, description="fast-weight heads per layer")
    head_dim: int = Field(32, ge=1, description="size of each head's query, key and value")
    ff_dim: int = Field(512, ge=1, description="hidden units of the feed-forward sub-layer")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout probability in the block")
    feature_map: Literal[FEATURE_MAPS] = Field("elu1_sumnorm", description="phi applied to queries and keys")
    grad_mode: Literal[GRAD_MODES] = Field("full", description="full: BPTT through carried fast weights; "
                                           "step: gradient cut at every step")
    # LayerNorm before the fast-weight layer; the SRWM cores feed the raw
    # residual stream instead (REFERENCE §2).
    pre_norm: bool = Field(True, description="LayerNorm before the fast-weight layer")
    output_scale: float | None = Field(None, gt=0, description="the policy and value heads read the residual "
                                       "stream times this (1: the papers' code); default: 0.1 behind an image "
                                       "stem, 1 behind the mlp stem (fwp_block.auto_output_scale)")
    policy_head_gain: float | None = Field(None, gt=0, description="orthogonal init gain of the policy head that "
                                           "reads the block (small: a gentle first update at output_scale 1); "
                                           "default: the agent's init scheme")
    value_head_gain: float | None = Field(None, gt=0, description="orthogonal init gain of the value head that "
                                          "reads the block; default: the agent's init scheme")


class FastWeightLayer(nn.Module):
    """One fast-weight layer: x [T, B, hidden] -> y [T, B, out_size] with carried state."""

    out_size: int

    def initial_state(self, batch_size: int, device=None) -> State:
        raise NotImplementedError

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        raise NotImplementedError


LayerFactory = Callable[[FWPConfig, int], FastWeightLayer]


def _dropout(p: float) -> nn.Module:
    """Dropout of probability ``p``; none at 0 (the default), where ``nn.Dropout`` would still be one
    torch call per use in every forward, acting included. No parameters either way: checkpoints match."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class _Block(nn.Module):
    def __init__(self, config: FWPConfig, fwp: FastWeightLayer):
        super().__init__()
        h = config.hidden_size
        self.norm1 = nn.LayerNorm(h) if config.pre_norm else nn.Identity()
        self.fwp = fwp
        self.out_linear = nn.Linear(fwp.out_size, h, bias=False)
        self.norm2 = nn.LayerNorm(h)
        self.ff = nn.Sequential(
            nn.Linear(h, config.ff_dim),
            nn.ReLU(),
            _dropout(config.dropout),
            nn.Linear(config.ff_dim, h),
            _dropout(config.dropout),
        )
        self.dropout = _dropout(config.dropout)

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        y, state = self.fwp(self.norm1(x), state, done)
        x = x + self.dropout(self.out_linear(y))
        x = x + self.ff(self.norm2(x))
        return x, state


class FWPTransformerCore(Core):
    """input_proj, then L blocks of (fast-weight layer, feed-forward), residual."""

    def __init__(self, input_size: int, config: FWPConfig, make_layer: LayerFactory):
        super().__init__()
        self.input_proj = nn.Linear(input_size, config.hidden_size)
        self.blocks = nn.ModuleList(
            _Block(config, make_layer(config, i)) for i in range(config.num_layers)
        )
        self.output_size = config.hidden_size
        # None (auto) is resolved by the agent, which knows the stem; a core built alone reads 1
        self.output_scale = 1.0 if config.output_scale is None else float(config.output_scale)
        self.head_gains = (config.policy_head_gain, config.value_head_gain)  # read by the agent's heads

    def initial_state(self, batch_size: int, device=None) -> State:
        state = {}
        for i, block in enumerate(self.blocks):
            for name, value in block.fwp.initial_state(batch_size, device).items():
                state[f"l{i}.{name}"] = value
        return state

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        x = self.input_proj(x)
        new_state = {}
        for i, block in enumerate(self.blocks):
            prefix = f"l{i}."
            layer_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            x, layer_state = block(x, layer_state, done)
            new_state.update({prefix + k: v for k, v in layer_state.items()})
        if self.output_scale != 1.0:
            x = x * self.output_scale
        return x, new_state
