"""PNG figures of a report (matplotlib, Agg): learning curves per game with seed bands, aggregate
intervals and performance profiles (rliable's ``plot_utils``).

Learning curves: each group's seeds are interpolated onto common agent steps
(up to the shortest seed's last step); the line is their mean, the band spans
the lowest to the highest seed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

CURVE_POINTS = 200


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seed_band(curves: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray, np.ndarray]:
    """Common steps, and the mean, lowest and highest of the seeds' curves there."""
    end = min(max(xs) for xs, _ in curves)
    start = max(min(xs) for xs, _ in curves)
    steps = np.linspace(start, end, CURVE_POINTS) if end > start else np.array([end])
    values = np.array([np.interp(steps, np.asarray(xs, float), np.asarray(ys, float)) for xs, ys in curves])
    return steps, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def learning_curves(curves: Mapping[str, Mapping[str, list[tuple[list[float], list[float]]]]], out: Path,
                    colors: Mapping[str, object]) -> Path:
    """One panel per game (``curves[game][group]`` = each seed's steps and returns); written to ``out``."""
    plt = _pyplot()
    games = list(curves)
    cols = min(3, len(games))
    rows = math.ceil(len(games) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, game in zip(axes.flat, games):
        for group, seeds in curves[game].items():
            seeds = [s for s in seeds if s[0]]
            if not seeds:
                continue
            steps, mean, low, high = seed_band(seeds)
            ax.plot(steps, mean, color=colors[group], label=f"{group} ({len(seeds)} seeds)")
            if len(seeds) > 1:
                ax.fill_between(steps, low, high, color=colors[group], alpha=0.2, linewidth=0)
        ax.set_title(game, fontsize="medium")
        ax.set_xlabel("agent steps")
        ax.set_ylabel("training return")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(games):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def interval_plot(results: Mapping[str, Mapping[str, tuple[float, float, float]]], metrics: Sequence[str],
                  out: Path, colors: Mapping[str, object], xlabel: str) -> Path:
    """rliable's interval estimates plot: one panel per aggregate metric, one bar (CI) per group."""
    from fwrl.launch.report.stats import import_rliable

    plt = _pyplot()
    _, _, plot_utils = import_rliable()
    groups = list(results)
    points = {g: np.array([results[g][m][0] for m in metrics]) for g in groups}
    intervals = {g: np.array([[results[g][m][1] for m in metrics], [results[g][m][2] for m in metrics]])
                 for g in groups}
    row_height = 0.6
    fig, _ = plot_utils.plot_interval_estimates(points, intervals, metric_names=list(metrics), algorithms=groups,
                                                colors=dict(colors), xlabel=xlabel, subfigure_width=3.6,
                                                row_height=row_height,
                                                xlabel_y_coordinate=-0.55 / (row_height * len(groups)))
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def profile_plot(profiles: Mapping[str, np.ndarray], cis: Mapping[str, np.ndarray], taus: np.ndarray, out: Path,
                 colors: Mapping[str, object], xlabel: str) -> Path:
    """rliable's performance profiles: fraction of runs with a normalised score above tau, with CIs."""
    from fwrl.launch.report.stats import import_rliable

    plt = _pyplot()
    _, _, plot_utils = import_rliable()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    plot_utils.plot_performance_profiles(dict(profiles), taus, performance_profile_cis=dict(cis),
                                         colors=dict(colors), xlabel=xlabel, ax=ax, labelsize="medium",
                                         ticklabelsize="medium")
    ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def group_colors(groups: Sequence[str]) -> dict[str, object]:
    """One colour per group (seaborn's colourblind palette, as rliable's plots use)."""
    import seaborn as sns

    return dict(zip(groups, sns.color_palette("colorblind", n_colors=max(1, len(groups)))))
