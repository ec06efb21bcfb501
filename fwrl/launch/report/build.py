"""``fwrl report``: collect runs, compute the statistics, write ``report.md``, ``report.json``, PNG figures
(and ``report.html``) into the output folder.

Sections: per-game scores (mean and bootstrap CI over seeds, with the random
policy's or the published random score), normalised scores, aggregates (IQM,
median, mean with stratified bootstrap CIs, and performance profiles), learning
curves, and the papers' published figures beside fwrl's where
:data:`fwrl.evaluation.scores.PUBLISHED` has them. Everything is checked (runs found,
output writable, rliable importable) before the first number is computed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fwrl.envs.spec import parse_env_spec
from fwrl.evaluation import scores
from fwrl.evaluation.scores import MMER_WINDOW
from fwrl.launch.report import document as doc
from fwrl.errors import FwrlError
from fwrl.launch.report.baselines import KIND_TEXT, GameRef, RandomPolicyCache, game_refs
from fwrl.launch.report.collect import (NOT_GROUPING, STALE_MARK, UNFINISHED_MARK, Group, Run, find_runs, group_runs,
                                        load_run, stale_note, unfinished_note)
from fwrl.launch.report.options import ReportConfig
from fwrl.launch.report.stats import (METRICS, aggregates, as_json, describe_interval, import_rliable, mean_ci,
                                      profiles, score_matrices, taus_for)
from fwrl.launch.flags import given_settings
from fwrl.launch.sweep.plan import is_sweep
from fwrl.utils.files import atomic_write, atomic_write_text, check_writable

TRAINING_MARK = "†"
SOURCE_TEXT = {"mmer": "MMER (POPGym's metric, over training)"}
OUTPUTS = ("report.md", "report.json", "random_policy.json", "curves.png", "aggregates.png", "profiles.png")


@dataclass
class GameGroup:
    """One group's runs in one game: per-seed scores and their statistics."""

    scores: dict[int, float] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    episode_returns: tuple[float, ...] = ()  # the one seed's evaluation episodes (a CI when there is one seed)
    ci_over_episodes: bool = False
    mean: float = math.nan
    low: float = math.nan
    high: float = math.nan
    normalised: float | None = None
    published: list[scores.Published] = field(default_factory=list)


@dataclass
class Report:
    """Everything a report shows (:func:`build_report`)."""

    runs: list[Run]
    groups: list[Group]
    games: list[str]
    cells: dict[str, dict[str, GameGroup]]  # game -> group label -> its runs there
    refs: dict[str, GameRef]
    aggregate_games: list[str]
    aggregate_seeds: dict[str, list[int]]
    aggregate_results: dict[str, dict[str, tuple[float, float, float]]]
    profile_taus: np.ndarray | None
    profile_points: dict[str, np.ndarray]
    profile_cis: dict[str, np.ndarray]
    notes: list[str]
    options: ReportConfig


def default_out(paths: Sequence[Path]) -> Path:
    """``SWEEP/report`` for one sweep folder, else ``./report``."""
    if len(paths) == 1 and is_sweep(paths[0]):
        return Path(paths[0]) / "report"
    return Path("report")


def run_report(args: argparse.Namespace) -> int:
    opts = ReportConfig.parse(given_settings(args, ReportConfig))
    paths = [Path(p) for p in args.paths]
    found = find_runs(paths)  # folders without runs are said at once, before rliable's slow import
    import_rliable()  # say which extra to install before any work
    out = Path(opts.out) if opts.out else default_out(paths)
    for name in OUTPUTS + (("report.html",) if opts.html else ()):
        check_writable(out / name, "report file", "Pass --out FOLDER to write it elsewhere.")
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    say(f"fwrl report: {len(found)} runs from {', '.join(map(str, paths))}")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = build_report(found, out, opts, say)
        files = write_report(report, out)
    except BaseException:  # nothing to report, a full disk, Ctrl-C: no empty or half-made report folder
        if created:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        raise
    print(doc.to_markdown(per_game_blocks(report)), end="")
    say("wrote " + ", ".join(str(f) for f in files))
    return 0


