"""Each rule's signature is its reference's (``fwrl/kernels/<rule>/naive.py``), stated there once:
the CPU path (``cpu.py``) and the Triton entry (``<rule>_triton`` of ``fused_recurrent.py``, the
Python wrapper that launches the kernels) take the same parameters, in the same order, with the
same kinds, defaults and annotations, and return what it returns. The Triton entry may add the
keyword-only tuning knobs its module's ``TUNING_KEYWORDS`` names (with defaults), which dispatch
never passes.

The CPU paths need no Triton; the Triton entries are imported as dispatch imports them (built for
GPUs; nothing is launched), and skipped only where Triton is not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

from fwrl.kernels.delta_lstm import RULE as DELTA_LSTM
from fwrl.kernels.delta_rnn import RULE as DELTA_RNN
from fwrl.kernels.delta_rule import RULE as DELTA_RULE
from fwrl.kernels.dispatch import KernelRule
from fwrl.kernels.gated_delta_rule import RULE as GATED_DELTA_RULE
from fwrl.kernels.rdn import RULE as RDN
from fwrl.kernels.srwm import RULE as SRWM

BY_RULE = [pytest.param(rule, id=rule.name) for rule in (DELTA_RULE, GATED_DELTA_RULE, DELTA_RNN, DELTA_LSTM, RDN, SRWM)]
NO_TRITON = "Triton is not installed (pip install -e '.[kernels]'), so the Triton entries cannot be imported"


def _differences(got: inspect.Signature, expected: inspect.Signature) -> str:
    return f"\n  got      {got}\n  expected {expected} (the reference's)"


@pytest.mark.parametrize("rule", BY_RULE)
def test_cpu_path_takes_the_references_arguments(rule: KernelRule):
    got, expected = inspect.signature(rule.cpu), inspect.signature(rule.reference)
    assert got == expected, f"{rule.cpu.__qualname__}:" + _differences(got, expected)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason=NO_TRITON)
@pytest.mark.parametrize("rule", BY_RULE)
def test_triton_entry_takes_the_references_arguments(rule: KernelRule):
    module = importlib.import_module(rule.fused)
    entry = getattr(module, f"{rule.name}_triton")
    got, expected = inspect.signature(entry), inspect.signature(rule.reference)
    tuning = getattr(module, "TUNING_KEYWORDS", ())
    for name in tuning:
        knob = got.parameters.get(name)
        assert knob is not None and knob.kind is inspect.Parameter.KEYWORD_ONLY and knob.default is not knob.empty, (
            f"{entry.__qualname__}: TUNING_KEYWORDS names {name!r}, not a keyword-only parameter with a default")
    shared = got.replace(parameters=[p for p in got.parameters.values() if p.name not in tuning])
    assert shared == expected, f"{entry.__qualname__} (tuning keywords {tuning} aside):" + _differences(got, expected)
