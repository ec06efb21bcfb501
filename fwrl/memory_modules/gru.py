"""A GRU core: ``nn.GRU`` (Cho et al. 2014, "Learning Phrase Representations using RNN
Encoder-Decoder for Statistical Machine Translation", EMNLP), BPTT across the rollout.

The baseline a memory comparison starts from: on POPGym's partially observable tasks (Morad et al.
2023, "POPGym: Benchmarking Partially Observable Reinforcement Learning", ICLR) the GRU had the best
mean score of the 13 memory models, linear transformers and a fast weight programmer among them.

The weights are one ``nn.GRU``'s, the state ``h`` [B, layers, H], the rows that start an episode
from h = 0, an optional LayerNorm on the input (``input_norm``). On CPU tensors each layer runs
``fwrl.kernels.gru.gru_cpu`` (resets as a multiply at the steps that have one, a hand-derived
backward with the weight gradients batched over the sequence); elsewhere (CUDA, or any device under
``FWRL_KERNELS=reference``), as the LSTM core, one ``nn.GRU`` call (cuDNN) over each segment between
episode starts (``base.run_in_segments``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from fwrl.kernels.dispatch import kernel_backend
from fwrl.kernels.gru import gru_cpu
from fwrl.memory_modules.base import Core, CoreConfig, State, register_core, run_in_segments


WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # one layer's, as nn.GRU names them (+ _l<i>)


class GRUConfig(CoreConfig):
    hidden_size: int = Field(256, ge=1, description="GRU units")
    num_layers: int = Field(1, ge=1, description="stacked GRU layers")
    input_norm: bool = Field(False, description="LayerNorm on the core's input (stem features and reward) "
                             "before the GRU")


class GRUCore(Core):
    config_class = GRUConfig
    # on the CPU it steps through the unroll in Python (kernels/gru/cpu.py: seven calls a step, each way),
    # so the learner's update runs in its own process and the acting step from traces, as the fast-weight
    # cores' do: at the popgym preset 1.3x agent steps/s, and 2.0x at B 8, where the learner thread's
    # calls held the acting thread's GIL (benchmarks/results/popgym_speed.md)
    python_recurrence = True

    def __init__(self, input_size: int, config: GRUConfig | None = None):
        super().__init__()
        config = config or GRUConfig()
        self.input_norm = nn.LayerNorm(input_size) if config.input_norm else None
        self.gru = nn.GRU(input_size, config.hidden_size, num_layers=config.num_layers)
        self.output_size = config.hidden_size
        self.num_layers = config.num_layers

    def initial_state(self, batch_size: int, device=None) -> State:
        dtype = self.gru.weight_ih_l0.dtype
        return {"h": torch.zeros(batch_size, self.num_layers, self.output_size, device=device, dtype=dtype)}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        if self.input_norm is not None:
            x = self.input_norm(x)
        if x.device.type != "cpu" or kernel_backend() not in ("auto", "cpu"):  # CUDA, or FWRL_KERNELS=reference
            return run_in_segments(self.gru, x, state, done, ("h",))
        finals = []
        for layer in range(self.num_layers):
            weights = (getattr(self.gru, f"{name}_l{layer}") for name in WEIGHTS)
            x, h = gru_cpu(x, state["h"][:, layer], done, *weights)
            finals.append(h)
        return x, {"h": torch.stack(finals, dim=1)}


@register_core("gru", GRUConfig, "nn.GRU (Cho et al. 2014), BPTT across the rollout")
def _build(input_size: int, config: GRUConfig) -> Core:
    return GRUCore(input_size, config)
