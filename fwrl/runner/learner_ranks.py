"""``fwrl train --learners N``: N learner ranks on this machine, started by torch's elastic launcher.

This is what ``torchrun --standalone --nproc-per-node N -m fwrl train ...``
does (the same engine, ``torch.distributed.launcher``): a local rendezvous on
a free port, N processes of the same command with ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK`` set, no restarts. Each rank then trains with its own share of
the env workers (``fwrl.runner.train``, ``fwrl.agents.distributed``).

When a rank fails, the launcher stops the others (SIGTERM: they write rank
0's checkpoint and exit); the exit status is rank 0's, or the failed rank's
when rank 0 ended cleanly. A stop signal to the launcher (Ctrl-C, SIGTERM,
SIGHUP) reaches every rank; the status is then 128 + the signal, as for one
learner.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import uuid
from typing import Iterator, Sequence

from fwrl.errors import FwrlError


def launch_ranks(count: int, entrypoint, *args) -> None:
    """Run ``entrypoint(*args)`` as ``count`` local learner ranks with torch's elastic launcher (a
    local rendezvous on a free port, no restarts): ``entrypoint`` is an executable (its arguments
    follow) or a picklable function. A failed rank raises the launcher's ``ChildFailedError``, a
    signal to this process its ``SignalException``; this process's signal handlers are the same
    after it as before."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if count < 2:
        raise FwrlError(f"learner ranks are launched for 2 or more learners, got {count}.")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=count, run_id=f"fwrl-{uuid.uuid4().hex[:8]}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5)
    with _kept_signal_handlers():
        elastic_launch(config, entrypoint)(*args)


@contextlib.contextmanager
def _kept_signal_handlers() -> Iterator[None]:
    """The elastic launcher installs its own handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT
    (they stop the ranks) and leaves them behind; this puts back the ones before it on the way out,
    so a process that goes on (a test run, a caller of the bench) keeps its own."""
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    before = {sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in names if hasattr(signal, n))} \
        if main else {}
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: a handler not set from Python, which cannot be put back
                signal.signal(sig, handler)


def launch_learners(count: int, argv: Sequence[str]) -> int:
    """Run ``python -m fwrl.launch.cli <argv>`` as ``count`` learner ranks (:mod:`fwrl.utils.run_module`);
    returns the exit status."""
    from fwrl.utils.run_module import module_command
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_ranks(count, *module_command("fwrl.launch.cli", *argv))  # not -m: a ./fwrl clone is no package
    except ChildFailedError as exc:
        for rank, failure in sorted(exc.failures.items()):
            print(f"fwrl train: learner rank {rank} of {count} {describe_exit(int(failure.exitcode))}",
                  file=sys.stderr)
        return exit_status(exc.failures)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    return 0


def describe_exit(code: int) -> str:
    """``killed by SIGKILL`` / ``stopped by SIGTERM (exit 143)`` / ``exited with status 2``."""
    import signal

    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        return f"stopped on {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with status {code}"


def exit_status(failures: dict) -> int:
    """Rank 0's exit code if it failed, else the first failed rank's (a signal death -N counts as 128 + N)."""
    rank = 0 if 0 in failures else min(failures)
    code = int(failures[rank].exitcode)
    return 128 - code if code < 0 else code
