"""Runs for a report: where they are, their final scores and learning curves, and their groups.

Paths may be sweep folders (every cell of ``sweep.yaml`` that has a run
folder), run folders (``config.yaml``), or folders whose subfolders are runs.

A run's score in a game is its final evaluation return (``evaluation.json`` of
``fwrl evaluate``: the ``test`` split, or the mean of the ProcGen test splits)
where it has one, else the mean return of its last logged training episodes
(the last ``mean_return`` of ``metrics.csv``, a running mean over the last 100
episodes; ``return/<task>`` for multi-task runs), marked as a training return.
A POPGym run's score is POPGym's metric, MMER (Morad et al. 2023; :func:`fwrl.evaluation.scores.mmer`):
the maximum over training of that mean episode return, from metrics.csv even where the run has an
evaluation (which counts only where metrics.csv has no episode).
An evaluation of an earlier checkpoint than the run's last (``evaluation.json``
records its agent steps; the run was resumed and trained on since) is stale:
its score is kept, and marked with the two step counts. A run whose last logged
agent steps fall short of its ``total_steps`` (a sweep still running, a time
limit) is unfinished: its score is what it reached so far, marked as such.
A multi-task run (``procgen:bigfish+fruitbot``) counts in each of its games.

Groups: runs that share every setting but the seed (and the env, which is the
game; and the resource settings a run may change on ``--resume``) are one
group, labelled with the sweep cell's labels (all but the env and seed axes)
or else the core name and the settings that tell groups of one core apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from fwrl.envs.spec import EnvSpec, parse_env_spec
from fwrl.errors import FwrlError
from fwrl.evaluation.scores import MMER_FAMILIES, MMER_WINDOW, mmer
from fwrl.launch.plot import read_metrics, series
from fwrl.settings.config import RESUMABLE_CHANGES, read_config
from fwrl.launch.sweep.plan import is_sweep, read_manifest

# settings that do not make a group: the seed, the env (the game), and what a run may change on --resume
NOT_GROUPING = frozenset({"seed", "env"} | (RESUMABLE_CHANGES - {"total_steps"}))
SEED_AXES = ("seed",)
STALE_MARK = "‡"  # an evaluation of an earlier checkpoint than the run's last
UNFINISHED_MARK = "§"  # a run short of its step budget
GAME_AXES = ("env",)


@dataclass(frozen=True)
class Score:
    """A run's final score in one game, and where it comes from."""

    value: float
    source: str  # "evaluation" (evaluation.json), "training" (metrics.csv) or "mmer" (POPGym's MMER, metrics.csv)
    episodes: int | None = None
    returns: tuple[float, ...] = ()  # the evaluation episodes' returns (for a CI when a group has one seed)
    agent_steps: int | None = None  # of the evaluated checkpoint (evaluation.json), or of the last metrics row
    run_steps: int | None = None  # the run's last logged agent steps
    note: str = ""  # what the report should say about how this score was taken

    @property
    def stale(self) -> bool:
        """An evaluation of an earlier checkpoint: the run trained on after it."""
        return (self.source == "evaluation" and self.agent_steps is not None and self.run_steps is not None
                and self.run_steps > self.agent_steps)


@dataclass
class Run:
    """One run folder: its settings, scores and curves per game (game: a one-task env spec)."""

    path: Path
    config: dict[str, Any]
    labels: dict[str, str] | None = None  # a sweep cell's axis labels
    scores: dict[str, Score] = field(default_factory=dict)
    curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    steps: int | None = None  # the last agent steps metrics.csv logged (None: no row)

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    @property
    def unfinished(self) -> bool:
        """The run has not logged its step budget (still training, or stopped short of it)."""
        return (self.steps or 0) < int(self.config["total_steps"])

    def method_key(self) -> str:
        """What the runs of a group share: every setting but those in :data:`NOT_GROUPING`."""
        return json.dumps({k: v for k, v in self.config.items() if k not in NOT_GROUPING}, sort_keys=True,
                          default=str)


@dataclass
class Group:
    """Runs that differ only in seed (and game)."""

    label: str
    key: str
    runs: list[Run]

    @property
    def core(self) -> str:
        return str(self.runs[0].config["core"])

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0].config


