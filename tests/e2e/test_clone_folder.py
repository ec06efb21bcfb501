"""Runs started from the folder that holds a clone of fwrl (``./fwrl``, README's editable install).

There, ``python -m fwrl.launch.cli`` imports ``./fwrl`` (the clone's top folder, no ``__init__.py``) as a
namespace package ahead of the installed fwrl, since an editable install's finder comes after the path's,
and fails (``cannot import name '__version__' from 'fwrl'``): fwrl's child processes (a sweep's cell
runners and their commands, ``fwrl train --learners N``'s ranks) must import the fwrl that started them.
And README's ``--env-wrapper mypkg.wrappers:X`` names a package in that folder, which the ``fwrl``
script (no current folder on its path) must find too.

The processes here see fwrl through a finder like setuptools' editable one (``sitecustomize`` on
``PYTHONPATH``, inserted right after the path's finder, mapping ``fwrl`` to the fwrl under test), whatever the
test run's own ``PYTHONPATH`` or install is; the clone is a real ``git clone`` of this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fwrl

REPO = Path(__file__).resolve().parents[2]
FWRL_ROOT = Path(fwrl.__file__).resolve().parents[1]  # the folder holding the fwrl under test
EDITABLE_FINDER = '''
import importlib.util
import sys
from importlib.machinery import PathFinder

ROOT = {root!r}


class _EditableFinder:  # as setuptools' editable install's: after the path's finder
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname == "fwrl":
            return importlib.util.spec_from_file_location("fwrl", ROOT + "/fwrl/__init__.py",
                                                          submodule_search_locations=[ROOT + "/fwrl"])
        parent, _, child = fullname.rpartition(".")
        if parent == "fwrl":
            return PathFinder.find_spec(fullname, path=[ROOT + "/fwrl"])
        return None


sys.meta_path.insert(sys.meta_path.index(PathFinder) + 1, _EditableFinder)
'''
WRAPPER = '''
import gymnasium


class Marked(gymnasium.Wrapper):
    """Changes nothing; says it was imported from the folder the run started in."""
'''
TINY = ["--core-opt", "hidden_size=8", "--num-workers", "1", "--envs-per-worker", "1", "--batch-size", "2",
        "--unroll-length", "5", "--total-steps", "20", "--log-interval", "0.5"]


@pytest.fixture
def clone_folder(tmp_path):
    """(a folder holding a clone of fwrl as ./fwrl and a package ./mypkg, the environment of its commands)."""
    work = tmp_path / "work"
    work.mkdir()
    if shutil.which("git") and (REPO / ".git").exists():
        subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(work / "fwrl")], check=True,
                       capture_output=True)
    else:  # a checkout without git: a copy of the clone's top folder does the same
        shutil.copytree(REPO / "fwrl", work / "fwrl" / "fwrl")
    assert not (work / "fwrl" / "__init__.py").exists()
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "wrappers.py").write_text(WRAPPER)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER.format(root=str(FWRL_ROOT)))
    env = {**os.environ, "PYTHONPATH": str(site)}
    return work, env


def fwrl_script() -> list[str]:
    """The ``fwrl`` console script (its folder, not the current one, first on its path)."""
    script = Path(sys.executable).with_name("fwrl")
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-c", "import sys; del sys.path[0]; from fwrl.launch.entry import main; sys.exit(main())"]


def test_the_setup_imports_the_clone_folder_as_a_namespace_package_with_python_m(clone_folder):
    """What goes wrong with ``python -m`` there (the reason the children do not use it)."""
    work, env = clone_folder
    done = subprocess.run([sys.executable, "-c", "import fwrl; print(fwrl.__file__)"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done  # a namespace package: the clone's folder


def test_a_sweep_with_a_wrapper_of_the_current_folder_runs_from_the_folder_that_holds_the_clone(clone_folder):
    work, env = clone_folder
    done = subprocess.run([*fwrl_script(), "sweep", "sw", "--env", "memory:cue_delay?delay=2", "--core", "lstm",
                           "--env-wrapper", "mypkg.wrappers:Marked", *TINY, "--parallel", "1"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    log = "\n".join(p.read_text() for p in (work / "sw" / "logs").glob("*.log")) if (work / "sw").exists() else ""
    assert done.returncode == 0, (done.stderr[-2000:], log[-3000:])
    assert "cannot import name" not in log and len(list((work / "sw" / "runs").glob("*/checkpoint.pt"))) == 1, log


def test_the_fwrl_script_finds_a_wrapper_in_the_current_folder_after_the_installed_modules(clone_folder):
    """README's ``--env-wrapper mypkg.wrappers:X`` without ``PYTHONPATH=.``: the wrapper is found (the run is
    then refused for its memory, the check after the wrappers', before anything is written)."""
    work, env = clone_folder
    done = subprocess.run([*fwrl_script(), "train", "--env", "memory:cue_delay", "--core", "lstm", "--env-wrapper",
                           "mypkg.wrappers:Marked", "--num-workers", "1", "--batch-size", "1e9"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs at least" in done.stderr, done.stderr[-2000:]
    assert not (work / "runs").exists()


def test_learner_ranks_start_from_the_folder_that_holds_the_clone(clone_folder, monkeypatch, tmp_path):
    """``fwrl train --learners N`` starts its ranks with the command :func:`launch_learners` gives the
    launcher; that command, started from the clone's folder, runs this fwrl (here on a command that
    imports the checkpoints' module, as a rank's training does: ``from fwrl import __version__``)."""
    import sys as _sys

    sys_path = list(_sys.path)
    from cli_runs import write_memory_checkpoint
    from fwrl.runner import learner_ranks

    checkpoint = write_memory_checkpoint(tmp_path / "agent")
    argv = ["evaluate", str(checkpoint), "--episodes", "1", "--num-workers", "1", "--out", str(tmp_path / "e.json")]
    seen = []
    monkeypatch.setattr(learner_ranks, "launch_ranks", lambda count, *cmd: seen.append(cmd))
    assert learner_ranks.launch_learners(2, argv) == 0 and _sys.path == sys_path
    work, env = clone_folder
    done = subprocess.run(list(seen[0]), cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and (tmp_path / "e.json").is_file(), done.stderr[-2000:]
