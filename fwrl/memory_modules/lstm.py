"""The classic IMPALA memory: one ``nn.LSTM(257, 256)`` layer (PAPERS.md §1-2).

The whole sequence runs through ``nn.LSTM`` in as few calls as the resets
allow (``base.run_in_segments``: cut only at steps where some row starts a new
episode, those rows' (h, c) zeroed there), which keeps the fused LSTM kernels
(cuDNN on GPU, oneDNN on CPU) instead of a Python loop over steps.

``forget_bias`` (default 0: PyTorch's init, as the IMPALA agent had) is added
to the forget-gate bias of every layer. With 0 the forget gate starts near
0.5, so a cue k steps back reaches the loss scaled by ~0.5^k; a positive
bias (Gers et al. 2000; Jozefowicz et al. 2015 recommend 1) lets it through.

``input_norm`` (default false: the IMPALA agent) reads the core's input
through a LayerNorm (Ba et al. 2016) before the LSTM, as the fast-weight
block reads its residual stream. On Atari frames the stem's features are a
large common offset with a small frame-dependent part; RMSProp moves every
input weight by about the learning rate per update, so that offset drives
the gate pre-activations beyond +-5 within tens of updates (Pong, B 8, lr
1e-3: 88% of them after 50 updates) and the agent stops seeing the frame.
With the LayerNorm none saturate (0-1.8% after 300 updates at lr 6e-4 to
1e-3; ``benchmarks/learning/pong_gate_saturation.py``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from fwrl.memory_modules.base import Core, CoreConfig, State, register_core, run_in_segments


class LSTMConfig(CoreConfig):
    hidden_size: int = Field(256, ge=1, description="LSTM units")
    num_layers: int = Field(1, ge=1, description="stacked LSTM layers")
    forget_bias: float = Field(0.0, description="added to the forget gate's input bias; 0: PyTorch's init")
    input_norm: bool = Field(False, description="LayerNorm on the core's input (stem features and reward) "
                             "before the LSTM; false: the IMPALA agent")


class LSTMCore(Core):
    config_class = LSTMConfig
    python_recurrence = False  # one fused call (or none): the update process gains nothing (fwrl train)

    def __init__(self, input_size: int, config: LSTMConfig | None = None):
        super().__init__()
        config = config or LSTMConfig()
        self.input_norm = nn.LayerNorm(input_size) if config.input_norm else None
        self.lstm = nn.LSTM(input_size, config.hidden_size, num_layers=config.num_layers)
        H = config.hidden_size
        with torch.no_grad():
            for layer in range(config.num_layers):
                getattr(self.lstm, f"bias_ih_l{layer}")[H:2 * H] += config.forget_bias
        self.output_size = config.hidden_size
        self.num_layers = config.num_layers

    def initial_state(self, batch_size: int, device=None) -> State:
        shape = (batch_size, self.num_layers, self.output_size)
        return {"h": torch.zeros(shape, device=device), "c": torch.zeros(shape, device=device)}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        if self.input_norm is not None:
            x = self.input_norm(x)
        return run_in_segments(self.lstm, x, state, done, ("h", "c"))


@register_core("lstm", LSTMConfig, "nn.LSTM, BPTT across the rollout")
def _build(input_size: int, config: LSTMConfig) -> Core:
    return LSTMCore(input_size, config)
