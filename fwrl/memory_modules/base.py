"""The Core interface every memory module implements, and the registry of cores.

A core maps a sequence of feature vectors to a sequence of outputs while
carrying a recurrent state (LSTM cells, fast weight matrices, RTRL
sensitivities...). The same ``forward`` serves inference (T = 1) and learning
(T = unroll + 1), see ``ARCHITECTURE.md``:

    x [T, B, D_in], state {name: [B, ...]}, done [T, B] bool
        -> y [T, B, output_size], final state

``done[t]`` means observation t is the first frame of a new episode: before
step t, the rows with ``done[t]`` are reset to ``initial_state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch
from torch import Tensor, nn

from fwrl.errors import unknown_choice
from fwrl.utils.settings import Settings

State = dict[str, Tensor]


class CoreConfig(Settings):
    """Base of every core's configuration (a pydantic model, ``fwrl.utils.settings``).

    Subclasses define each option once: ``name: type = Field(default, ge=..., description=...)``
    (choices as ``Literal[...]``). ``from_options`` reads ``--core-opt key=value``
    strings or a YAML mapping; an unknown key or a bad value is a FwrlError
    naming the option, the value and what is valid.
    """

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, core: str = "") -> "CoreConfig":
        return cls.parse(options, what="core option", source=f"of core {core}" if core else "")


class Core(nn.Module):
    """A recurrent memory module behind one interface (ARCHITECTURE.md, Memory cores and kernels).

    Subclasses set ``output_size`` and implement ``initial_state`` and ``forward``.
    Resets: before step t, rows with ``done[t]`` must start from
    ``initial_state`` (``reset_rows`` does it for a whole state dict).
    """

    output_size: int
    config_class: ClassVar[type[CoreConfig]] = CoreConfig
    # orthogonal gains (policy, value) for the heads that read this core; None: the agent's init scheme
    head_gains: tuple[float | None, float | None] = (None, None)
    # whether training steps this core through the unroll in Python (many small calls holding the GIL),
    # which the learner's update process takes off the acting thread's GIL; False: one fused torch call
    # whose C++ runs with the GIL released (nn.LSTM, nn.GRU) or no recurrence at all
    python_recurrence: ClassVar[bool] = True

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        raise NotImplementedError

    def forward(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        raise NotImplementedError


def _drawing_shapes_only() -> bool:
    """True while modules are built on the meta device (the preflight's model of shapes only)."""
    return torch.get_default_device().type == "meta"


def normal_init_(param: Tensor, std: float) -> Tensor:
    """``nn.init.normal_(param, 0, std)``, and nothing on the meta device: a model of shapes only
    draws no numbers, and torch's meta ``normal_`` imports torch.compile's machinery (1.2 s of CPU at
    the start of every run of a core that draws its own slow weights)."""
    return param if param.is_meta else nn.init.normal_(param, mean=0.0, std=std)


def scaled_randn(shape: tuple[int, ...], std: float, mean: float | None = None) -> Tensor:
    """``torch.randn(*shape) * std`` (``+ mean`` where given), and an empty tensor of that shape on the
    meta device (as :func:`normal_init_`; there the product too would import it)."""
    if _drawing_shapes_only():
        return torch.empty(*shape)
    draw = torch.randn(*shape) * std
    return draw if mean is None else draw + mean


def reset_rows(state: State, initial: State, done_t: Tensor) -> State:
    """Replace the rows of ``state`` where ``done_t`` [B] is true by ``initial``'s rows."""
    out = {}
    for name, value in state.items():
        mask = done_t.view(-1, *([1] * (value.dim() - 1)))
        out[name] = torch.where(mask, initial[name].to(value.dtype), value)
    return out


def zero_rows(state: State, done_t: Tensor) -> State:
    """Zero the rows of ``state`` where ``done_t`` [B] is true (a zero initial state)."""
    out, masks = {}, {}
    for name, value in state.items():
        rank = value.dim()  # one mask serves every state tensor of its rank
        if rank not in masks:
            masks[rank] = done_t.view(-1, *([1] * (rank - 1)))
        out[name] = value.masked_fill(masks[rank], 0)
    return out


def run_in_segments(rnn: nn.RNNBase, x: Tensor, state: State, done: Tensor, names: tuple[str, ...]
                    ) -> tuple[Tensor, State]:
    """``rnn`` (torch's LSTM or GRU, sequence-first) over ``x`` [T, B, D] in as few calls as the
    episode starts allow: the sequence is cut only at steps where some row starts a new episode, and
    those rows' states are zeroed there, so the fused kernels (cuDNN, oneDNN) run whole segments
    instead of a Python loop over steps. ``state`` holds ``names`` (in the order the RNN takes its
    hidden state: h, then c for the LSTM), each [B, layers, H]. Finding the cuts is a host read,
    which a single step (acting, captured in CUDA graphs) does without: its reset is row-wise."""
    T = x.shape[0]
    starts = done.any(dim=1).nonzero().flatten().tolist() if T > 1 else []
    bounds = sorted(set([0, *starts, T]))
    outputs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        state = zero_rows(state, done[start])
        hidden = tuple(state[name].transpose(0, 1).contiguous() for name in names)
        y, new = rnn(x if end - start == T else x[start:end], hidden if len(hidden) > 1 else hidden[0])
        outputs.append(y)
        state = {name: value.transpose(0, 1) for name, value in zip(names, new if len(names) > 1 else (new,))}
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), state


# --------------------------------------------------------------------------- registry

CoreFactory = Callable[[int, CoreConfig], Core]


@dataclass(frozen=True)
class _Entry:
    factory: CoreFactory
    config_class: type[CoreConfig]
    summary: str


_REGISTRY: dict[str, _Entry] = {}


def register_core(name: str, config_class: type[CoreConfig], summary: str = ""):
    """Class or function decorator: register ``factory(input_size, config) -> Core``."""

    def decorate(factory: CoreFactory) -> CoreFactory:
        if name in _REGISTRY:
            raise ValueError(f"core {name!r} registered twice")
        _REGISTRY[name] = _Entry(factory, config_class, summary)
        return factory

    return decorate


def core_names() -> list[str]:
    return sorted(_REGISTRY)


def core_summary(name: str) -> str:
    return _entry(name).summary


def core_config_class(name: str) -> type[CoreConfig]:
    return _entry(name).config_class


def _entry(name: str) -> _Entry:
    if name not in _REGISTRY:
        raise unknown_choice("core", name, _REGISTRY)
    return _REGISTRY[name]


def build_core(
    name: str, input_size: int, options: Mapping[str, Any] | CoreConfig | None = None
) -> Core:
    """Build the core ``name`` for inputs of size ``input_size``.

    ``options`` is a typed config or a mapping of option strings (``--core-opt``).
    """
    entry = _entry(name)
    config = options if isinstance(options, CoreConfig) else entry.config_class.from_options(options, core=name)
    core = entry.factory(input_size, config)
    core.config = config
    return core
