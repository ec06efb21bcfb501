"""How the command's process ends: ``end_process`` leaves it to the interpreter (exit handlers run)
unless a Ray pool of the process lost its cluster's head, where Ray's exit handler would wait on the
lost head (tests/ray/test_ray_backend.py's head-loss test runs the whole path on a cluster)."""

import subprocess
import sys

import pytest

PROGRAM = """
import atexit, sys
import fwrl.envs.ray_workers as ray_workers
from fwrl.launch.exits import end_process
atexit.register(lambda: print("exit handler ran", flush=True))
print("before")  # a pipe: block-buffered, written only by a flush
ray_workers._head_lost_here = {lost}
sys.exit(end_process(69))
"""


@pytest.mark.parametrize("lost", [False, True])
def test_a_process_that_lost_its_ray_head_ends_without_exit_handlers(lost):
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(lost=lost)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 69, done.stderr[-2000:]
    assert done.stdout.startswith("before")  # output written before the end is flushed, not lost
    assert ("exit handler ran" in done.stdout) is not lost