# ----------------------------------------------------------------------------- computing

def build_report(found: Sequence[tuple[Path, dict[str, str] | None]], out: Path, opts: ReportConfig,
                 say: Callable[[str], None] = lambda text: None) -> Report:
    """Load the runs, group them, and compute every statistic of the report."""
    runs = [load_run(path, labels) for path, labels in found]
    short = unfinished_note(runs, opts.finished_only)
    if short:
        say(f"fwrl report: {short}")
    if opts.finished_only:
        if runs and all(run.unfinished for run in runs):
            raise FwrlError(f"none of the {len(runs)} run(s) has reached its step budget (--finished-only); "
                            f"report them without it, marked {UNFINISHED_MARK}, or once they finish.")
        runs = [run for run in runs if not run.unfinished]
    notes = [short] if short else []
    notes += [f"{run.path}: no evaluation.json and no training episodes in metrics.csv; left out."
             for run in runs if not run.scores]
    for note in filter(None, map(stale_note, runs)):
        say(f"fwrl report: {note}")
        notes.append(note)
    unevaluated = training_note(runs)
    if unevaluated:
        say(f"fwrl report: {unevaluated}")
        notes.append(unevaluated)
    notes += [f"{run.path}: {game}: {score.note}." for run in runs for game, score in run.scores.items() if score.note]
    if not any(run.scores for run in runs):  # nothing to report: say so, write nothing
        raise FwrlError(f"none of the {len(runs)} run(s) has a score yet (no evaluation.json and no training "
                        f"episodes in metrics.csv: {', '.join(str(r.path) for r in runs[:3])}"
                        f"{', ...' if len(runs) > 3 else ''}); train them first, then report.")
    runs = [run for run in runs if run.scores]
    groups = group_runs(runs)
    label_of = {id(run): g.label for g in groups for run in g.runs}
    games = list(dict.fromkeys(game for run in runs for game in run.scores))
    cells: dict[str, dict[str, GameGroup]] = {game: {} for game in games}
    for run in runs:
        for game, score in run.scores.items():
            cell = cells[game].setdefault(label_of[id(run)], GameGroup())
            if run.seed in cell.scores:
                notes.append(f"{run.path}: a second run of group {label_of[id(run)]!r} with seed {run.seed} in "
                             f"{game}; only the first counts.")
                continue
            cell.scores[run.seed] = score.value
            cell.sources.add("stale evaluation" if score.stale else score.source)
            if run.unfinished:
                cell.sources.add("unfinished")
            cell.episode_returns = score.returns
    for g_index, (game, per) in enumerate(cells.items()):
        for i, (label, cell) in enumerate(per.items()):
            cell.mean, cell.low, cell.high = mean_ci(list(cell.scores.values()), opts.reps, opts.confidence,
                                                     opts.seed + 1000 * g_index + i)
            if len(cell.scores) == 1 and len(cell.episode_returns) > 1:  # one seed: a CI over its episodes
                _, cell.low, cell.high = mean_ci(list(cell.episode_returns), opts.reps, opts.confidence,
                                                 opts.seed + 1000 * g_index + i)
                cell.ci_over_episodes = True
    best = {game: max(c.mean for c in per.values()) for game, per in cells.items()}
    cache = RandomPolicyCache(out / "random_policy.json")
    refs = game_refs(games, best, cache, opts.random_episodes, opts.seed, say)
    for game, per in cells.items():
        for cell in per.values():
            cell.normalised = refs[game].normalise(cell.mean)
    group_by_label = {g.label: g for g in groups}
    for game, per in cells.items():
        spec = parse_env_spec(game)
        for label, cell in per.items():
            config = group_by_label[label].config
            cell.published = scores.published_for(spec.family, spec.names[0], "test", config["core"],
                                                  config.get("core_options"), config.get("unroll_length"),
                                                  env_options=spec.options)

    # aggregates over games, on normalised scores
    normalised: dict[str, dict[str, dict[int, float]]] = {g.label: {} for g in groups}
    for game, per in cells.items():
        ref = refs[game]
        for label, cell in per.items():
            values = {seed: ref.normalise(v) for seed, v in cell.scores.items()}
            if all(v is not None for v in values.values()):
                normalised[label][game] = values  # type: ignore[assignment]
    unnormalised = [g for g in games if refs[g].normalise(best[g]) is None]
    for game in unnormalised:
        notes.append(f"{game}: no normalised score ({refs[game].random_source or 'no reference'}); left out of "
                     "the aggregates.")
    matrices, used, seeds = score_matrices(normalised, [g for g in games if g not in unnormalised])
    missing = [g for g in games if g not in unnormalised and g not in used]
    if missing:
        notes.append(f"left out of the aggregates because not every group has runs there: {', '.join(missing)}.")
    for label in normalised:
        if label not in matrices:
            notes.append(f"group {label!r}: no seed with a score in every aggregated game; no aggregate.")
        elif any(len(seeds[label]) < len(normalised[label].get(g, {})) for g in used):
            notes.append(f"group {label!r}: aggregates use the seeds it has in every game ({seeds[label]}).")
    results, taus, points, cis = {}, None, {}, {}
    if matrices:
        say(f"aggregates: {len(matrices)} groups x {len(used)} games, {opts.reps} bootstrap resamples ...")
        results = aggregates(matrices, opts.reps, opts.confidence, opts.seed)
        taus = taus_for(matrices)
        points, cis = profiles(matrices, taus, opts.reps, opts.confidence, opts.seed)
    return Report(runs, groups, games, cells, refs, used, seeds, results, taus, points, cis, notes, opts)


