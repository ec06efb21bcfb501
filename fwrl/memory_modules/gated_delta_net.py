"""Gated DeltaNet core: a fast-weight programmer with the gated delta rule (PAPERS.md §7).

Yang, Kautz & Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025
(arXiv 2412.06464). Per head the slow net (one Linear without bias, as the other fast-weight cores')
emits q, k, v, a write strength beta and a decay input a; the fast matrix is decayed by a learned,
input-dependent gate before each delta-rule write (Eq. 10), read after it:

    alpha_t = exp(g_t),   g_t = -exp(A_log) softplus(a_t + dt_bias)        (the authors' code)
    S_t     = alpha_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T,  b_t = sigmoid(beta_t)   (Eq. 10)
    o_t     = S_t q_t
    y_t     = RMSNorm(o_t) * SiLU(W_g x_t)                                (Sec. 3.4: norm, then gate)

q and k are L2-normalised (``feature_map`` ``l2norm``, Sec. 3.4, "for training stability"), after a
SiLU of q, k and v (``qkv_silu``). A_log and dt_bias are per head, drawn as the authors' code draws
them: A ~ U(0, 16), dt = softplus(dt_bias) log-uniform in [0.001, 0.1], so a fresh layer's decays
alpha = exp(-A dt) lie between e^-1.6 and 1. The RMSNorm's scale is one vector of head_dim shared by
the heads, its epsilon 1e-5, as the authors' code has them.

What fwrl leaves out, and why: the paper's short causal convolution (kernel 4) before the SiLU. Over
time it would make every layer carry its last three inputs as extra acting state, reset with the
episode, in every path (acting one step at a time, the learner's whole rollouts, the traced and the
graphed acting steps); the block's residual stream already feeds every layer the previous layers'
outputs. The SiLU is kept (``qkv_silu``), as the authors' code applies it without the convolution.
The query is not scaled by 1/sqrt(d) (flash-linear-attention's default), as fwrl's delta rule reads
with phi(q) unscaled; the RMSNorm after the read undoes any such scale.

The output norm and gate (``output_norm``, ``output_gate``) and the SiLU are the paper's, on by
default; whether they help RL has not been measured in fwrl: each is an option, so that runs can
switch them off (``--core-opt output_gate=false``). ``writes`` > 1 makes the layer Gated
DeltaProduct (Siems et al. 2025, arXiv 2502.10297): n_h = ``writes`` delta-rule writes per step, each
with its own key, value and rate, after one decay, read after the last (the same kernels run the
n_h writes as n_h sub-steps: the decay and the episode start on the first, the read on the last).
Episode starts reset S to 0 before the step; ``grad_mode`` as every fast-weight core.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from fwrl.kernels.dispatch import kernel_layer_name
from fwrl.kernels.feature_maps import feature_dim
from fwrl.kernels.gated_delta_rule import gated_delta_rule
from fwrl.memory_modules.base import Core, State, _drawing_shapes_only, register_core
from fwrl.memory_modules.fwp_block import FastWeightLayer, FWPConfig, FWPTransformerCore
from fwrl.utils.settings import redefault

# The feature maps of q and k a user can pick: the paper's L2 normalisation, and the Delta Net's map
# (to compare the two cores with one difference, the gate).
FEATURE_MAP_CHOICES = ("l2norm", "elu1_sumnorm")
# The authors' code's draws of the decay parameters: A ~ U(0, A_MAX), softplus(dt_bias) log-uniform
# in DT_RANGE (at least DT_FLOOR), and the epsilon of the output RMSNorm.
A_MAX = 16.0
DT_RANGE = (1e-3, 1e-1)
DT_FLOOR = 1e-4
NORM_EPS = 1e-5
MAX_WRITES = 8


class GatedDeltaNetConfig(FWPConfig):
    """FWPConfig with the paper's L2-normalised keys and queries, and its output norm and gate."""

    feature_map: Literal[FEATURE_MAP_CHOICES] = redefault(FWPConfig, "feature_map", "l2norm")
    qkv_silu: bool = Field(True, description="SiLU of the slow net's q, k and v before phi (the paper's, "
                           "after its short convolution, which fwrl leaves out)")
    output_norm: bool = Field(True, description="per-head RMSNorm of the read, with a learned scale (the "
                              "paper's)")
    output_gate: bool = Field(True, description="the read times SiLU of a projection of the layer's input "
                              "(the paper's output gate)")
    writes: int = Field(1, ge=1, le=MAX_WRITES, description="delta-rule writes per step after one decay, each "
                        "with its own key, value and rate: Gated DeltaProduct's n_h (Siems et al. 2025); 1: "
                        "the gated delta rule")


