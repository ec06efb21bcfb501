"""The associative-recall task of ``benchmarks/assoc_recall.py`` as the tests pose it: eight pairs,
four keys, four values, one head of key dimension 4 (so the pairs outnumber the key dimension),
and the benchmark module itself, loaded from its file."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "assoc_recall.py"
N, NUM_KEYS, NUM_VALUES = 8, 4, 4
HEAD_DIM = 4  # the key dimension d_dot: N > HEAD_DIM


@functools.cache
def benchmark() -> ModuleType:
    """``benchmarks/assoc_recall.py`` as a module."""
    spec = importlib.util.spec_from_file_location("assoc_recall_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
