"""The Transformer-style block shared by the fast-weight cores (PAPERS.md §2).

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

from typing import Callable, ClassVar, Literal

from pydantic import Field
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fwrl.kernels import GRAD_MODES
from fwrl.kernels.feature_maps import FEATURE_MAPS
from fwrl.memory_modules.base import Core, CoreConfig, State

# What the auto (None) values of output_scale and head_init stand for, by the agent's stem. See
# :func:`stem_defaults`.
PIXEL_OUTPUT_SCALE = 0.1
HEAD_INITS = ("agent", "small")
SMALL_HEAD_GAINS = (0.01, 0.1)  # orthogonal gains of the policy and value heads under head_init "small"
# An entry applies to a core whose option of that name is auto (default None): input_map and pre_norm
# only to the SRWM cores (srwm.SRWMConfig); the other cores' pre_norm is True whatever the stem.
IMAGE_SRWM_INPUT = {"input_map": "softmax", "pre_norm": False}  # the paper's RL runs (App. B)
SCALED_START: dict[str, float | str | bool] = {"output_scale": PIXEL_OUTPUT_SCALE, "head_init": "agent", **IMAGE_SRWM_INPUT}
STEM_DEFAULTS: dict[str, dict[str, float | str | bool]] = {
    "impala": {"output_scale": 1.0, "head_init": "small", **IMAGE_SRWM_INPUT},
    "nature": {"output_scale": 1.0, "head_init": "small", **IMAGE_SRWM_INPUT},
    "minatar": SCALED_START,
    "mlp": {"output_scale": 1.0, "head_init": "agent", "input_map": "identity", "pre_norm": True},
}
STEM_DEFAULTS["popgym"] = STEM_DEFAULTS["mlp"]  # vectors too (POPGym's baselines' encoder)


def stem_defaults(stem: str, small_heads_on_atari: bool = True) -> dict[str, float | str | bool]:
    """The ``output_scale``, ``head_init`` and (SRWM cores) ``input_map`` and ``pre_norm`` that None
    (auto) stands for behind ``stem``, for a core whose config has ``small_heads_on_atari`` (else it
    keeps scale 0.1 and the agent's heads behind the Atari stems as well).

    The policy and value heads read the block's residual stream, which no LayerNorm closes (as in
    the papers' code). At the papers' output scale of 1 and the agent's head init, one RMSProp step
    at the papers' learning rate moves that stream enough to swing the policy (Pong, B 8, T 50, rdn
    with the impala stem: first-update logit change 0.92 and value change 3.3, LSTM 0.06 / 0.2).
    Two ways give a gentle start:

    - ``head_init`` "small" (orthogonal heads of gains 0.01 / 0.1, zero biases) at scale 1: a fresh
      head barely moves the policy, and the effect fades as the heads' weights grow. Behind the Atari
      stems (impala, nature) it starts Pong as the LSTM does: two seeds of ``pong-cpu`` left random
      play at 1.61 M agent steps on average (LSTM 1.64 M; scale 0.1: 3.64 M) and crossed 0 at 2.97 M
      (LSTM 2.60 M; scale 0.1: 3.74 M and never in 8 M).
    - ``output_scale`` 0.1 (the heads read the stream times 0.1): also slows how fast the heads'
      inputs move later (RMSProp's steps do not shrink with the gradient). On MinAtar it measured
      better than small heads (IQM 0.92 against 0.76, two seeds), so the minatar stem keeps it.

    Behind the mlp stem (vector observations, memory tasks) the papers' block: scale 1 with the
    agent's heads (rdn on memory:cue_delay, 60 k steps: success 0.99 at scale 1, 0.49 at 0.1).

    The SRWM's input (Eq. 5's phi of the layer input, and whether a LayerNorm comes first): behind
    the image stems the paper's RL runs, a softmax of the raw residual stream; behind mlp a LayerNorm
    and the identity (the paper's supervised runs). Behind the mlp stem the raw stream is small, so a
    softmax over each head's entries is nearly uniform and the layer barely sees its input: POPGym
    RepeatFirst and memory:cue_delay stay at chance with it (``benchmarks/results/learning/popgym-cpu``).
    """
    defaults = STEM_DEFAULTS[stem]
    if defaults["head_init"] == "small" and not small_heads_on_atari:
        defaults = SCALED_START
    return dict(defaults)


def head_gains(config: "FWPConfig") -> tuple[float | None, float | None]:
    """Orthogonal gains (policy, value) of the heads that read the block; None: the agent's init
    scheme. Given gains win over ``head_init``; an unresolved ``head_init`` (a core built alone)
    reads "agent"."""
    small = SMALL_HEAD_GAINS if config.head_init == "small" else (None, None)
    return (config.policy_head_gain if config.policy_head_gain is not None else small[0],
            config.value_head_gain if config.value_head_gain is not None else small[1])


class FWPConfig(CoreConfig):
    """Options common to the fast-weight cores (Atari defaults of the RFWP paper).

    Each core narrows ``feature_map`` to the maps it supports (``identity`` is for tests).
    """

    # Whether the auto options give small heads at scale 1 behind the Atari stems (stem_defaults);
    # a core whose first updates on Pong frames are not gentle with them keeps scale 0.1 there.
    small_heads_on_atari: ClassVar[bool] = True

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
    # residual stream behind image stems (PAPERS.md §2; their pre_norm is auto).
    pre_norm: bool = Field(True, description="LayerNorm before the fast-weight layer")
    output_scale: float | None = Field(None, gt=0, description="the policy and value heads read the residual "
                                       "stream times this (1: the papers' code); default: 0.1 behind the minatar "
                                       "stem (the linear transformer: every image stem), 1 behind the others "
                                       "(fwp_block.stem_defaults)")
    head_init: Literal[HEAD_INITS] | None = Field(None, description="init of the heads that read the block: agent "
                                                  "(the --init scheme's), small (orthogonal, gains 0.01 policy / 0.1 "
                                                  "value, zero biases: a gentle first update at output_scale 1); "
                                                  "default: small behind the impala and nature stems (but for the "
                                                  "linear transformer), agent behind minatar and mlp "
                                                  "(fwp_block.stem_defaults)")
    policy_head_gain: float | None = Field(None, gt=0, description="orthogonal init gain of the policy head that "
                                           "reads the block, over head_init's; default: head_init's")
    value_head_gain: float | None = Field(None, gt=0, description="orthogonal init gain of the value head that "
                                          "reads the block, over head_init's; default: head_init's")


class FastWeightLayer(nn.Module):
    """One fast-weight layer: x [T, B, hidden] -> y [T, B, out_size] with carried state."""

    out_size: int

    def initial_state(self, batch_size: int, device=None) -> State:
        raise NotImplementedError

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        raise NotImplementedError

    def _add_slow_net(self, config: FWPConfig, per_head: int) -> None:
        """Set the layer's heads (``num_heads``, ``head_dim``), gradient mode and output size (a
        ``head_dim`` vector per head), and its slow net: a linear map (no bias) from the hidden size to
        ``per_head`` numbers per head."""
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.grad_mode = config.grad_mode
        self.per_head = per_head
        self.slow_net = nn.Linear(config.hidden_size, config.num_heads * per_head, bias=False)
        self.out_size = config.num_heads * config.head_dim

    def _per_head(self, x: Tensor) -> Tensor:
        """The slow net's outputs for x [T, B, hidden], per head: [T, B, num_heads, per_head]."""
        T, B, _ = x.shape
        return self.slow_net(x).view(T, B, self.num_heads, self.per_head)

    def _zero_state(self, batch_size: int, device, **shapes: tuple[int, ...]) -> State:
        """A state of zeros in the slow net's dtype: ``[batch_size, *shape]`` for each named part."""
        dtype = self.slow_net.weight.dtype
        return {name: torch.zeros(batch_size, *shape, device=device, dtype=dtype) for name, shape in shapes.items()}


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
        self.dropout_p = config.dropout

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        y, state = self.fwp(self.norm1(x), state, done)
        y = self.out_linear(y)
        x = x + (self.dropout(y) if self.dropout_p else y)
        return x + self._feed_forward(self.norm2(x)), state

    def _feed_forward(self, x: Tensor) -> Tensor:
        """W2 ReLU(W1 x): ``self.ff`` where it has dropouts, else its two Linear layers called directly
        (the same weights and result, five module calls fewer per step: on the CPU each costs
        microseconds, which a T = 1 acting step of a small agent feels)."""
        if self.dropout_p:
            return self.ff(x)
        first, second = self.ff[0], self.ff[3]
        return F.linear(F.relu(F.linear(x, first.weight, first.bias)), second.weight, second.bias)


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
        # and the agent's head init
        self.output_scale = 1.0 if config.output_scale is None else float(config.output_scale)
        self.head_gains = head_gains(config)  # read by the agent's heads

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