def _decay_parameters(heads: int) -> tuple[Tensor, Tensor]:
    """(A_log, dt_bias) [heads] as the authors' code draws them (module docstring); empty tensors on
    the meta device (a model of shapes only draws no numbers)."""
    if _drawing_shapes_only():
        return torch.empty(heads), torch.empty(heads)
    A_log = torch.log(torch.rand(heads) * A_MAX)
    low, high = (math.log(x) for x in DT_RANGE)
    dt = torch.exp(torch.rand(heads) * (high - low) + low).clamp(min=DT_FLOOR)
    return A_log, dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)


class _NormGate(torch.autograd.Function):
    """``RMSNorm(y) * SiLU(gate)`` (the weight ``w`` of the norm shared by the heads) with a hand-derived
    backward: one autograd node for what autograd records as ten, on the CPU where each costs more than
    its arithmetic. With ``n = y r``, ``r = (mean(y^2) + eps)^-1/2`` and ``s = SiLU(gate)``:

        dgate = SiLU'(gate) (dout * n w),   dw = sum (dout * s * n),   dy = r (dn - n mean(dn * n)),  dn = dout * s * w
    """

    @staticmethod
    def forward(ctx, y: Tensor, gate: Tensor, w: Tensor) -> Tensor:
        r = y.square().mean(-1, keepdim=True).add_(NORM_EPS).rsqrt_()
        n = y * r
        nw = n * w
        gate = gate.view(y.shape)
        s = F.silu(gate)
        ctx.save_for_backward(r, n, nw, gate, s, w)
        return nw * s

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):
        r, n, nw, gate, s, w = ctx.saved_tensors
        d = n.shape[-1]
        dgate = torch.ops.aten.silu_backward(dout * nw, gate)
        dnw = dout * s
        dw = (dnw * n).view(-1, d).sum(0)
        dn = dnw.mul_(w)
        dy = dn.addcmul_(n, torch.linalg.vecdot(dn, n).mul_(1 / d).unsqueeze(-1), value=-1).mul_(r)
        return dy, dgate.view(*gate.shape[:-2], -1), dw


