"""Choose the fused Triton kernel or the PyTorch reference for each call of a rule.

Each rule declares its backends once, as a :class:`KernelRule` in its ``__init__.py``:
the reference (``naive``), whose signature is the rule's, stated there once; the CPU path
(``cpu``) and the fused kernel (``fused_recurrent``, imported on the first call that may use
it: importing a rule does not import Triton), which take the same arguments
(``tests/interpreter/test_kernel_signatures.py`` checks it); the kernel's ``supports`` reads
a call's arguments by the reference's parameter names (:func:`kernel_inputs`).
:func:`kernel_function` makes the rule's public function from it (the reference's
signature and a ``layer=`` keyword), and every call goes through :func:`dispatch`.

CUDA tensors with a shape a kernel supports use Triton; CPU tensors use the rule's CPU path
(``cpu.py``: the same maths in a few batched torch calls per step with a hand-derived backward)
where the rule has one; everything else uses the reference. ``FWRL_KERNELS=reference|triton|cpu``
forces one (forcing triton on an unsupported input is an error that says why; the CPU path runs
on any device, but reads the reset steps on the host, so it does not belong in a CUDA graph).

Every call names its layer (``layer=``, a stable key such as the calling
module's ``kernel_layer_name``); the first call of each layer logs, at INFO on
the ``fwrl.kernels`` logger, which backend runs and on what shape. A CUDA input
that falls back to the reference is never silently slow: it warns once per
layer and reason, saying why and what would avoid it (a supported head dim,
dtype or feature map; ``pip install -e '.[kernels]'``; or
``FWRL_KERNELS=reference`` to choose the reference on purpose, which silences
the warning). CPU inputs run the reference without a warning.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from torch import Tensor, nn

from fwrl.errors import FwrlError, install_command, unknown_choice

BACKENDS = ("auto", "reference", "triton", "cpu")

logger = logging.getLogger("fwrl.kernels")

# Layers (with their kernel, backend and device) already logged, and (layer,
# kernel, reason) already warned about: each is said once per process.
_announced: set[tuple[str, str, str, str]] = set()
_warned: set[tuple[str, str, str]] = set()


class KernelFallbackWarning(UserWarning):
    """A CUDA input runs the (much slower) PyTorch reference instead of a fused kernel."""


class Fused(NamedTuple):
    """A rule's fused kernel: ``run`` takes the arguments of the rule's reference;
    ``supports(inputs)`` says why it cannot run on a call's arguments (:func:`kernel_inputs`;
    None when it can)."""

    run: Callable[..., Any]
    supports: Callable[[Mapping[str, Any]], str | None]


class KernelRule(NamedTuple):
    """One rule's backends, declared once (in ``fwrl/kernels/<rule>/__init__.py``).

    ``reference(*args, **options)`` defines the maths and the signature; ``cpu`` (None: the rule
    has no CPU path) takes the same arguments, and so does ``<name>_triton`` in the ``fused``
    module (with, at most, the keyword-only tuning knobs its ``TUNING_KEYWORDS`` names), whose
    ``supports(inputs)`` says why it cannot run on a call's arguments (None when it can).
    ``title`` names the rule in messages ("no Triton <title> kernel ...")."""

    name: str
    title: str
    reference: Callable[..., Any]
    cpu: Callable[..., Any] | None
    fused: str

    def load_fused(self) -> Fused:
        """The fused kernel and its ``supports`` (imports Triton)."""
        module = importlib.import_module(self.fused)
        return Fused(getattr(module, f"{self.name}_triton"), module.supports)

    def inputs(self, *args: Any, **options: Any) -> dict[str, Any]:
        """The arguments of a call of this rule by the reference's parameter names (what
        ``supports`` reads): :func:`kernel_inputs` of the reference."""
        return kernel_inputs(self.reference, args, options)


@functools.cache
def _parameters(reference: Callable[..., Any]) -> tuple[inspect.Signature, tuple[str, ...], dict[str, Any]]:
    """The reference's signature, the names its positional arguments bind to, and its defaults."""
    signature = inspect.signature(reference)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(name for name, p in signature.parameters.items() if p.kind in positional)
    defaults = {name: p.default for name, p in signature.parameters.items() if p.default is not p.empty}
    return signature, names, defaults


