"""Each run's training return per task against the uniform-random policy's, with 95% intervals (issue 73).

A run's training return on a task is the mean of its last ``--last`` finished episodes of that task
(``episodes.csv`` in the run folder: every training episode, sampled actions, the train levels); the
random policy's is ``benchmarks/random_policy.py``'s on the same levels and split. Both intervals are
mean +- 1.96 std / sqrt(episodes) (the random-policy table's). A task is **above** random when the
run's interval lies wholly above the random policy's, **below** when wholly below, else **not
separated**. Normalised scores use the family's constants (ProcGen: Cobbe et al. 2020's min-max).

    python benchmarks/learning/above_random.py \\
        --run srwm=runs/procgen-cpu-srwm --run lstm=runs/procgen-cpu-lstm \\
        --random benchmarks/results/learning/procgen-cpu/random_policy.json \\
        --out benchmarks/results/learning/procgen-cpu/above_random.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

from fwrl.envs.spec import parse_env_spec
from fwrl.evaluation.results import task_rows
from fwrl.evaluation.scores import normalise
from fwrl.utils.files import atomic_write_text
from fwrl.utils.metrics_file import EPISODES_FILE, read_metrics_file

Z95 = 1.96


def interval(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, std and the normal 95% interval of the mean (nan bounds with fewer than 2 values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan, math.nan
    std = statistics.stdev(values)
    half = Z95 * std / math.sqrt(len(values))
    return mean, std, mean - half, mean + half


def verdict(low: float, high: float, random_low: float, random_high: float) -> str:
    if low > random_high:
        return "above"
    if high < random_low:
        return "below"
    return "not separated"


def random_rows(path: Path, split: str) -> dict[str, dict]:
    """The random policy's row per task on ``split`` (from random_policy.json)."""
    try:
        return task_rows(json.loads(path.read_text()), split)[1]
    except KeyError as error:
        raise SystemExit(f"above_random: error: {path}: {error.args[0]}") from None


def run_rows(label: str, folder: Path, last: int, randoms: dict[str, dict], until: int | None = None) -> list[dict]:
    """The run's rows per task: its last ``last`` episodes (of those logged by agent step ``until``, where
    given: runs compared at the same steps) against the random policy's."""
    path = folder / EPISODES_FILE
    if not path.exists():
        raise SystemExit(f"above_random: error: {folder} has no {EPISODES_FILE} (runs of fwrl before it was "
                         "written have none); give a run folder of fwrl train")
    config = yaml.safe_load((folder / "config.yaml").read_text())
    spec = parse_env_spec(config["env"])
    episodes = read_metrics_file(path).rows
    if until is not None:
        episodes = [r for r in episodes if int(float(r["agent_steps"])) <= until]
    steps = max((int(float(r["agent_steps"])) for r in episodes), default=0)
    rows = []
    for task in sorted({r["task"] for r in episodes} | set(randoms)):
        returns = [float(r["return"]) for r in episodes if r["task"] == task][-last:]
        random = randoms.get(task)
        row = {"run": label, "task": task, "agent_steps": steps, "episodes": len(returns)}
        if returns:
            row["mean"], row["std"], row["low"], row["high"] = interval(returns)
            row["normalised"] = normalise(spec.family, task, row["mean"], spec.options)
        if random is not None:
            half = Z95 * random["std"] / math.sqrt(random["episodes"]) if random["episodes"] > 1 else math.nan
            row["random"], row["random_low"], row["random_high"] = random["mean"], random["mean"] - half, random["mean"] + half
        if returns and random is not None:
            row["verdict"] = verdict(row["low"], row["high"], row["random_low"], row["random_high"])
        rows.append(row)
    return rows


def markdown(rows: list[dict], last: int, command: str) -> str:
    fmt = lambda x: "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"  # noqa: E731
    lines = ["# Training return per task against the uniform-random policy's", "", f"`{command}`", "",
             f"Each run's last {last} training episodes per task (`episodes.csv`) against the random policy on the same "
             "levels; 95% intervals mean +- 1.96 std / sqrt(episodes). above: the run's interval wholly above the "
             "random policy's.", "",
             "| run | task | agent steps | episodes | mean return | 95% interval | normalised | random | random 95% | "
             "verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['task']} | {r['agent_steps']:,} | {r['episodes']} | {fmt(r.get('mean'))} | "
                     f"[{fmt(r.get('low'))}, {fmt(r.get('high'))}] | {fmt(r.get('normalised'))} | "
                     f"{fmt(r.get('random'))} | [{fmt(r.get('random_low'))}, {fmt(r.get('random_high'))}] | "
                     f"{r.get('verdict', '')} |")
    lines += [""]
    for run in dict.fromkeys(r["run"] for r in rows):
        above = sum(r.get("verdict") == "above" for r in rows if r["run"] == run)
        tasks = sum(1 for r in rows if r["run"] == run)
        lines.append(f"- **{run}**: above random on {above} of {tasks} tasks")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="LABEL=RUN_FOLDER (repeatable)")
    parser.add_argument("--random", type=Path, required=True, help="random_policy.json of benchmarks/random_policy.py")
    parser.add_argument("--split", default="train", help="the random policy's split the runs trained on (default train)")
    parser.add_argument("--last", type=int, default=100, help="episodes per task, the last of each run (default 100)")
    parser.add_argument("--until", type=int, help="only episodes logged by this agent step (runs at equal steps)")
    parser.add_argument("--out", type=Path, help="write the markdown here (and the figures beside it as .json)")
    args = parser.parse_args(argv)
    if args.last < 2:
        parser.error(f"--last {args.last}: an interval needs at least 2 episodes")
    if args.until is not None and args.until < 1:
        parser.error(f"--until {args.until}: give an agent step count of at least 1")
    randoms = random_rows(args.random, args.split)
    rows = []
    for text in args.run:
        label, sep, folder = text.partition("=")
        if not sep or not label:
            parser.error(f"--run {text!r}: expected LABEL=RUN_FOLDER")
        rows += run_rows(label, Path(folder), args.last, randoms, args.until)
    command = "python benchmarks/learning/above_random.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(rows, args.last, command)
    if args.out:
        atomic_write_text(args.out, text)
        atomic_write_text(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