class GatedDeltaLayer(FastWeightLayer):
    """One Gated DeltaNet (or, with ``writes`` > 1, Gated DeltaProduct) layer; state ``W`` [B, H, d, F].

    The slow net's output: per head ``[q | k_1 | v_1 | ... | k_n | v_n]`` (n = ``writes``), then the n
    rates beta of every head, one decay input a per head and, with the output gate, its H * d inputs.
    """

    def __init__(self, config: GatedDeltaNetConfig):
        super().__init__()
        H, d, n = config.num_heads, config.head_dim, config.writes
        self.num_heads, self.head_dim, self.writes = H, d, n
        self.feature_map = config.feature_map
        self.grad_mode = config.grad_mode
        self.qkv_silu = config.qkv_silu
        self.key_dim = feature_dim(config.feature_map, d)
        self.per_head = d + 2 * n * d
        self.sizes = [H * self.per_head, H * n, H] + ([H * d] if config.output_gate else [])
        self.slow_net = nn.Linear(config.hidden_size, sum(self.sizes), bias=False)
        A_log, dt_bias = _decay_parameters(H)
        self.A_log = nn.Parameter(A_log)
        self.dt_bias = nn.Parameter(dt_bias)
        self.norm_weight = nn.Parameter(torch.ones(d)) if config.output_norm else None
        self.out_size = H * d

    def initial_state(self, batch_size: int, device=None) -> State:
        shape = (batch_size, self.num_heads, self.head_dim, self.key_dim)
        return {"W": torch.zeros(shape, device=device, dtype=self.slow_net.weight.dtype)}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        T, B, _ = x.shape
        H, d, n = self.num_heads, self.head_dim, self.writes
        # split, not slices: its backward is one concatenation, a slice's a zero tensor the size of the input
        qkv, beta, a, *gate = self.slow_net(x).split(self.sizes, dim=-1)
        if self.qkv_silu:
            qkv = F.silu(qkv)
        qkv = qkv.view(T, B, H, self.per_head)
        g = F.softplus(a + self.dt_bias) * -torch.exp(self.A_log)  # log alpha_t [T, B, H]
        options = dict(feature_map=self.feature_map, grad_mode=self.grad_mode, layer=kernel_layer_name(self))
        if n == 1:
            q, k, v = qkv.split([d, d, d], dim=-1)
            y, W = gated_delta_rule(q, k, v, beta, g, state["W"], done, **options)
        else:
            y, W = self._product(qkv, beta, g, state["W"], done, options)
        if self.norm_weight is not None and gate and torch.is_grad_enabled() and y.is_cpu:
            y = _NormGate.apply(y, gate[0], self.norm_weight)  # the two in one autograd node
        else:
            if self.norm_weight is not None:  # RMSNorm by hand: torch's CPU rms_norm costs ~4x these calls here
                y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + NORM_EPS) * self.norm_weight
            if gate:
                y = y * F.silu(gate[0].view(T, B, H, d))
        return y.reshape(T, B, self.out_size), {"W": W}

    def _product(self, qkv: Tensor, beta: Tensor, g: Tensor, W0: Tensor, done: Tensor, options: dict
                 ) -> tuple[Tensor, Tensor]:
        """Gated DeltaProduct: the n writes of each step as n sub-steps of the gated delta rule, the
        decay and the episode start on the first, the read on the last (the queries of the others are
        zero, their reads dropped). In grad_mode step, one call per step (the gradient is cut between
        steps only)."""
        T, B, H, _ = qkv.shape
        d, n = self.head_dim, self.writes
        q, kv = qkv.split([d, 2 * n * d], dim=-1)
        kv = kv.reshape(T, B, H, n, 2, d).permute(0, 3, 1, 2, 4, 5).reshape(T * n, B, H, 2, d)
        k, v = kv.unbind(-2)
        beta = beta.view(T, B, H, n).permute(0, 3, 1, 2).reshape(T * n, B, H)
        later = n - 1  # sub-steps after the first of each step
        q = torch.cat([q.new_zeros(T, later, B, H, d), q.unsqueeze(1)], dim=1).view(T * n, B, H, d)
        g = torch.cat([g.unsqueeze(1), g.new_zeros(T, later, B, H)], dim=1).view(T * n, B, H)
        reset = torch.cat([done.unsqueeze(1), done.new_zeros(T, later, B)], dim=1).view(T * n, B)
        if self.grad_mode == "full":
            y, W = gated_delta_rule(q, k, v, beta, g, W0, reset, **options)
            return y.view(T, n, B, H, d)[:, -1], W
        # grad_mode step cuts the gradient between steps, not between the writes of one step: a call
        # per step, each from the carried state detached, with the gradient through its n writes
        options = dict(options, grad_mode="full")
        ys, W = [], W0
        for t in range(T):
            steps = slice(t * n, (t + 1) * n)
            y, W = gated_delta_rule(q[steps], k[steps], v[steps], beta[steps], g[steps], W.detach(), reset[steps],
                                    **options)
            ys.append(y[-1])
        return torch.stack(ys), W


@register_core(
    "gated_delta_net",
    GatedDeltaNetConfig,
    "Gated DeltaNet: gated delta-rule fast weights (Yang et al. 2025 Eq. 10), L2-normalised keys, output norm "
    "and gate; writes=N: Gated DeltaProduct",
)
def build_gated_delta_net(input_size: int, config: GatedDeltaNetConfig) -> Core:
    return FWPTransformerCore(input_size, config, lambda cfg, i: GatedDeltaLayer(cfg))