# ----------------------------------------------------------------------------- the document

def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _cell_text(cell: GameGroup | None) -> str:
    if cell is None or not cell.scores:
        return "-"
    n = f"n=1, {len(cell.episode_returns)} episodes" if cell.ci_over_episodes else f"n={len(cell.scores)}"
    text = describe_interval(cell.mean, cell.low, cell.high) + f" ({n}{', MMER' if 'mmer' in cell.sources else ''})"
    return (text + (TRAINING_MARK if "training" in cell.sources else "")
            + (STALE_MARK if "stale evaluation" in cell.sources else "")
            + (UNFINISHED_MARK if "unfinished" in cell.sources else ""))


def _random_text(ref: GameRef) -> str:
    if ref.random is None:
        return "-"
    return f"{ref.random:.3g}" + (" (published)" if ref.random_source == "published" else "")


def training_note(runs: Sequence) -> str:
    """Which runs are scored by their training returns (no evaluation.json), and how to evaluate them; ""
    where every run scored has an evaluation (or is scored by POPGym's MMER, from training by design)."""
    scored = [run for run in runs if run.scores]
    training = [run for run in scored if any(score.source == "training" for score in run.scores.values())]
    if not training:
        return ""
    shown = ", ".join(str(run.path) for run in training[:3]) + (", ..." if len(training) > 3 else "")
    return (f"{len(training)} of {len(scored)} run(s) have no evaluation.json, so they are scored by their last "
            f"training returns (metrics.csv), marked {TRAINING_MARK}, not by a final evaluation: {shown}. Evaluate "
            "them with fwrl evaluate RUN (a sweep's cells: fwrl sweep SWEEP --evaluate), then report again.")


