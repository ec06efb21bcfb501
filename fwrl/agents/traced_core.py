"""The core's acting step (T = 1, no autograd) on the CPU as a TorchScript trace (``--acting-trace``).

A fast-weight core's step at T = 1 is 100-250 small torch calls (its projections, LayerNorms, the
rule's products, the reset of the rows whose episode starts), and on the CPU each call costs
microseconds of Python and dispatch, more than its arithmetic at these sizes. A trace records the
calls once and replays them from TorchScript's C++ interpreter: the same aten operations in the same
order, without the Python in between (measured side by side:
``benchmarks/results/cpu_cores/acting_trace.md``). The results are the eager step's bit for bit at
most shapes; at some, TorchScript's ``addmm`` rounds differently from eager's (the GRU's input
product at a 257-wide input: 6e-8), so a trace is checked to float round-off, not bit equality.

:class:`TracedCoreStep` wraps a core and keeps traces per input shape (the number of slots of an
acting step and the state's shapes). A trace follows the Python branches its example took, so each
shape has two: one of a step where no row resets, used for such steps, and one where some rows
reset (every core's reset branch recorded; applied to rows that do not reset it is the identity),
used for the others. Before a trace is used it must give the eager step's outputs and
states on copies of the first real step's inputs, with the patterns it serves: no row resetting,
and for the second also every row and that step's rows. A core that cannot be traced or does not
match runs eagerly, said once in a warning. The traces hold the core's parameter tensors
themselves, so a publish (an in-place copy into them) is seen by the next step.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
from torch import Tensor, nn

from fwrl.errors import FwrlError, unknown_choice

State = dict[str, Tensor]
MAX_TRACES = 64  # shapes kept per core: an acting loop sees one per batch size it serves
# (rtol, atol) a trace's outputs may differ from the eager step's by: a few ulps of a product's rounding
ROUND_OFF = {torch.float64: (1e-12, 1e-14), torch.float32: (1e-5, 1e-6), torch.bfloat16: (1e-2, 1e-3),
             torch.float16: (1e-3, 1e-4)}


def traced_by_default(core: nn.Module, device: torch.device) -> bool:
    """Whether ``core`` acts from traces unless told otherwise (``--acting-trace auto``, and
    ``fwrl evaluate``): on the CPU, for a core that steps through the unroll in Python
    (``Core.python_recurrence``: a fast-weight core's step is 100-250 small calls, whose Python the
    trace leaves out; torch's LSTM is one call already; the GRU's CPU step is seven)."""
    return device.type == "cpu" and bool(getattr(core, "python_recurrence", False))


def traced_acting(requested: str, device: torch.device, core: nn.Module) -> bool:
    """Whether the core's acting step runs from TorchScript traces (``acting_trace``;
    :mod:`fwrl.agents.traced_core`): "on" (refused off the CPU, where CUDA graphs replay the step),
    "off", or auto (:func:`traced_by_default`: on on the CPU for a core
    that steps through the unroll in Python). Measured side by side:
    ``benchmarks/results/cpu_cores/acting_trace.md``."""
    if requested not in ("auto", "on", "off"):
        raise unknown_choice("acting_trace", requested, ("auto", "on", "off"))
    if requested == "on" and device.type != "cpu":
        raise FwrlError(f"acting_trace=on traces the acting step on the CPU; this run's device is {device}, where "
                        "CUDA graphs replay it (inference_graph): use acting_trace=auto or off.")
    return requested == "on" or (requested == "auto" and traced_by_default(core, device))  # on: the CPU (above)


class _FlatCore(nn.Module):
    """``core`` with the state as positional tensors in ``names``' order (what a trace takes)."""

    def __init__(self, core: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.core = core
        self.names = names

    def forward(self, x: Tensor, done: Tensor, *values: Tensor) -> tuple[Tensor, ...]:
        out, state = self.core(x, dict(zip(self.names, values)), done)
        return (out, *(state[name] for name in self.names))


class TracedCoreStep:
    """``core(x, state, done)`` for T = 1 without autograd on the CPU, replayed from a trace per
    input shape; anything else (T > 1, autograd, another device) calls the core itself.

    Two traces per shape: one of a step where some rows reset (it serves any step) and one of a
    step where none does (the step of most calls: it leaves out the reset's work, such as zeroing
    the rows' fast-weight matrices, as the eager step does); one host read picks between them."""

    def __init__(self, core: nn.Module, name: str | None = None):
        self.core = core
        self.name = name or _core_name(core)
        self._traces: dict[Any, tuple[Callable, Callable] | None] = {}  # None: this shape runs eagerly
        self._warned = False

    def __call__(self, x: Tensor, state: State, done: Tensor) -> tuple[Tensor, State]:
        if x.shape[0] != 1 or x.device.type != "cpu" or torch.is_grad_enabled():
            return self.core(x, state, done)
        names = tuple(state)
        key = (tuple(x.shape), x.dtype, tuple(done.shape), names,
               tuple((tuple(v.shape), v.dtype) for v in state.values()))
        if key not in self._traces:
            self._traces[key] = self._trace(x, state, done, names) if len(self._traces) < MAX_TRACES else None
        traces = self._traces[key]
        if traces is None:
            return self.core(x, state, done)
        out, *values = traces[bool(done.any())](x, done, *state.values())
        return out, dict(zip(names, values))

    def _trace(self, x: Tensor, state: State, done: Tensor, names: tuple[str, ...]
               ) -> tuple[Callable, Callable] | None:
        """(the trace of a step without resets, the trace of one with), each checked against the
        eager step on the patterns it serves; None where either fails or differs."""
        flat = _FlatCore(self.core, names)
        clear = torch.zeros(done.shape, dtype=done.dtype)
        some = clear.clone()
        some.view(-1)[::2] = True  # some rows reset: the reset branches are recorded
        traces = []
        try:
            for example, patterns in ((clear, (clear,)), (some, (clear, torch.ones_like(clear), done, some))):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # TracerWarnings: the branches it takes are checked below
                    traced = torch.jit.trace(flat, (x, example, *_copies(state)), check_trace=False)
                for pattern in patterns:
                    if not _same(flat(x, pattern, *_copies(state)), traced(x, pattern, *_copies(state))):
                        return self._eager(f"its trace differs from the eager step (resets {_rows(pattern)})")
                traces.append(traced)
        except Exception as exc:  # noqa: BLE001  (any failure to trace leaves the eager step)
            return self._eager(f"it could not be traced: {type(exc).__name__}: {exc}".splitlines()[0])
        return traces[0], traces[1]

    def _eager(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"fwrl: the acting step of the {self.name} core runs eagerly: {why}", RuntimeWarning,
                          stacklevel=3)
        return None


def _core_name(core: nn.Module) -> str:
    """The core's class, with its first fast-weight layer's where it has blocks of them."""
    blocks = getattr(core, "blocks", None)
    layer = getattr(blocks[0], "fwp", None) if blocks else None
    return type(core).__name__ + (f" ({type(layer).__name__})" if layer is not None else "")


def _copies(state: State) -> list[Tensor]:
    return [value.clone() for value in state.values()]


def _same(a: tuple[Tensor, ...], b: tuple[Tensor, ...]) -> bool:
    """The same outputs: equal shapes and dtypes, values equal to round-off (``ROUND_OFF``; exact for
    integer and boolean tensors). A trace that baked in a wrong branch differs far beyond it."""
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and _close(x, y) for x, y in zip(a, b))


def _close(x: Tensor, y: Tensor) -> bool:
    if not x.is_floating_point():
        return torch.equal(x, y)
    rtol, atol = ROUND_OFF.get(x.dtype, ROUND_OFF[torch.float32])
    return torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)


def _rows(done: Tensor) -> str:
    n = int(done.sum())
    return "none" if n == 0 else "all" if n == done.numel() else f"{n} of {done.numel()}"