def game_of(spec: EnvSpec, task: str) -> str:
    """The game id of one task of ``spec``: a one-task spec with the same options."""
    return EnvSpec(spec.family, (task,), dict(spec.options)).text


# ----------------------------------------------------------------------------- finding runs

def find_runs(paths: Sequence[Path]) -> list[tuple[Path, dict[str, str] | None]]:
    """Run folders under ``paths`` with their sweep labels (None outside a sweep), each once, in order."""
    found: dict[Path, dict[str, str] | None] = {}
    for path in map(Path, paths):
        if not path.exists():
            raise FwrlError(f"{path} does not exist; pass sweep folders, run folders, or folders of runs.")
        before = len(found)
        if is_sweep(path):
            for name, entry in read_manifest(path)["cells"].items():
                run = path / "runs" / name
                if (run / "config.yaml").is_file():
                    found.setdefault(run.resolve(), dict((entry or {}).get("labels") or {}))
        elif (path / "config.yaml").is_file():
            found.setdefault(path.resolve(), None)
        elif path.is_dir():
            for sub in sorted(p for p in path.iterdir() if (p / "config.yaml").is_file()):
                found.setdefault(sub.resolve(), None)
        if len(found) == before:
            what = "a sweep whose cells have not started" if is_sweep(path) else "no runs"
            raise FwrlError(f"{path} holds {what}: pass sweep folders (sweep.yaml), run folders (config.yaml), or "
                            "folders of run folders.")
    return list(found.items())


# ----------------------------------------------------------------------------- one run

def _evaluation_scores(result: dict[str, Any]) -> dict[str, Score]:
    """Per game: the ``test`` row of the evaluation, else the mean of its ``test_*`` rows, else its only split."""
    spec = parse_env_spec(str(result["env"]))
    rows = [r for r in result.get("aggregates", []) if r.get("task") != "*"]
    out: dict[str, Score] = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        chosen = [r for r in mine if r["split"] == "test"] or [r for r in mine if str(r["split"]).startswith("test")]
        if not chosen and len({r["split"] for r in mine}) == 1:
            chosen = mine
        if not chosen:
            continue
        value = sum(float(r["mean"]) for r in chosen) / len(chosen)
        splits = {r["split"] for r in chosen}
        returns = tuple(float(x) for r in result.get("runs", []) if r.get("task") == task and r.get("split") in splits
                        for x in r.get("returns", ()))
        out[game_of(spec, task)] = Score(value, "evaluation", sum(int(r.get("episodes", 0)) for r in chosen),
                                         returns if len(splits) == 1 else ())
    return out


def _number(raw: str | None) -> float:
    try:
        return float(raw) if raw not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _training(rows: list[dict[str, str]], spec: EnvSpec) -> tuple[dict[str, Score], dict[str, tuple]]:
    """Each game's training score (its last logged mean return; POPGym's MMER for a popgym run) and
    its learning curve, from metrics.csv rows."""
    scores, curves = {}, {}
    for task in spec.names:
        column = "mean_return" if spec.num_tasks == 1 else f"return/{task}"
        steps, values = series(rows, column)
        values_ok = [(s, v) for s, v in zip(steps, values) if math.isfinite(v)]
        if not values_ok:
            continue
        game = game_of(spec, task)
        curves[game] = ([s for s, _ in values_ok], [v for _, v in values_ok])
        episodes = series(rows, "episodes")[1]
        ended = int(episodes[-1]) if episodes else None
        if spec.family in MMER_FAMILIES:
            best = mmer([_number(r.get(column)) for r in rows], [_number(r.get("episodes")) for r in rows],
                        tasks=spec.num_tasks)
            note = "" if best.full else (
                f"MMER over means of fewer than {MMER_WINDOW} episodes{' per game' if spec.num_tasks > 1 else ''}: "
                f"the run logged no row after its {MMER_WINDOW * spec.num_tasks}th episode")
            scores[game] = Score(best.value, "mmer", ended, note=note)
        else:
            scores[game] = Score(values_ok[-1][1], "training", ended)
    return scores, curves


