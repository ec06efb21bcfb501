"""Why the sum rule must lose associative recall once the pairs outnumber the key dimension
(paper 001, Sec. 4.1-4.2 and 6.1): the order-blind ceiling's formula against brute force, and a
one-layer Linear Transformer's answer does not depend on the order of the pairs while Delta Net's
does. The learning claims built on this are ``tests/learning/test_assoc_recall_capacity.py``."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from assoc_recall_task import HEAD_DIM, N, NUM_KEYS, NUM_VALUES, benchmark

from fwrl.memory_modules import build_core


def _order_blind_ceiling_by_enumeration(n: int, num_keys: int, num_values: int) -> float:
    """The same bound by brute force over every value sequence of the query key's m bindings."""
    total = 0.0
    for m in range(1, n + 1):
        p_m = math.comb(n - 1, m - 1) * (1 / num_keys) ** (m - 1) * (1 - 1 / num_keys) ** (n - m)
        best = sum(max(Counter(values).values()) for values in itertools.product(range(num_values), repeat=m))
        total += p_m * best / (m * num_values ** m)
    return total


def test_order_blind_ceiling():
    order_blind_ceiling = benchmark().order_blind_ceiling
    for n, num_keys, num_values in [(3, 2, 2), (6, 3, 5), (N, NUM_KEYS, NUM_VALUES), (9, 2, 3)]:
        assert order_blind_ceiling(n, num_keys, num_values) == pytest.approx(
            _order_blind_ceiling_by_enumeration(n, num_keys, num_values), abs=1e-10)
    assert order_blind_ceiling(1, 4, 4) == 1.0  # one binding: always known
    # two pairs, two keys: the query key has 1 binding (p 1/2) or 2 (right if equal, else a coin flip)
    assert order_blind_ceiling(2, 2, 2) == pytest.approx(0.5 * 1 + 0.5 * (0.5 * 1 + 0.5 * 0.5))
    assert order_blind_ceiling(N, NUM_KEYS, NUM_VALUES) == pytest.approx(0.6299, abs=1e-4)


def _pairs_then_query(order: list[int], g: torch.Generator) -> torch.Tensor:
    """[N + 1, 1, D] core inputs: N random pair vectors in ``order``, then a query vector."""
    pairs = torch.randn(N, 12, generator=g)
    query = torch.randn(1, 12, generator=g)
    return torch.cat([pairs[order], query])[:, None]


@pytest.mark.parametrize("core,order_blind", [("linear_transformer", True), ("delta_net", False)])
def test_linear_transformer_state_ignores_pair_order(core, order_blind):
    """The query-step output of a one-layer sum-rule core is the same for every order of the
    pairs; the delta rule's is not (its writes depend on what is already stored)."""
    torch.manual_seed(0)
    model = build_core(core, 12, {"num_layers": 1, "hidden_size": 12, "num_heads": 1, "head_dim": HEAD_DIM,
                                  "ff_dim": 24}).double().eval()
    done = torch.zeros(N + 1, 1, dtype=torch.bool)
    done[0] = True
    g = torch.Generator().manual_seed(1)
    orders = [list(range(N)), list(reversed(range(N))), torch.randperm(N, generator=g).tolist()]
    answers = []
    for order in orders:
        x = _pairs_then_query(order, torch.Generator().manual_seed(2)).double()
        with torch.no_grad():
            out, _ = model(x, model.initial_state(1), done)
        answers.append(out[-1])
    same = all(torch.allclose(answers[0], a, atol=1e-10) for a in answers[1:])
    assert same == order_blind, [a[0, :4] for a in answers]
