"""The acting step's types (``fwrl.agents.acting_batch``): the packed index read back by the layout
it was packed with, and no string-keyed bag of tensors across the acting step's public functions."""

from __future__ import annotations

import collections.abc
import inspect
import threading  # noqa: F401 - named by an annotation the hint test evaluates
import typing

import numpy as np
import pytest
import torch
from torch import Tensor

from fwrl.agents import acting_batch, acting_staging, inference, inference_graph
from fwrl.agents.acting_batch import ActingBatch, ActingOutput, StepIndex, StepLayout
from fwrl.memory_modules.base import State

# the acting step: fwrl.agents.inference, the modules it is split into, and its CUDA-graph replay
ACTING_MODULES = (inference, acting_batch, acting_staging, inference_graph)
MAPPINGS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _tensor_mappings(hint) -> list:
    """The mappings of tensors (``dict[str, Tensor]``, ``Mapping[str, Tensor]``...) anywhere in
    ``hint`` (inside unions, tuples, callables, containers)."""
    found = []
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in MAPPINGS and len(args) == 2 and args[1] is Tensor:
        found.append(hint)
    for arg in args:
        found += _tensor_mappings(arg) if not isinstance(arg, list) else [m for a in arg for m in _tensor_mappings(a)]
    return found


def _hints(function) -> list:
    """The annotations of ``function``, evaluated in its module. A union that Python cannot build at
    run time (``threading.Lock | None``: ``threading.Lock`` is a function) gives each of its members."""
    hints = []
    for annotation in function.__annotations__.values():
        if not isinstance(annotation, str):
            hints.append(annotation)
            continue
        try:
            hints.append(eval(annotation, function.__globals__))
        except TypeError:
            hints += [eval(part, function.__globals__) for part in _union_members(annotation)]
    return hints


def _union_members(annotation: str) -> list[str]:
    """The members of the union ``annotation`` (split at each ``|`` outside brackets)."""
    members, depth, start = [], 0, 0
    for i, char in enumerate(annotation):
        depth += (char in "[(") - (char in "])")
        if char == "|" and depth == 0:
            members.append(annotation[start:i])
            start = i + 1
    return members + [annotation[start:]]


def _public_functions():
    """(name, function) of every public function of the acting modules: module functions, and the
    methods, properties and constructors of their public classes (defined there, not imported)."""
    for module in ACTING_MODULES:
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(value):
                yield f"{module.__name__}.{name}", value
            elif inspect.isclass(value):
                for attr, member in vars(value).items():
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    elif isinstance(member, property):
                        member = member.fget
                    if inspect.isfunction(member) and (not attr.startswith("_") or attr == "__init__"):
                        yield f"{module.__name__}.{name}.{attr}", member


@pytest.mark.parametrize("hint", [dict[str, Tensor], State, typing.Dict[str, Tensor], typing.Mapping[str, Tensor],
                                  tuple[dict[str, Tensor], int] | None, typing.Callable[[dict[str, Tensor]], int]])
def test_the_bag_detector_finds_a_mapping_of_tensors_wherever_it_sits(hint):
    assert _tensor_mappings(hint)


def test_the_hints_of_a_union_python_cannot_build_are_its_members():
    def takes(lock: threading.Lock | dict[str, Tensor] | None) -> tuple[int, int]:  # strings: annotations
        return 0, 0

    assert _union_members("a[b | c] | None") == ["a[b | c] ", " None"]
    assert [m for hint in _hints(takes) for m in _tensor_mappings(hint)] == [dict[str, Tensor]]


def test_no_mapping_of_tensors_crosses_the_acting_steps_public_functions():
    """The acting step's data travels as named types (ActingBatch, ActingOutput, StepIndex), not as a
    string-keyed dict of tensors, through every public function of its modules."""
    functions = dict(_public_functions())
    assert {"fwrl.agents.inference.InferenceLoop.step", "fwrl.agents.acting_staging.Staging.upload",
            "fwrl.agents.acting_batch.StepLayout.unpack", "fwrl.agents.inference_graph.GraphedStep.step",
            "fwrl.agents.inference_graph.GraphedStep.__init__"} <= set(functions)
    offenders = {name: found for name, function in functions.items()
                 if (found := [m for hint in _hints(function) for m in _tensor_mappings(hint)])}
    assert offenders == {}


def test_the_batch_types_name_their_tensors():
    """The fields of the step's index and batch hold no mapping of tensors; the output's only one is
    the core state, by the model's own names (its ``State``)."""
    for kind in (StepLayout, StepIndex, ActingBatch):
        assert [name for name, hint in typing.get_type_hints(kind).items() if _tensor_mappings(hint)] == [], kind
    output = typing.get_type_hints(ActingOutput)
    assert [name for name, hint in output.items() if _tensor_mappings(hint)] == ["state_in"]


@pytest.mark.parametrize("shared,stored,cut", [(False, False, 0), (False, True, 0), (False, True, 2), (True, True, 3),
                                               (True, True, 0)])
def test_a_packed_index_reads_back_by_the_layout_it_was_packed_with(shared, stored, cut):
    """StepIndex.pack lays its parts out as its layout counts them, and that layout's unpack gives
    them back by name on the device (views of the one upload); a layout is a hashable graph key."""
    n = 4
    rng = np.random.default_rng(0)
    part = lambda size: rng.integers(0, 100, size).astype(np.int64)  # noqa: E731
    empty = np.empty(0, np.int64)
    host = StepIndex(part(n), part(n) if shared else empty, part(n) if stored else empty,
                     part(n) if stored else empty, part(cut))
    layout = host.layout
    assert layout == StepLayout(n, n * shared, n * stored, n * stored, cut) and layout.size == sum(layout)
    assert layout.size <= StepLayout.most_entries(n) and StepLayout(*layout) in {layout}
    uploaded = torch.from_numpy(host.pack())
    device = layout.unpack(uploaded)
    for name in StepIndex._fields:
        assert np.array_equal(getattr(device, name).numpy(), getattr(host, name)), name
        assert getattr(device, name).untyped_storage().data_ptr() == uploaded.untyped_storage().data_ptr()
    with pytest.raises(RuntimeError):  # an index read by another layout than its own does not split
        StepLayout(n, 0, 0, 0, cut + 1).unpack(uploaded)