def kernel_inputs(reference: Callable[..., Any], args: tuple, options: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of the call ``reference(*args, **options)`` by its parameter names, defaults
    filled in: what a rule's ``supports`` reads, so that its reasons name the reference's
    parameters. Arguments that do not bind raise the ``TypeError`` the call would."""
    signature, names, defaults = _parameters(reference)
    inputs = {**defaults, **dict(zip(names, args)), **options}
    if len(args) > len(names) or len(inputs) != len(signature.parameters):
        signature.bind(*args, **options)
    return inputs


def kernel_function(rule: KernelRule) -> Callable[..., Any]:
    """The public function of ``rule``: the reference's signature and docstring plus a keyword
    ``layer`` (the key its first call's log line and any fallback warning name), dispatching
    each call to a backend (:func:`dispatch`)."""
    signature = inspect.signature(rule.reference)
    layer_parameter = inspect.Parameter("layer", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation="str | None")

    @functools.wraps(rule.reference)
    def run(*args: Any, layer: str | None = None, **options: Any) -> Any:
        return dispatch(rule, args, options, layer)

    run.__signature__ = signature.replace(parameters=[*signature.parameters.values(), layer_parameter])
    run.__name__ = run.__qualname__ = rule.name
    run.__module__ = rule.fused.rsplit(".", 1)[0]
    run.__doc__ = (f"{rule.title} over a whole sequence: the fused Triton kernel, the CPU path or the "
                   f"reference, as ``fwrl.kernels.dispatch`` chooses. The reference's doc:\n\n"
                   f"{rule.reference.__doc__ or ''}")
    return run


def kernel_backend() -> str:
    """The backend requested through ``FWRL_KERNELS`` (default ``auto``)."""
    value = os.environ.get("FWRL_KERNELS", "auto")
    if value not in BACKENDS:
        raise unknown_choice("FWRL_KERNELS value", value, BACKENDS)
    return value


def kernel_layer_name(module: nn.Module) -> str:
    """The ``layer`` key of a fast-weight layer: its class and identity (stable for its life)."""
    return f"{type(module).__name__}@{id(module):#x}"


def forget_announcements() -> None:
    """Log and warn again as if no layer had been seen (for tests)."""
    _announced.clear()
    _warned.clear()


def _on_cuda(x: Tensor) -> bool:
    return x.device.type == "cuda"


def _capturing(x: Tensor) -> bool:
    """Whether ``x``'s CUDA stream is being captured into a CUDA graph (never on the CPU)."""
    if not _on_cuda(x):
        return False
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _describe(x: Tensor) -> str:
    return f"{list(x.shape)} {str(x.dtype).removeprefix('torch.')} on {x.device}"


def fallback_message(kernel: str, layer: str, reason: str) -> str:
    """The warning for a CUDA input that runs the reference: why, and what would avoid it.

    ``reason`` comes from the kernel's ``supports`` (which says, in parentheses, what
    input the kernel would take) or from the import of Triton.
    """
    return (f"fwrl.kernels: layer {layer}: the {kernel} recurrence runs the PyTorch reference on "
            f"CUDA, much slower than its fused Triton kernel, because {reason}. To run the "
            f"kernel, change that; to choose the reference on purpose (and silence this "
            f"warning), set FWRL_KERNELS=reference.")


def _announce(layer: str, kernel: str, backend: str, x: Tensor, why: str = "") -> None:
    key = (layer, kernel, backend, str(x.device))
    if key in _announced:
        return
    _announced.add(key)
    because = f" ({why})" if why else ""
    logger.info("layer %s: %s runs on %s%s, input %s", layer, kernel, backend, because,
                _describe(x))


def _warn_fallback(layer: str, kernel: str, reason: str) -> None:
    key = (layer, kernel, reason)
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(fallback_message(kernel, layer, reason), KernelFallbackWarning, stacklevel=4)


def _load_fused(load: Callable[[], Fused]) -> tuple[Fused | None, str | None]:
    """(the rule's fused kernel, None), or (None, why it cannot be imported)."""
    try:
        return load(), None
    except ImportError as exc:
        return None, (f"Triton is not importable ({exc}; install it with "
                      f"{install_command('kernels')})")


def _first_input(rule: KernelRule, args: tuple, options: Mapping[str, Any]) -> Tensor:
    """The call's first argument (every rule's is a per-step input tensor): its device decides."""
    if args:
        return args[0]
    return kernel_inputs(rule.reference, args, options)[_parameters(rule.reference)[1][0]]


def dispatch(rule: KernelRule, args: tuple, options: dict[str, Any], layer: str | None) -> Any:
    """``rule``'s fused kernel on ``(*args, **options)`` where the backend allows Triton and its
    ``supports`` gives no reason against the call's arguments (:func:`kernel_inputs`); the rule's
    CPU path for CPU inputs (or everywhere under ``FWRL_KERNELS=cpu``); otherwise the reference,
    or under ``FWRL_KERNELS=triton`` an error "FWRL_KERNELS=triton but no Triton <title> kernel
    can run on these inputs: <reason>.". Logs the choice once per ``layer``; warns once per layer
    and reason when a CUDA input falls back."""
    backend = kernel_backend()
    kernel = rule.name
    x = _first_input(rule, args, options)
    layer = layer or f"{kernel} (unnamed)"
    if backend == "reference":
        _announce(layer, kernel, "reference", x, "FWRL_KERNELS=reference")
        return rule.reference(*args, **options)
    if rule.cpu is not None and (backend == "cpu" or (backend == "auto" and not _on_cuda(x))):
        if not _capturing(x):
            _announce(layer, kernel, "cpu", x, "FWRL_KERNELS=cpu" if backend == "cpu" else "")
            return rule.cpu(*args, **options)
        backend = "auto"  # the CPU path reads the reset steps on the host: a CUDA graph cannot capture it
    if backend == "cpu":
        _announce(layer, kernel, "reference", x, f"the {kernel} rule has no CPU path")
        return rule.reference(*args, **options)
    triton_kernel, reason = _load_fused(rule.load_fused)
    if triton_kernel is not None:
        reason = triton_kernel.supports(kernel_inputs(rule.reference, args, options))
        if reason is None:
            _announce(layer, kernel, "triton", x)
            return triton_kernel.run(*args, **options)
    if backend == "triton":
        raise FwrlError(f"FWRL_KERNELS=triton but no Triton {rule.title} kernel can run on these inputs "
                        f"(fwrl.kernels.{kernel}): {reason}.")
    if _on_cuda(x):
        _warn_fallback(layer, kernel, reason)
    _announce(layer, kernel, "reference", x, reason)
    return rule.reference(*args, **options)
