"""Shared test settings.

Tiny per-step loops are ~100x slower with two torch threads on a busy 2-core
machine (thread hand-offs dominate), so tests run torch single-threaded.
"""

import importlib.util
import os
import sys

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")


@pytest.fixture
def fwrl_cli():
    """Command prefix that runs the fwrl CLI of this checkout in a subprocess."""
    return [sys.executable, "-m", "fwrl.launch.cli"]


@pytest.fixture(scope="session")
def ray_cluster():
    """A two-node Ray cluster on this machine, this process connected (``ray_cluster.py``);
    started on first use, skipped where Ray is not installed."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'fwrl[ray]')")
    from ray_cluster import cluster_session

    yield from cluster_session()


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