def per_game_blocks(report: Report) -> list[doc.Block]:
    """The per-game table (also printed on the terminal)."""
    labels = [g.label for g in report.groups]
    rows = [[game, _random_text(report.refs[game]), *[_cell_text(report.cells[game].get(label)) for label in labels]]
            for game in report.games]
    stale = any("stale evaluation" in c.sources for per in report.cells.values() for c in per.values())
    mmer = any("mmer" in c.sources for per in report.cells.values() for c in per.values())
    unfinished = any("unfinished" in c.sources for per in report.cells.values() for c in per.values())
    return [doc.Heading(2, "Per game"),
            doc.Paragraph(f"Mean return over seeds with its {report.options.confidence:.0%} bootstrap CI "
                          f"[low, high]; n: seeds (with one seed, the CI is over its evaluation episodes). "
                          f"Final evaluation return (`fwrl evaluate`, evaluation.json) "
                          f"where a run has one; {TRAINING_MARK}: training return (mean of the last training "
                          "episodes logged in metrics.csv) for some or all seeds"
                          + (f"; {STALE_MARK}: for some or all seeds, an evaluation of an earlier checkpoint (the "
                             "run trained on after it; see the notes)" if stale else "")
                          + (f"; {UNFINISHED_MARK}: for some or all seeds, a run short of its step budget (its "
                             "score so far; see the notes)" if unfinished else "")
                          + ("; MMER: POPGym's metric (Morad et al. 2023), the maximum over training of the mean "
                             f"return of the last {MMER_WINDOW} episodes (metrics.csv), which scores popgym runs "
                             "whether or not they were evaluated" if mmer else "")
                          + ". random: the return of uniformly random actions."),
            doc.Table(["game", "random", *labels], rows)]


def document(report: Report, figures: dict[str, Path]) -> list[doc.Block]:
    """The whole report as blocks."""
    opts = report.options
    labels = [g.label for g in report.groups]
    sources = sorted({s for per in report.cells.values() for c in per.values() for s in c.sources})
    blocks: list[doc.Block] = [
        doc.Heading(1, "fwrl report"),
        doc.Paragraph(f"{_count(len(report.runs), 'run')} in {_count(len(report.groups), 'group')} over "
                      f"{_count(len(report.games), 'game')}; "
                      f"scores from {' and '.join(SOURCE_TEXT.get(s, s) for s in sources) or 'nothing'}. A group "
                      "is the runs that share every "
                      "setting but the seed (and the game)."),
        doc.Table(["group", "core", "runs", "seeds", "settings that differ between groups"],
                  _group_rows(report)),
        *per_game_blocks(report),
    ]
    norm_rows = []
    for game in report.games:
        ref = report.refs[game]
        cells = [report.cells[game].get(label) for label in labels]
        norm_rows.append([game, ref.kind or "none",
                          *["-" if c is None or c.normalised is None else f"{c.normalised:.3f}" for c in cells]])
    kinds = sorted({report.refs[g].kind for g in report.games if report.refs[g].kind})
    norm_text = ("Group means normalised per game: " + ("; ".join(f"{k}: {KIND_TEXT[k]}" for k in kinds) or "none")
                 + ".")
    if "relative" in kinds:
        norm_text += " `relative` scores compare the groups of this report only (1 is its best group in the game)."
    blocks += [doc.Heading(2, "Normalised scores"),
               doc.Paragraph(norm_text),
               doc.Table(["game", "normalisation", *labels], norm_rows)]
    blocks.append(doc.Heading(2, "Aggregates"))
    if report.aggregate_results:
        blocks.append(doc.Paragraph(
            f"Over the normalised scores of {_count(len(report.aggregate_games), 'game')} "
            f"({', '.join(report.aggregate_games)}): the interquartile mean of all runs x games, the median and the "
            "mean of the per-game means (rliable's definitions), "
            f"with {opts.confidence:.0%} stratified bootstrap CIs ({opts.reps} resamples of the runs within each "
            "game; rliable)."))
        rows = [[label, f"{len(report.aggregate_seeds[label])} x {len(report.aggregate_games)}",
                 *[describe_interval(*report.aggregate_results[label][m]) for m in METRICS]]
                for label in labels if label in report.aggregate_results]
        blocks.append(doc.Table(["group", "runs x games", *METRICS], rows))
        for key, alt in (("aggregates", "aggregate metrics with CIs"), ("profiles", "performance profiles")):
            if key in figures:
                blocks.append(doc.Image(figures[key], alt))
    else:
        blocks.append(doc.Paragraph("No aggregate: no game has normalised scores for every group (see the notes)."))
    if "curves" in figures:
        blocks += [doc.Heading(2, "Learning curves"),
                   doc.Paragraph("Training return (metrics.csv `mean_return`, the mean of the last 100 episodes) "
                                 "against agent steps: the mean over seeds, the band from the lowest to the "
                                 "highest seed."),
                   doc.Image(figures["curves"], "learning curves")]
    published = _published_rows(report)
    if published:
        blocks += [doc.Heading(2, "Published figures"),
                   doc.Paragraph("The papers' numbers come from their full-length runs (PAPERS.md §6), "
                                 "a reference point rather than a pass mark for shorter runs."),
                   doc.Table(["game", "group", "fwrl", "published", "source"], published)]
    if report.notes:
        blocks += [doc.Heading(2, "Notes"), doc.Bullets(report.notes)]
    return blocks


