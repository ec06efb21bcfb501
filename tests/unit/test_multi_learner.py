"""Several learners: rank bookkeeping from the launchers' variables and each rank's share of the
workers. The ranks themselves (gloo, two processes) are tests/e2e/test_learner_ranks.py's."""

import pytest

from fwrl.agents.distributed import Ranks, first_of_share, ranks_from_env, share


def test_ranks_from_launchers_and_shares():
    assert ranks_from_env({}) == Ranks(0, 1, 0)
    assert ranks_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "node1"}
    assert ranks_from_env(slurm) == Ranks(5, 8, 1)
    assert ranks_from_env({**slurm, "MASTER_ADDR": ""} | {"SLURM_NTASKS": "1"}) == Ranks()
    assert [share(10, Ranks(r, 4)) for r in range(4)] == [3, 3, 2, 2]
    assert sum(share(7, Ranks(r, 3)) for r in range(3)) == 7
    assert [first_of_share(10, Ranks(r, 4)) for r in range(4)] == [0, 3, 6, 8]  # each after the ranks before
    assert [first_of_share(7, Ranks(r, 3)) for r in range(3)] == [0, 3, 5]
    with pytest.raises(AssertionError):
        assert share(1, Ranks(1, 2)) >= 1  # too few workers for the ranks: the caller must refuse it
