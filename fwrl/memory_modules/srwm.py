"""Self-referential cores: SRWM, Fake SR and SR-DeltaNet (paper 002).

All three sit in the Transformer-style block of ``fwp_block`` (input_proj,
then L blocks of ``x + out_linear(layer(x))`` and ``x + FF(LN(x))``), with the
ProcGen settings of paper 002 Sec. 4.3 as defaults: L = 2, hidden 128, H = 8
heads of d = 16 (hidden = H * d: the layer splits the residual stream into H
slices, App. A "Use of multiple heads"; there is no projection inside it).

Behind the image stems (the paper's RL runs) no LayerNorm before these
layers: Eq. 5 reads phi(x_t) of the layer input directly, phi a per-head
softmax of the residual stream (App. B, "Sequence processing components";
PAPERS.md §2). The softmax already puts each head's input on the simplex, the
normalisation the self-modification needs (Eq. 6-8 use softmax-normalised
q, k). Behind the mlp stem the raw stream is too small for that softmax (it
is nearly uniform, and the layer barely sees its input), so there the layer
reads a LayerNorm of the stream through the identity, as in the paper's
supervised runs: ``input_map`` and ``pre_norm`` are auto, resolved by the
stem (``fwp_block.stem_defaults``). The feed-forward sub-layer keeps its
LayerNorm (PAPERS.md §2 block).

Stability: Eq. 8 does not bound the weights in general. A row m of W moves
to m + beta (m.q - m.k) k; when q is more peaked than k on the same entry,
that entry moves away from the key-weighted average, so a row's range can
grow geometrically. With the default initialisation and inputs of the scale
of the stem features the offsets stay of the order of the slow weights over
thousands of steps; with inputs a few times larger some initialisations
diverge. States are reset at episode ends (``done``).

- ``srwm``: Eq. 5-8 with four learning rates (App. A, Eq. 9-11); the state is
  the offset of each sub-matrix from its slow weights (zeroed on reset).
- ``fake_sr``: the SRWM without self-modification, y = W_y phi(x) per head
  (Sec. 4.3: "we only keep the y-part in Eq. 5"); no state.
- ``sr_delta_net``: App. C.1, a Delta Net whose slow projection (Eq. 1) is
  replaced by an SRWM: the SRWM's y-part emits (q, k, v, beta) per head for a
  Delta Net fast matrix (Eq. 2-4: softmax q, k, sigmoid beta, read after the
  update). State: the SRWM offsets and the fast matrix W.

Initialisation: W_y, W_q, W_k, w_b ~ N(0, std 1/sqrt(d)) (PAPERS.md §2).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from fwrl.errors import FwrlError
from fwrl.kernels.delta_rule import delta_rule
from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.kernels.feature_maps import apply_feature_map
from fwrl.kernels.srwm import srwm
from fwrl.kernels.srwm.naive import INPUT_MAPS, NUM_RATES
from fwrl.memory_modules.base import State, normal_init_, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.utils.settings import redefault

OFFSET_KEYS = ("Wy", "Wq", "Wk", "wb")
UNRESOLVED_INPUT_MAP = "softmax"  # input_map auto in a layer built without an agent (no stem to follow)


class SRWMConfig(FWPConfig):
    """Options of the SRWM cores; defaults are paper 002's ProcGen settings (Sec. 4.3).

    The layer splits the residual stream into heads: hidden_size = num_heads * head_dim.
    """

    num_heads: int = redefault(FWPConfig, "num_heads", 8)
    head_dim: int = redefault(FWPConfig, "head_dim", 16)
    # phi for the generated query/key (Eq. 6-8) and for the Delta Net's q, k
    # in sr_delta_net: a softmax, as in the authors' RL runs (PAPERS.md §2).
    feature_map: Literal["softmax"] = redefault(FWPConfig, "feature_map", "softmax")
    # Auto (None) follows the stem (fwp_block.stem_defaults); a core built without an agent has none.
    pre_norm: bool | None = redefault(FWPConfig, "pre_norm", None)
    # phi applied to the layer input in Eq. 5: softmax in RL, identity in the
    # supervised experiments (App. B). The authors' RL code fed Fake SR the
    # raw residual stream (identity). Auto (None) follows the stem
    # (fwp_block.stem_defaults); a layer built without an agent reads the softmax.
    input_map: Literal[INPUT_MAPS] | None = Field(None, description="phi applied to the layer input, Eq. 5; "
                                                  "default: softmax behind the image stems (the paper's RL "
                                                  "runs), identity behind mlp, where pre_norm's LayerNorm "
                                                  "comes first (fwp_block.stem_defaults)")

    @model_validator(mode="after")
    def _heads_split_hidden(self) -> "SRWMConfig":
        if self.num_heads * self.head_dim != self.hidden_size:
            raise FwrlError(
                "the SRWM cores split the hidden vector into heads, so hidden_size must equal "
                f"num_heads * head_dim; got hidden_size={self.hidden_size}, num_heads="
                f"{self.num_heads}, head_dim={self.head_dim}."
            )
        return self


def _normal_(param: Tensor, head_dim: int) -> Tensor:
    return normal_init_(param, 1.0 / math.sqrt(head_dim))


class _SelfReferentialLayer(FastWeightLayer):
    """The SRWM's slow weights (initial matrices) per head and its recurrence.

    ``y_rows`` is the size of the y-part per head: d for the SRWM, 3d + 1 for
    SR-DeltaNet (q, k, v, beta of the Delta Net).
    """

    def __init__(self, config: SRWMConfig, y_rows: int):
        super().__init__()
        H, d = config.num_heads, config.head_dim
        self.num_heads, self.head_dim = H, d
        self.input_map = config.input_map or UNRESOLVED_INPUT_MAP
        self.grad_mode = config.grad_mode
        self.W_y = nn.Parameter(_normal_(torch.empty(H, y_rows, d), d))
        self.W_q = nn.Parameter(_normal_(torch.empty(H, d, d), d))
        self.W_k = nn.Parameter(_normal_(torch.empty(H, d, d), d))
        self.w_b = nn.Parameter(_normal_(torch.empty(H, NUM_RATES, d), d))

    def _offsets_initial(self, batch_size: int, device) -> State:
        dtype = self.W_y.dtype
        return {
            key: torch.zeros(batch_size, *p.shape, device=device, dtype=dtype)
            for key, p in zip(OFFSET_KEYS, (self.W_y, self.W_q, self.W_k, self.w_b))
        }

    def _run_srwm(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        heads = x.reshape(T, B, self.num_heads, self.head_dim)
        y, offsets = srwm(
            heads,
            self.W_y,
            self.W_q,
            self.W_k,
            self.w_b,
            tuple(state[key] for key in OFFSET_KEYS),
            done,
            input_map=self.input_map,
            grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        return y, dict(zip(OFFSET_KEYS, offsets))


class SRWMLayer(_SelfReferentialLayer):
    """Multi-head SRWM layer (paper 002 Eq. 5-8, App. A): y_t = W^y_{t-1} phi(x_t)."""

    def __init__(self, config: SRWMConfig):
        super().__init__(config, y_rows=config.head_dim)
        self.out_size = config.num_heads * config.head_dim

    def initial_state(self, batch_size: int, device=None) -> State:
        return self._offsets_initial(batch_size, device)

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        y, state = self._run_srwm(x, state, done)
        return y.flatten(2), state


class SRDeltaNetLayer(_SelfReferentialLayer):
    """SR-DeltaNet layer (paper 002 App. C.1): an SRWM generates a Delta Net's q, k, v, beta.

    Per head the SRWM's y-part is [q | k | v | beta] (3d + 1 rows). The Delta Net
    (paper 002 Eq. 2-4) then runs with phi = softmax on q and k:
    vbar = W_{t-1} k, W_t = W_{t-1} + sigmoid(beta) (v - vbar) k^T, out = W_t q.
    """

    def __init__(self, config: SRWMConfig):
        d = config.head_dim
        super().__init__(config, y_rows=3 * d + 1)
        self.feature_map = config.feature_map
        self.out_size = config.num_heads * d

    def initial_state(self, batch_size: int, device=None) -> State:
        state = self._offsets_initial(batch_size, device)
        H, d = self.num_heads, self.head_dim
        state["W"] = torch.zeros(batch_size, H, d, d, device=device, dtype=self.W_y.dtype)
        return state

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        y, new_state = self._run_srwm(x, state, done)
        d = self.head_dim
        q, k, v, beta = torch.split(y, (d, d, d, 1), dim=-1)
        out, W = delta_rule(
            q,
            k,
            v,
            beta.squeeze(-1),
            state["W"],
            done,
            rule="delta",
            feature_map=self.feature_map,
            grad_mode=self.grad_mode,
            layer=kernel_layer_name(self),
        )
        new_state["W"] = W
        return out.flatten(2), new_state


class FakeSRLayer(FastWeightLayer):
    """Fake SR (paper 002 Sec. 4.3): the y-part of Eq. 5 with the slow weights only.

    y_t = W_y phi(x_t) per head; nothing is modified, so there is no state.
    """

    def __init__(self, config: SRWMConfig):
        super().__init__()
        H, d = config.num_heads, config.head_dim
        self.num_heads, self.head_dim = H, d
        self.input_map = config.input_map or UNRESOLVED_INPUT_MAP
        self.W_y = nn.Parameter(_normal_(torch.empty(H, d, d), d))
        self.out_size = H * d

    def initial_state(self, batch_size: int, device=None) -> State:
        return {}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        heads = apply_feature_map(self.input_map, x.reshape(T, B, self.num_heads, self.head_dim))
        return torch.einsum("hrd,tbhd->tbhr", self.W_y, heads).flatten(2), state


@register_core("srwm", SRWMConfig, "self-referential weight matrix, four learning rates (paper 002)")
def _build_srwm(input_size: int, config: SRWMConfig) -> FWPTransformerCore:
    return FWPTransformerCore(input_size, config, lambda c, i: SRWMLayer(c))


@register_core("fake_sr", SRWMConfig, "SRWM without self-modification: y = W_y phi(x) (paper 002)")
def _build_fake_sr(input_size: int, config: SRWMConfig) -> FWPTransformerCore:
    return FWPTransformerCore(input_size, config, lambda c, i: FakeSRLayer(c))


@register_core("sr_delta_net", SRWMConfig, "Delta Net whose slow projection is an SRWM (paper 002 App. C.1)")
def _build_sr_delta_net(input_size: int, config: SRWMConfig) -> FWPTransformerCore:
    return FWPTransformerCore(input_size, config, lambda c, i: SRDeltaNetLayer(c))