def _flat_settings(config: dict[str, Any]) -> dict[str, str]:
    """A group's settings as ``key: value`` text, core options as ``core_options.key``."""
    out = {k: json.dumps(v, default=str) if isinstance(v, (list, dict)) else str(v)
           for k, v in config.items() if k not in NOT_GROUPING and k != "core_options"}
    out.update({f"core_options.{k}": str(v) for k, v in (config.get("core_options") or {}).items()})
    return out


def _group_rows(report: Report) -> list[list[str]]:
    flats = [_flat_settings(g.config) for g in report.groups]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differ = [k for k in keys if k != "core" and len({f.get(k) for f in flats}) > 1]
    rows = []
    for group, flat in zip(report.groups, flats):
        seeds = sorted({r.seed for r in group.runs})
        rows.append([group.label, group.core, str(len(group.runs)), ", ".join(map(str, seeds)),
                     ", ".join(f"{k}={flat[k]}" for k in differ if k in flat) or "-"])
    return rows


def _published_rows(report: Report) -> list[list[str]]:
    rows = []
    for game in report.games:
        for label, cell in report.cells[game].items():
            for p in cell.published:
                ours = (f"{cell.mean:.4g}" if p.metric == "return" else
                        "-" if cell.normalised is None else f"{100 * cell.normalised:.1f} (norm. x100)")
                rows.append([game, label, ours, f"{p.value:g}" + (" (norm. x100)" if p.metric != "return" else ""),
                             p.source + (f", {p.note}" if p.note else "")])
    return rows


# ----------------------------------------------------------------------------- files

def write_report(report: Report, out: Path) -> list[Path]:
    """Figures, report.md, report.json (and report.html); returns the files written."""
    from fwrl.launch.report import figures as fig

    labels = [g.label for g in report.groups]
    colors = fig.group_colors(labels)
    figures: dict[str, Path] = {}
    curves = {game: {label: [] for label in labels} for game in report.games}
    for group in report.groups:
        for run in group.runs:
            for game, curve in run.curves.items():
                curves[game][group.label].append(curve)
    curves = {game: {k: v for k, v in per.items() if v} for game, per in curves.items()}
    curves = {game: per for game, per in curves.items() if per}
    kinds = sorted({report.refs[g].kind for g in report.aggregate_games})
    xlabel = "normalised score (" + ", ".join(kinds) + ")"
    if curves:
        figures["curves"] = _atomic_png(out / "curves.png", lambda p: fig.learning_curves(curves, p, colors))
    if report.aggregate_results:
        figures["aggregates"] = _atomic_png(out / "aggregates.png", lambda p: fig.interval_plot(
            report.aggregate_results, METRICS, p, colors, xlabel))
        figures["profiles"] = _atomic_png(out / "profiles.png", lambda p: fig.profile_plot(
            report.profile_points, report.profile_cis, report.profile_taus, p, colors, xlabel))
    blocks = document(report, figures)
    written = [*figures.values()]
    atomic_write_text(out / "report.md", doc.to_markdown(blocks))
    written.append(out / "report.md")
    atomic_write_text(out / "report.json", json.dumps(as_json(report_json(report, figures)), indent=2) + "\n")
    written.append(out / "report.json")
    if report.options.html:
        atomic_write_text(out / "report.html", doc.to_html(blocks, "fwrl report"))
        written.append(out / "report.html")
    return written