def load_run(path: Path, labels: dict[str, str] | None = None) -> Run:
    """A run's config, scores (evaluation first) and curves."""
    config = read_config(path / "config.yaml").to_dict()
    run = Run(path, config, labels)
    spec = parse_env_spec(config["env"])
    rows = read_metrics(path) if (path / "metrics.csv").is_file() else []
    run.scores, run.curves = _training(rows, spec)
    steps = [int(s) for s in series(rows, "agent_steps")[1] if math.isfinite(s)] if rows else []
    run_steps = run.steps = max(steps) if steps else None
    evaluation = path / "evaluation.json"
    if evaluation.is_file():
        try:
            result = json.loads(evaluation.read_text())
        except (OSError, ValueError) as exc:
            raise FwrlError(f"cannot read {evaluation}: {exc}.") from None
        evaluated = result.get("agent_steps")
        for game, score in _evaluation_scores(result).items():
            if run.scores.get(game) is not None and run.scores[game].source == "mmer":
                continue  # POPGym's metric is over training
            run.scores[game] = replace(score, agent_steps=int(evaluated) if evaluated is not None else None,
                                       run_steps=run_steps)
    return run


def stale_note(run: Run) -> str | None:
    """What the report says of a run whose evaluation is of an earlier checkpoint (None: not stale)."""
    stale = [s for s in run.scores.values() if s.stale]
    if not stale:
        return None
    return (f"{run.path}: evaluation.json is of the checkpoint at {stale[0].agent_steps:,} agent steps, and the run "
            f"has trained to {stale[0].run_steps:,} since: its score is that earlier evaluation, marked "
            f"{STALE_MARK}; run `fwrl evaluate {run.path}` again to score the current checkpoint.")


def unfinished_note(runs: Sequence[Run], left_out: bool) -> str | None:
    """What the report says of the runs short of their step budget (None: every run finished)."""
    short = [run for run in runs if run.unfinished]
    if not short:
        return None
    listed = ", ".join(f"{run.path.name} ({run.steps or 0:,} of {int(run.config['total_steps']):,})" for run in short[:6])
    more = f" and {len(short) - 6} more" if len(short) > 6 else ""
    if left_out:
        return (f"{len(short)} of {len(runs)} runs have not reached their step budget and are left out "
                f"(--finished-only): {listed}{more} agent steps.")
    return (f"{len(short)} of {len(runs)} runs have not reached their step budget: {listed}{more} agent steps; "
            f"their scores are what they reached so far, marked {UNFINISHED_MARK} (--finished-only leaves them out).")


# ----------------------------------------------------------------------------- groups

def _sweep_label(run: Run) -> str | None:
    if not run.labels:
        return None
    parts = [label for axis, label in run.labels.items() if axis not in GAME_AXES + SEED_AXES]
    return " ".join(parts) if parts else None


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in config.items() if k not in NOT_GROUPING and k not in ("core", "core_options")}
    out.update({f"{k}": v for k, v in (config.get("core_options") or {}).items()})
    return out


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs grouped by :meth:`Run.method_key`, in order of first appearance, with distinct labels."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.method_key(), []).append(run)
    groups = []
    for key, members in by_key.items():
        labels = {_sweep_label(r) for r in members}
        groups.append(Group(labels.pop() if len(labels) == 1 and None not in labels else "", key, members))
    taken = [g.label for g in groups if g.label]
    clash = {label for label in taken if taken.count(label) > 1}
    for group in groups:
        if group.label and group.label not in clash:
            continue
        same_core = [g for g in groups if g.core == group.core]
        flats = [_flat(g.config) for g in same_core]
        differ = [k for k in flats[0] if any(f.get(k) != flats[0].get(k) for f in flats)] if len(flats) > 1 else []
        mine = _flat(group.config)
        group.label = group.core + (f" ({', '.join(f'{k}={mine.get(k)}' for k in differ)})" if differ else "")
    labels = [g.label for g in groups]
    for i, group in enumerate(groups):
        if labels.count(group.label) > 1:
            group.label = f"{group.label} #{i + 1}"
    return groups
