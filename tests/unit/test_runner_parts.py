"""The runner's parts one at a time, each built from stand-ins for its collaborators (no env
worker, no subprocess, no run): the budget's arithmetic."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fwrl.runner.budget import Budget

pytestmark = pytest.mark.timeout(10)


# ----------------------------------------------------------------------------- the budget

def test_one_update_counts_every_ranks_columns():
    assert Budget(1000, batch_size=4, unroll_length=5).steps_per_update == 20
    assert Budget(1000, batch_size=4, unroll_length=5, ranks=3).steps_per_update == 60
    config = SimpleNamespace(total_steps=2000, batch_size=8, unroll_length=10)
    assert Budget.of(config, ranks=2) == Budget(2000, 8, 10, 2)


@pytest.mark.parametrize("total, ranks, learnt, updates, columns", [
    (100, 1, 0, 5, 20),     # 5 updates of 4 x 5 steps; 4 columns each
    (101, 1, 0, 6, 24),     # a part of an update is a whole one: the learner takes whole batches
    (100, 2, 0, 3, 12),     # two ranks: 40 steps an update, each rank's acting hands over its own 4 columns
    (100, 1, 60, 2, 8),     # a resumed run: what its checkpoint learnt is not acted again
    (100, 2, 80, 1, 4),     # resumed on two ranks
    (100, 1, 100, 0, 0),    # the budget is met
    (100, 1, 120, 0, 0),    # past it (the last batch of an earlier session)
])
def test_updates_and_columns_left(total, ranks, learnt, updates, columns):
    budget = Budget(total, batch_size=4, unroll_length=5, ranks=ranks)
    assert budget.updates_left(learnt) == updates
    assert budget.columns_needed(learnt) == columns
    assert budget.reached(learnt) == (updates == 0)
