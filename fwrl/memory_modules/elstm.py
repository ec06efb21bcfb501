"""eLSTM core: LSTM with element-wise recurrence, trained by BPTT or exact RTRL.

Paper 004 (Exploring the Promise and Limits of Real-Time Recurrent Learning),
Eq. 5-7, PAPERS.md §2-3:

    z = tanh(W_z x + w_z * c_{t-1} + b_z),  f = sigmoid(W_f x + w_f * c_{t-1} + b_f)   (Eq. 5)
    c_t = f * c_{t-1} + (1 - f) * z                                                     (Eq. 6)
    o = sigmoid(W_o [x; c_t] + b_o),  h_t = o * c_t                                     (Eq. 7)

Option ``grad``:

* ``bptt``: autograd through the whole sequence given to ``forward`` (the
  learner's rollout: truncated BPTT). State: ``c``.
* ``rtrl``: exact RTRL (Eq. 8-12, R2AC). The recurrent parameters W_z, W_f,
  w_z, w_f, b_z, b_f get ``sum_t dL/dc_t . dc_t/dtheta`` with the sensitivities
  dc_t/dtheta carried across rollouts in the state (``Z``, ``F``, ``s_wz``,
  ``s_wf``, ``s_bz``, ``s_bf``; zeroed with c on episode starts). Inference
  (T = 1, no grad) just advances them with the acting weights; the learner
  recomputes them from the rollout's initial ones with the current weights
  (see ``fwrl.kernels.elstm_rtrl.recurrence``). The output gate is trained by
  ordinary backprop; the input x (the vision stem) gets the one-step Jacobian.

One layer only: with a second recurrent layer RTRL loses its tractability
(Paper 004, Sec. 5).

Initialisation: W_z, W_f, w_z, w_f, b_z, b_f ~ N(0, 0.1^2) (std 0.1,
PAPERS.md §2); the output gate has PyTorch's Linear default. Option
``forget_bias`` (default 0) shifts the mean of b_f: with the default init
f ~ 0.5, so dc_t/dc_{t-k} ~ 0.5^k and a cue 40 steps back gets no usable
gradient by any method; a positive forget-gate bias (Gers et al. 2000) keeps
the memory open at the start of training.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.nn import functional as F

from fwrl.kernels.elstm_rtrl import (
    PARAM_KEYS,
    SENSITIVITY_KEYS,
    elstm_rtrl,
    elstm_scan,
    initial_sensitivities,
)
from fwrl.memory_modules.base import Core, CoreConfig, State, register_core, scaled_randn

GRADIENT_METHODS = ("bptt", "rtrl")  # how the eLSTM core learns (not the fwp cores' GRAD_MODES)
INIT_STD = 0.1


class ELSTMConfig(CoreConfig):
    hidden_size: int = Field(256, ge=1, description="eLSTM cells")
    num_layers: int = Field(1, ge=1, le=1, description="recurrent layers; exact RTRL is tractable for one "
                            "element-wise recurrent layer only (Paper 004, Sec. 5)")
    grad: Literal[GRADIENT_METHODS] = Field("bptt", description="truncated BPTT or exact RTRL, R2AC")
    forget_bias: float = Field(0.0, description="mean of the forget-gate bias init; its std stays 0.1")


class ELSTMCore(Core):
    """One eLSTM layer (Eq. 5-7); ``forward`` follows the ``Core`` interface."""

    config_class = ELSTMConfig

    def __init__(self, input_size: int, config: ELSTMConfig | None = None):
        super().__init__()
        config = config or ELSTMConfig()
        H, D = config.hidden_size, input_size
        self.input_size = D
        self.output_size = H
        self.grad_mode = config.grad
        self.W_z = nn.Parameter(scaled_randn((H, D), INIT_STD))
        self.W_f = nn.Parameter(scaled_randn((H, D), INIT_STD))
        self.w_z = nn.Parameter(scaled_randn((H,), INIT_STD))
        self.w_f = nn.Parameter(scaled_randn((H,), INIT_STD))
        self.b_z = nn.Parameter(scaled_randn((H,), INIT_STD))
        self.b_f = nn.Parameter(scaled_randn((H,), INIT_STD, config.forget_bias))
        self.out_gate = nn.Linear(D + H, H)  # W_o [x; c] + b_o (Eq. 7: O x + W^o c)

    def recurrent_parameters(self) -> dict[str, Tensor]:
        """The six parameters inside the recurrence (those RTRL computes gradients for)."""
        return {key: getattr(self, key) for key in PARAM_KEYS}

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = self.W_z.dtype
        device = self.W_z.device if device is None else device
        state = {"c": torch.zeros(batch_size, self.output_size, dtype=dtype, device=device)}
        if self.grad_mode == "rtrl":
            state.update(
                initial_sensitivities(
                    batch_size, self.output_size, self.input_size, dtype=dtype, device=device
                )
            )
        return state

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        params = self.recurrent_parameters()
        done = done.to(torch.bool)
        if self.grad_mode == "rtrl":
            c_all, sens = elstm_rtrl(x, state["c"], {k: state[k] for k in SENSITIVITY_KEYS}, params, done)
            new_state = {"c": c_all[-1].detach(), **sens}
        else:
            c_all = elstm_scan(x, state["c"], *params.values(), done)
            new_state = {"c": c_all[-1]}
        # W_o [x; c] + b_o as two products on column blocks of the same weight:
        # autograd then keeps x and c themselves (the storages the RTRL Function
        # saves too) rather than a [T, B, D + H] concatenated copy
        W_o, D = self.out_gate.weight, self.input_size
        o = torch.sigmoid(F.linear(x, W_o[:, :D], self.out_gate.bias) + F.linear(c_all, W_o[:, D:]))
        return o * c_all, new_state


@register_core("elstm", ELSTMConfig, "eLSTM (element-wise recurrence), BPTT or exact RTRL (grad=rtrl)")
def _build(input_size: int, config: ELSTMConfig) -> Core:
    return ELSTMCore(input_size, config)
