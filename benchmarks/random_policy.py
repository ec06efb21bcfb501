"""The uniform-random policy's return per task and split, under the env's evaluation protocol.

The floor a trained agent is read against: issue 73 asks, per ProcGen game, whether an agent's
return is above a random policy's on the same levels. The policy is
:func:`fwrl.evaluation.random_policy.uniform_policy` (zero logits), played by ``fwrl evaluate``'s
machinery with sampled actions, so workers, levels, splits and episode selection are the protocol's.

    python benchmarks/random_policy.py \\
        --env "procgen:bigfish+fruitbot+maze+leaper+plunder+starpilot?distribution=easy&num_levels=200&start_level=0" \\
        --episodes 100 --num-workers 6 --envs-per-worker 4 \\
        --out benchmarks/results/learning/procgen-cpu/random_policy

writes ``random_policy.json`` (``fwrl evaluate``'s JSON) and ``random_policy.md`` (per task and split:
episodes, mean, its 95% confidence interval, and the normalised score where the family has one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from fwrl.errors import FwrlError
from fwrl.evaluation.random_policy import evaluate_random_policy
from fwrl.utils.files import atomic_write_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="env spec, as fwrl train's --env")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per task and split (default: the "
                        "family's protocol)")
    parser.add_argument("--splits", default=None, help="comma-separated splits (default: every split of the protocol)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="path without suffix: writes OUT.json and OUT.md")
    args = parser.parse_args(argv)
    said = {"done": -1, "at": 0.0}

    def progress(what: str, done: int, total: int, mean: float) -> None:
        """A line when an episode ends (at most every 5 s), and every 30 s while none does."""
        now = time.monotonic()
        if (done != said["done"] and now - said["at"] > 5) or now - said["at"] > 30 or done == total:
            said.update(done=done, at=now)
            print(f"{what}: {done} / {total} episodes, mean return so far {mean:.3f}", flush=True)

    try:
        result = evaluate_random_policy(
            args.env, episodes=args.episodes, splits=args.splits.split(",") if args.splits else None,
            num_workers=args.num_workers, envs_per_worker=args.envs_per_worker, seed=args.seed, progress=progress)
    except FwrlError as exc:
        print(f"random_policy: error: {exc}", file=sys.stderr)
        return 2
    if result is None:
        return 130
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out.with_suffix(".md"), table(result, " ".join(sys.argv)))
    print(f"wrote {args.out.with_suffix('.json')} and .md")
    return 0


def table(result: dict, command: str) -> str:
    """The per task and split rows as a Markdown table, under the command that made them."""
    lines = [f"# The uniform-random policy on {result['env']}", "",
             f"`{command}`", "",
             f"{result['episodes']} episodes per task and split, sampled actions, seed {result['seed']}; the 95% "
             "interval is mean +- 1.96 std / sqrt(episodes).", "",
             "| task | split | episodes | mean return | 95% interval | normalised |", "|---|---|---|---|---|---|"]
    for row in result["aggregates"]:
        if row["std"] is None:
            continue  # the over-splits and over-tasks means: their parts are listed
        half = 1.96 * row["std"] / math.sqrt(row["episodes"]) if row["episodes"] > 1 else float("nan")
        norm = "" if row["normalised"] is None else f"{row['normalised']:.3f}"
        lines.append(f"| {row['task']} | {row['split']} | {row['episodes']} | {row['mean']:.3f} | "
                     f"[{row['mean'] - half:.3f}, {row['mean'] + half:.3f}] | {norm} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
