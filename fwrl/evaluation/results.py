"""Evaluation results: per-run summaries, aggregates with normalised and published scores,
the table (terminal and markdown), the JSON file, and metrics.csv columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from fwrl.envs.spec import EnvSpec, parse_env_spec
from fwrl.evaluation import scores
from fwrl.evaluation.episodes import EvalEpisode
from fwrl.evaluation.protocols import Split
from fwrl.utils.files import atomic_write_text


def _stats(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std())


def _normalised(family: str, task: str, score: float, options: Mapping[str, Any]) -> float | None:
    value = scores.normalise(family, task, score, options)
    return None if value is None else round(value, 6)


def run_result(spec: EnvSpec, task: int, split: Split, repeat: int, seed: int,
               eps: list[EvalEpisode]) -> dict[str, Any]:
    """One (task, split, repeat): episode returns, mean, std (over episodes), normalised mean."""
    returns = [e.episode_return for e in eps]
    mean, std = _stats(returns)
    name = spec.names[task]
    split_opts = parse_env_spec(split.env).options
    out: dict[str, Any] = {
        "task": name, "split": split.name, "repeat": repeat, "env": split.env, "seed": seed,
        "episodes": len(eps), "mean": mean, "std": std,
        "normalised": _normalised(spec.family, name, mean, split_opts),
        "returns": returns, "lengths": [e.length for e in eps],
    }
    success = [e.extra["success"] for e in eps if "success" in e.extra]
    if success:
        out["success"] = float(np.mean(success))
    return out


def aggregate(runs: list[dict[str, Any]], family: str, options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (task, split) over repeats; then, over tasks and over the test splits, normalised means.

    ``mean`` is over every episode of every repeat, ``std`` over episodes,
    ``std_of_repeat_means`` across repeats. ``task="*"`` rows average the
    normalised scores of all tasks; ``split="test"`` rows (ProcGen) average the
    test splits, as the SRWM paper reports them.
    """
    rows: list[dict[str, Any]] = []
    keys = list(dict.fromkeys((r["task"], r["split"]) for r in runs))
    for task, split in keys:
        group = [r for r in runs if (r["task"], r["split"]) == (task, split)]
        returns = [x for r in group for x in r["returns"]]
        mean, std = _stats(returns)
        row = {"task": task, "split": split, "repeats": len(group), "episodes": len(returns), "mean": mean,
               "std": std, "std_of_repeat_means": _stats([r["mean"] for r in group])[1],
               "normalised": _normalised(family, task, mean, parse_env_spec(group[0]["env"]).options)}
        if all("success" in r for r in group):
            row["success"] = float(np.mean([r["success"] for r in group]))
        rows.append(row)
    tests = [s for s in dict.fromkeys(r["split"] for r in rows) if s.startswith("test_")]
    if len(tests) > 1:
        for task in dict.fromkeys(r["task"] for r in rows):
            per = [r for r in rows if r["task"] == task and r["split"] in tests]
            norm = [r["normalised"] for r in per]
            rows.append({"task": task, "split": "test", "repeats": len(per), "episodes": sum(r["episodes"] for r in per),
                         "mean": float(np.mean([r["mean"] for r in per])), "std": None,
                         "std_of_repeat_means": _stats([r["mean"] for r in per])[1],
                         "normalised": None if None in norm else round(float(np.mean(norm)), 6)})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    if len(tasks) > 1:
        for split in list(dict.fromkeys(r["split"] for r in rows)):
            per = [r for r in rows if r["split"] == split and r["task"] != "*"]
            norm = [r["normalised"] for r in per]
            rows.append({"task": "*", "split": split, "repeats": per[0]["repeats"],
                         "episodes": sum(r["episodes"] for r in per),
                         "mean": float(np.mean([r["mean"] for r in per])), "std": None, "std_of_repeat_means": None,
                         "normalised": None if None in norm else round(float(np.mean(norm)), 6),
                         "median_normalised": None if None in norm else round(float(np.median(norm)), 6)})
    return rows


def attach_published(rows: list[dict[str, Any]], spec: EnvSpec, core: str, core_options: Mapping[str, Any],
                     unroll_length: int | None) -> None:
    for row in rows:
        found = scores.published_for(spec.family, row["task"], row["split"], core, core_options,
                                     unroll_length, games=tuple(spec.names), env_options=spec.options)
        row["published"] = [{"source": p.source, "metric": p.metric, "value": p.value, "note": p.note}
                            for p in found]


