"""Progress of ``fwrl evaluate``: episodes played, the running mean return, elapsed time and an ETA.

On a terminal one status line is kept current; otherwise (a log file, a pipe) a
plain line is printed every ``interval`` seconds and when a split or repeat is
done, as ``fwrl train`` prints its progress. The ETA is the time so far per
episode played times the episodes left (so it includes the workers' start-up).
"""

from __future__ import annotations

import math
import time

from rich.console import Console


def duration(seconds: float) -> str:
    """``0:07`` / ``3:07`` / ``1:02:03``; ``-`` where unknown."""
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "-"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class EvalProgress:
    """A callable for :func:`fwrl.evaluation.evaluate.evaluate`'s ``progress``; a context manager."""

    def __init__(self, env: str, console: Console | None = None, interval: float = 5.0):
        self.env = env
        self.console = console or Console(stderr=True)
        self.interval = interval
        self.started = time.monotonic()
        self.status = None
        self.last_print = -math.inf
        self.last_what = ""
        self.last_text = ""

    def text(self, what: str, done: int, total: int, mean: float, now: float | None = None) -> str:
        """``evaluating ENV (test, repeat 2 of 5): 37 / 750 episodes, mean return 0.52, elapsed 0:12, ETA 3:48``."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        eta = elapsed / done * (total - done) if done else math.nan
        mean_text = f"{mean:.3g}" if done and not math.isnan(mean) else "-"
        return (f"evaluating {self.env} ({what}): {done:,} / {total:,} episodes, mean return {mean_text}, "
                f"elapsed {duration(elapsed)}, ETA {duration(eta)}")

    def __call__(self, what: str, done: int, total: int, mean: float) -> None:
        text = self.text(what, done, total, mean)
        if self.status is not None:
            self.status.update(text)
        elif time.monotonic() - self.last_print >= self.interval or (what != self.last_what and self.last_what):
            self._print(self.last_text if what != self.last_what and self.last_what else text)
        self.last_what, self.last_text = what, text

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)
        self.last_print = time.monotonic()

    def __enter__(self) -> "EvalProgress":
        self.started = time.monotonic()
        if self.console.is_terminal:
            self.status = self.console.status(f"evaluating {self.env}: starting workers ...")
            self.status.start()
        else:
            self._print(f"evaluating {self.env}: starting workers ...")
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        if self.last_text:
            self._print(self.last_text)  # where it ended
