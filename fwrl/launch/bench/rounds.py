"""What the env and throughput benches share about their measured windows and rounds: the
checks of a window (seconds, warm-up) and of the rounds, and a mean over rounds and its figure as
their tables show it."""

from __future__ import annotations

from typing import Sequence

from fwrl.errors import FwrlError


def check_window(seconds: float, warmup: float) -> None:
    if not seconds > 0 or not warmup >= 0:
        raise FwrlError(f"bench envs needs --seconds > 0 and a warm-up >= 0, got {seconds:g} and {warmup:g}.")


def check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise FwrlError(f"--rounds must be >= 1, got {rounds}.")


def mean_over_rounds(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def figure(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"
