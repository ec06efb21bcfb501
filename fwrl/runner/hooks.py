"""A caller's say in one training session beyond its config: :class:`SessionHook`, passed to
:func:`fwrl.runner.train.train` as ``hook``.

The session's own stops (the step budget, the time limit, a stop signal, an error) stay the run's;
a hook adds a stop condition of its own, asked after every step of the calling acting thread, and
may make a session that acts without learning (``learns`` false: each batch goes back to the store
unread and counts as agent steps). The base class changes nothing. ``fwrl bench throughput``
subclasses it to end acting with its measured window (``fwrl.launch.bench.throughput``).
"""

from __future__ import annotations


class SessionHook:
    """Told when acting starts, asked after each acting step whether to stop acting; says whether the
    learner updates. A stop it asks for ends the session as a time limit does (a final checkpoint,
    ``stopped_by`` "time limit")."""

    learns: bool = True  # False: no updates (one learner rank: several all-reduce inside their updates)

    def acting_started(self, at: float) -> None:
        """The workers are started and acting begins, at ``at`` (``time.monotonic()``)."""

    def stop_acting(self, now: float, updated: bool) -> bool:
        """Whether acting stops at ``now`` (``time.monotonic()``); ``updated``: the session has made an update."""
        return False