def _atomic_png(path: Path, draw: Callable[[Path], Path]) -> Path:
    """Draw into a temporary PNG beside ``path``, then replace it (no half-written figure after a crash)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        draw(Path(tmp))
        atomic_write(path, lambda f: f.write(Path(tmp).read_bytes()))
    finally:
        os.unlink(tmp)
    return path


def run_names(paths: Sequence[Path]) -> dict[Path, str]:
    """Each run folder named relative to the common parent of the run folders (a sweep's ``runs/``, the folder of
    runs reported): ``CELL`` for a sweep's cells, ``SWEEP/runs/CELL`` for cells of several sweeps, the folder's
    own name for one run. A report names its runs so, never by the absolute (often temporary) paths they were
    read from, so a report filed with the code stays true wherever the runs lay."""
    if not paths:
        return {}
    root = Path(os.path.commonpath([Path(p).parent for p in paths]))
    return {Path(p): Path(p).relative_to(root).as_posix() for p in paths}


def report_json(report: Report, figures: dict[str, Path]) -> dict[str, Any]:
    """The report's numbers as plain data; runs named by :func:`run_names`."""
    label_of = {id(run): g.label for g in report.groups for run in g.runs}
    name = run_names([r.path for r in report.runs])
    return {
        "settings": report.options.to_dict(),
        "groups": [{"label": g.label, "core": g.core, "runs": [name[r.path] for r in g.runs],
                    "seeds": sorted({r.seed for r in g.runs}),
                    "settings": {k: v for k, v in g.config.items() if k not in NOT_GROUPING}} for g in report.groups],
        "games": [{"game": game, "family": ref.family, "normalisation": ref.kind, "random": ref.random,
                   "random_source": ref.random_source, "best_group_mean": ref.best}
                  for game, ref in report.refs.items()],
        "runs": [{"path": name[r.path], "group": label_of[id(r)], "seed": r.seed,
                  "scores": {game: {"value": s.value, "source": s.source, "episodes": s.episodes,
                                    "agent_steps": s.agent_steps, "run_agent_steps": s.run_steps, "stale": s.stale}
                             for game, s in r.scores.items()},
                  "agent_steps": r.steps, "total_steps": int(r.config["total_steps"]), "unfinished": r.unfinished,
                  "normalised": {game: report.refs[game].normalise(s.value) for game, s in r.scores.items()}}
                 for r in report.runs],
        "per_game": [{"game": game, "group": label, "seeds": sorted(c.scores), "scores": [c.scores[s] for s in
                                                                                        sorted(c.scores)],
                      "mean": c.mean, "ci": [c.low, c.high], "ci_over": "episodes" if c.ci_over_episodes else "seeds",
                      "normalised_mean": c.normalised,
                      "sources": sorted(c.sources),
                      "published": [{"source": p.source, "metric": p.metric, "value": p.value, "note": p.note}
                                    for p in c.published]}
                     for game, per in report.cells.items() for label, c in per.items()],
        "aggregates": {"games": report.aggregate_games, "confidence": report.options.confidence,
                       "reps": report.options.reps,
                       "groups": {label: {"seeds": report.aggregate_seeds[label],
                                          **{m: {"point": v[0], "low": v[1], "high": v[2]} for m, v in res.items()}}
                                  for label, res in report.aggregate_results.items()}},
        "profiles": {"taus": report.profile_taus if report.profile_taus is not None else [],
                     "groups": {label: {"fraction": report.profile_points[label],
                                        "low": report.profile_cis[label][0], "high": report.profile_cis[label][1]}
                                for label in report.profile_points}},
        "figures": {k: p.name for k, p in figures.items()},
        "notes": report.notes,
    }