def task_rows(result: Mapping[str, Any], split: str | None = None) -> tuple[str, dict[str, dict[str, Any]]]:
    """The split and each task's aggregate row of an evaluation result (``fwrl evaluate``'s JSON, or a
    random policy's of ``benchmarks/random_policy.py``) on ``split``; None: ``train`` where the result has
    it, else its first split. Raises KeyError naming the splits it has where it lacks ``split``."""
    rows = [r for r in result["aggregates"] if r.get("std") is not None]  # per task (the '*' rows have none)
    splits = list(dict.fromkeys(r["split"] for r in rows))
    if split is None:
        split = "train" if "train" in splits or not splits else splits[0]
    if split not in splits:
        raise KeyError(f"no split {split!r}; it has {', '.join(splits) or 'none'}")
    return split, {r["task"]: r for r in rows if r["split"] == split}


def table_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """Cells of the result table: task, split, episodes, return, normalised x100, success, published."""
    out = []
    for row in result["aggregates"]:
        spread = row["std_of_repeat_means"] if row["repeats"] > 1 else row["std"]
        ret = "" if row["task"] == "*" else f"{row['mean']:.4g}" + (f" ± {spread:.3g}" if spread is not None else "")
        norm = "" if row["normalised"] is None else f"{100 * row['normalised']:.1f}"
        success = f"{row['success']:.3f}" if "success" in row else ""
        published = "; ".join(
            f"{p['value']:g}{' (norm. x100)' if p['metric'] == 'normalised_x100' else ''}"
            + (f" [{p['note']}]" if p["note"] else "")
            for p in row.get("published", [])
        )
        out.append([row["task"], row["split"], str(row["episodes"]), ret, norm, success, published])
    return out


TABLE_HEADER = ["task", "split", "episodes", "return (mean ± sd)", "normalised x100", "success", "published"]
OPTIONAL_COLUMNS = ("normalised x100", "success", "published")  # left out where no row has a value


def shown_table(result: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the result table, without the optional columns that are empty in
    every row (a family without normalisation constants or published figures, a task without success)."""
    rows = table_rows(result)
    keep = [i for i, name in enumerate(TABLE_HEADER)
            if name not in OPTIONAL_COLUMNS or any(cells[i] for cells in rows)]
    return [TABLE_HEADER[i] for i in keep], [[cells[i] for i in keep] for cells in rows]


def _title(result: Mapping[str, Any]) -> str:
    return (f"{result['env']} / {result['core'] or 'agent'} / {result['policy']} / "
            f"{result['episodes']} episodes x {result['repeats']} repeats / seed {result['seed']}")


def markdown_table(result: Mapping[str, Any]) -> str:
    lines = [f"# Evaluation: {_title(result)}", ""]
    if result.get("checkpoint"):
        lines += [f"Checkpoint `{result['checkpoint']}` at {result.get('agent_steps', 0):,} agent steps.", ""]
    header, rows = shown_table(result)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    lines += ["", "sd: across repeats where there are several, else across episodes. "
              f"Normalisation: {result['normalisation'] or 'none for this family'}. "
              "Published figures come from the papers' full-length runs (PAPERS.md §6)."]
    return "\n".join(lines) + "\n"


def print_table(result: Mapping[str, Any]) -> None:
    from rich.table import Table

    from fwrl.utils.console import show_table

    header, rows = shown_table(result)
    table = Table(*header, title=_title(result))
    for cells in rows:
        table.add_row(*cells, style="bold" if cells[0] == "*" or cells[1] == "test" else None)
    show_table(table)


def write_result(result: Mapping[str, Any], json_path: Path) -> Path:
    """Write the JSON and, beside it, the markdown table; returns the markdown path."""
    json_path = Path(json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(result, indent=2) + "\n")
    md_path = json_path.with_suffix(".md")
    atomic_write_text(md_path, markdown_table(result))
    return md_path


def metrics_row(result: Mapping[str, Any], agent_steps: int) -> dict[str, Any]:
    """Evaluation results as metrics.csv columns: ``eval/<split>/mean_return`` and friends."""
    row: dict[str, Any] = {"agent_steps": agent_steps}
    rows = result["aggregates"]
    multi = len({r["task"] for r in rows if r["task"] != "*"}) > 1
    for r in rows:
        prefix = f"eval/{r['split']}"
        if r["task"] == "*":
            row[f"{prefix}/mean_return"] = r["mean"]
            if r["normalised"] is not None:
                row[f"{prefix}/normalised"] = r["normalised"]
            continue
        if multi:
            row[f"{prefix}/return/{r['task']}"] = r["mean"]
            continue
        row[f"{prefix}/mean_return"] = r["mean"]
        if r["normalised"] is not None:
            row[f"{prefix}/normalised"] = r["normalised"]
        if "success" in r:
            row[f"{prefix}/success"] = r["success"]
    return row
