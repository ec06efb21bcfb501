"""The settings of ``fwrl report``."""

from __future__ import annotations

from pydantic import Field

from fwrl.utils.settings import Settings


class ReportConfig(Settings):
    """What ``fwrl report`` computes and where it writes. One field per line."""

    out: str | None = Field(None, min_length=1, description="output folder; default: SWEEP/report/ for one sweep folder, ./report/ otherwise")
    html: bool = Field(False, description="also write report.html, one self-contained page (images inlined)")
    reps: int = Field(2000, ge=100, description="bootstrap resamples of every confidence interval (rliable suggests 2000 or more)")
    confidence: float = Field(0.95, gt=0, lt=1, description="coverage of the confidence intervals")
    seed: int = Field(0, ge=0, lt=2**32, description="seed of the bootstraps and of the random-policy episodes")
    finished_only: bool = Field(False, description="leave out the runs short of their total_steps (a sweep still running); default: report them, marked §")
    random_episodes: int = Field(100, ge=0, description="random-action episodes per game without published constants (MinAtar, memory, gym); 0: none")
