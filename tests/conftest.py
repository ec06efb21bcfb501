"""Shared test settings, and the tiers.

Tiny per-step loops are ~100x slower with two torch threads on a busy 2-core
machine (thread hand-offs dominate), so tests run torch single-threaded.

Tiers: each test is marked by the folder it lives in (:data:`TIERS`), never by
hand. ``python -m pytest`` (README's test command, what CI runs) runs every tier
but ``learning``; ``python -m pytest -m slow`` (or naming ``tests/learning``)
runs the learning claims. A test that uses the two-node Ray cluster (the
``ray_cluster`` fixture, or the ``ray`` value of the ``backend`` fixture) is
marked ``ray`` as well, wherever it lives; those and the tests that start a Ray
of their own run in one xdist group, so that one worker starts the cluster once
and no two Rays compete for this machine. Each tier has its own time
limit per test (pytest-timeout): a hung test fails alone.

Lanes by cost: ``python -m pytest -m quick`` runs every test measured under 5 s (README's quick lane),
all tiers but ``learning``: every test is marked ``quick`` but the learning tier, the tests that use
the Ray cluster (starting it costs more than 5 s, whichever test pays it) and those
:data:`LONG_TESTS` lists (measured at 5 s or more).
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
# folder -> (what its tests prove, seconds one test may take)
TIERS = {
    "unit": ("one module or part, in this process", 120),
    "interpreter": ("the fused Triton kernels in Triton's CPU interpreter, and their sm_90 builds", 600),
    "e2e": ("whole commands and runs: subprocesses, worker processes, signals, files on disk", 900),
    "ray": ("the ray worker backend on a two-node Ray cluster on this machine", 900),
    "learning": ("learning claims: agents reach a score (slow; python -m pytest -m slow)", 3600),
}
SLOW_TIER = "learning"
# Tests measured at 5 s or more (setup, call and teardown), one node id a line, or a test function
# without parameters for all of them: left out of the quick lane (``-m quick``).
LONG_TESTS = TESTS / "long_tests.txt"
# the shared kernel tests (imported by each rule's tests/interpreter/test_kernels_<rule>.py): pytest's
# assertion messages there too
pytest.register_assert_rewrite("kernel_rule_tests")


def tier_of(path: Path) -> str:
    """The tier of a test file: the folder under ``tests/`` that holds it."""
    folder = Path(path).resolve().relative_to(TESTS).parts[0]
    if folder not in TIERS:
        raise pytest.UsageError(f"test file {path} is outside the tier folders {', '.join(TIERS)} of tests/")
    return folder


def _uses_ray_cluster(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "ray_cluster" in item.fixturenames or params.get("backend") == "ray"


def _starts_ray(item: pytest.Item) -> bool:
    """Uses the cluster, or starts a Ray of its own (``ray`` is a word of its name)."""
    return "ray" in item.keywords or "ray" in item.originalname.split("_")


def long_tests() -> frozenset[str]:
    """The entries of :data:`LONG_TESTS` (node ids, or test functions without parameters)."""
    lines = (line.strip() for line in LONG_TESTS.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def _is_quick(item: pytest.Item, tier: str, long: frozenset[str]) -> bool:
    """In the quick lane: not the learning tier, no Ray cluster, not listed as long."""
    return (tier != SLOW_TIER and "ray" not in item.keywords and item.nodeid not in long
            and item.nodeid.split("[")[0] not in long)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long = long_tests()
    for item in items:
        tier = tier_of(item.path)
        item.add_marker(tier)
        if tier == SLOW_TIER:
            item.add_marker("slow")
        if _uses_ray_cluster(item):
            item.add_marker("ray")
        if _is_quick(item, tier, long):  # before the ray group's suffix joins the node id
            item.add_marker("quick")
        if _starts_ray(item):  # one Ray at a time on this machine, the cluster started once
            item.add_marker(pytest.mark.xdist_group("ray"))
            if getattr(config.option, "loadgroup", False):
                _group_in_node_id(item, "ray")
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIERS[tier][1]))
    if config.option.markexpr or _names_the_slow_tier(config):
        return
    deselected = [item for item in items if "slow" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "slow" not in item.keywords]


def _group_in_node_id(item: pytest.Item, group: str) -> None:
    """pytest-xdist (3.8, ``--dist loadgroup``) sends the tests of one group to one worker by an
    ``@group`` suffix of their node ids, which it writes to ``item._nodeid``; pytest 9.2 keeps the
    id in ``item._id``, so that write is lost and the group's tests were spread over the workers
    (each started its own Ray cluster). Where pytest keeps ``_id``, write the suffix there."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # a pytest that reads item._nodeid: pytest-xdist's own write works
        return
    if isinstance(getattr(item, "_id", None), NodeId) and not item.nodeid.endswith(f"@{group}"):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _names_the_slow_tier(config: pytest.Config) -> bool:
    """The command line names the learning folder or a file in it (then its tests run without -m)."""
    slow = TESTS / SLOW_TIER
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == slow or slow in path.parents:
            return True
    return False

torch.set_num_threads(1)
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")


@pytest.fixture
def fwrl_cli():
    """Command prefix that runs the fwrl CLI of this checkout in a subprocess."""
    return [sys.executable, "-m", "fwrl.launch.cli"]


@pytest.fixture(scope="session")
def ray_session():
    """The session's two-node Ray cluster (``ray_cluster.SessionCluster``), started on first use,
    skipped where Ray is not installed; tests take it through ``ray_cluster``."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'fwrl[ray]')")
    from ray_cluster import cluster_session

    yield from cluster_session()


@pytest.fixture
def ray_cluster(ray_session):
    """A two-node Ray cluster on this machine, this process connected (``ray_cluster.py``): the
    session's, started again first if an earlier test took its head down."""
    ray_session.ensure_up()
    return ray_session


@pytest.fixture(params=["local", "ray"])
def backend(request):
    """Each env-worker backend in turn (``worker_backends.Backend``); the ray one runs on the
    session's Ray cluster and is skipped where Ray is not installed."""
    from worker_backends import Backend

    if request.param == "ray":
        return Backend("ray", request.getfixturevalue("ray_cluster").address)
    return Backend("local")


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: new files in ``folder`` fail with EACCES, as on a read-only mount
    (chmod does not stop root, who runs the tests in containers)."""
    import tempfile

    real = tempfile.mkstemp

    def make(folder) -> None:
        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and os.path.samefile(dir, folder):
                raise PermissionError(13, "Permission denied")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)

    return make
