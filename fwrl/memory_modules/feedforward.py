"""The feedforward baseline: no memory at all (PAPERS.md §1).

It is the LSTM agent with the LSTM layer removed: the heads read the core
input (the 256-d stem features and the clipped reward) directly.
"""

from __future__ import annotations

from torch import Tensor

from fwrl.memory_modules.base import Core, CoreConfig, State, register_core


class FeedforwardConfig(CoreConfig):
    """The feedforward core has no options."""


class FeedforwardCore(Core):
    config_class = FeedforwardConfig
    python_recurrence = False  # one fused call (or none): the update process gains nothing (fwrl train)

    def __init__(self, input_size: int, config: FeedforwardConfig | None = None):
        super().__init__()
        self.output_size = input_size

    def initial_state(self, batch_size: int, device=None) -> State:
        return {}

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        return x, state


@register_core("feedforward", FeedforwardConfig, "no memory: heads read the stem features")
def _build(input_size: int, config: FeedforwardConfig) -> Core:
    return FeedforwardCore(input_size, config)
