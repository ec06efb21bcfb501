"""Statistics of a report: per-game means with bootstrap CIs over seeds, and aggregates over games
(IQM, median, mean) with stratified bootstrap CIs and performance profiles, computed with rliable
(Agarwal et al. 2021, "Deep RL at the edge of the statistical precipice").

Per game: the mean over seeds and a percentile bootstrap CI of that mean
(``scipy.stats.bootstrap``, resampling seeds). Aggregates: the normalised
scores of a group as a (runs x games) matrix, ``rly.get_interval_estimates``
with ``metrics.aggregate_iqm`` / ``aggregate_median`` / ``aggregate_mean``
(percentile CIs of a bootstrap that resamples runs within each game); the
performance profile is the fraction of runs above each threshold tau
(``rly.score_distributions``) with the same bootstrap. rliable draws from
NumPy's global generator, so each call seeds it (and restores it after): the
same ``seed`` gives the same intervals.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from fwrl.errors import FwrlError, install_command, missing_dependency

METRICS = ("IQM", "median", "mean")


def import_rliable():
    """``(library, metrics, plot_utils)`` of rliable, or an error that says what to install."""
    if importlib.util.find_spec("rliable") is None:
        raise missing_dependency("rliable", "report", "fwrl report")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from rliable import library, metrics, plot_utils
    except Exception as exc:  # noqa: BLE001 - a broken install of one of its dependencies
        raise FwrlError(f"rliable is installed but cannot be imported ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}). Its dependency arch (< 8, pinned by "
                        f"rliable 1.2) does not import under pandas 3: {install_command('report')}, which pins "
                        "pandas < 3.") from None
    return library, metrics, plot_utils


@contextlib.contextmanager
def seeded_numpy(seed: int) -> Iterator[None]:
    """NumPy's global generator seeded with ``seed`` inside, as it was outside."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def mean_ci(values: Sequence[float], reps: int, confidence: float, seed: int) -> tuple[float, float, float]:
    """Mean of ``values`` and the percentile bootstrap CI of the mean (nan, nan with fewer than 2 values)."""
    from scipy import stats

    data = np.asarray(values, dtype=np.float64)
    mean = float(data.mean())
    if len(data) < 2:
        return mean, math.nan, math.nan
    if np.all(data == data[0]):
        return mean, mean, mean
    result = stats.bootstrap((data,), np.mean, n_resamples=reps, confidence_level=confidence,
                             method="percentile", rng=np.random.default_rng(seed))
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)


def _aggregate_func(rly_metrics) -> Callable[[np.ndarray], np.ndarray]:
    def func(scores: np.ndarray) -> np.ndarray:
        return np.array([rly_metrics.aggregate_iqm(scores), rly_metrics.aggregate_median(scores),
                         rly_metrics.aggregate_mean(scores)])

    return func


def aggregates(matrices: Mapping[str, np.ndarray], reps: int, confidence: float,
               seed: int) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per group: IQM, median and mean of its (runs x games) normalised scores, each (point, low, high)."""
    library, rly_metrics, _ = import_rliable()
    with seeded_numpy(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points, intervals = library.get_interval_estimates(dict(matrices), _aggregate_func(rly_metrics), reps=reps,
                                                           confidence_interval_size=confidence)
    return {group: {metric: (float(points[group][i]), float(intervals[group][0][i]), float(intervals[group][1][i]))
                    for i, metric in enumerate(METRICS)} for group in matrices}


def taus_for(matrices: Mapping[str, np.ndarray], count: int = 81) -> np.ndarray:
    """Thresholds of the performance profile: from just under the lowest score (at most 0), where every run
    is above, to the highest (at least 1)."""
    values = np.concatenate([m.ravel() for m in matrices.values()])
    low, high = min(0.0, float(values.min())), max(1.0, float(values.max()))
    return np.linspace(low - 0.02 * (high - low), high, count)


def profiles(matrices: Mapping[str, np.ndarray], taus: np.ndarray, reps: int, confidence: float,
             seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per group: the fraction of runs (all games) with a normalised score above each tau, and its CIs."""
    library, _, _ = import_rliable()

    def profile(scores: np.ndarray) -> np.ndarray:
        # rliable's score_distributions, the same fractions in one comparison: its np.vectorize makes a
        # Python call per tau, per bootstrap resample (two thirds of a report's time at 5,000 resamples)
        return (np.asarray(scores).reshape(-1, 1) > taus).mean(axis=0)

    with seeded_numpy(seed + 1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        points, intervals = library.get_interval_estimates(dict(matrices), profile, reps=reps,
                                                           confidence_interval_size=confidence)
    return points, intervals


def score_matrices(cells: Mapping[str, Mapping[str, Mapping[int, float]]], games: Sequence[str]
                   ) -> tuple[dict[str, np.ndarray], list[str], dict[str, list[int]]]:
    """(runs x games) matrices of ``cells[group][game][seed]``: the games every group has, and per group the
    seeds it has in all of them; returns the matrices, the games used and each group's seeds."""
    used = [g for g in games if all(g in per and per[g] for per in cells.values())]
    matrices, seeds = {}, {}
    for group, per in cells.items():
        common = sorted(set.intersection(*(set(per[g]) for g in used))) if used else []
        if not common:
            continue
        seeds[group] = common
        matrices[group] = np.array([[per[g][s] for g in used] for s in common], dtype=np.float64)
    return matrices, used, seeds


def describe_interval(point: float, low: float, high: float, digits: int = 3) -> str:
    """``0.512 [0.402, 0.631]`` (the point alone where the interval is undefined)."""
    if math.isnan(low) or math.isnan(high):
        return f"{point:.{digits}g}"
    return f"{point:.{digits}g} [{low:.{digits}g}, {high:.{digits}g}]"


def as_json(value: Any) -> Any:
    """NaN as None, NumPy numbers as Python numbers (the report's JSON)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, np.ndarray):
        return as_json(value.tolist())
    if isinstance(value, (np.floating, float)):
        return None if not math.isfinite(float(value)) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value
