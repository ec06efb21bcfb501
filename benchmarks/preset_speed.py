"""Agent steps/s at a preset, code against code, side by side (issues 69 and 73).

Each variant is a folder of fwrl's code (a ``git archive`` of a commit, or this checkout) and the
flags its runs add to ``--preset PRESET`` (a variant whose flags name its own ``--preset`` runs that
one instead); every (variant, core) runs ``fwrl bench throughput --preset PRESET --core CORE`` in its
own process with ``PYTHONPATH`` set to that folder, the variants and cores alternated within each
round (so a busy spell of the machine hits every one alike). The report gives, per variant and core,
the median agent steps/s over the rounds, the median of the per-round ratios to the first variant's
same core, and to the same variant's ``--baseline-core`` (the fast-weight cores' goal at the popgym
preset is a ratio to the GRU), with the learner's busy ms per update and idle share.

    git archive 9f18864 | tar -x -C /tmp/fwrl-9f18864
    python benchmarks/preset_speed.py --variant 9f18864=/tmp/fwrl-9f18864 --variant new=. \\
        --variant "new, old settings=.:--stem mlp --batch-size 8 --envs-per-worker 8 --learning-rate 0.001" \\
        --cores gru,srwm,lstm,delta_net,rdn --rounds 3 --out benchmarks/results/popgym_speed.md
    python benchmarks/preset_speed.py --preset procgen-cpu --baseline-core lstm \\
        --variant "9f18864=/tmp/fwrl-9f18864:--preset srwm-procgen-easy --num-workers 6 --envs-per-worker 2" \\
        --variant new=. --cores lstm,srwm --out benchmarks/results/procgen_speed.md

A run that fails is recorded with its error and left out of the medians; the report is rewritten
after every run, so a long benchmark keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cpu_cores import core_flags  # this folder's: `name[:key=value...]` as --core/--core-opt flags


@dataclass(frozen=True)
class Variant:
    label: str
    code: Path
    flags: tuple[str, ...]


def parse_variant(text: str) -> Variant:
    """``LABEL=DIR`` or ``LABEL=DIR:FLAGS`` (FLAGS split as a shell would)."""
    label, sep, rest = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected LABEL=DIR[:FLAGS]")
    code, _, flags = rest.partition(":")
    folder = Path(code).resolve()
    if not (folder / "fwrl" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"--variant {text!r}: {folder} holds no fwrl package")
    return Variant(label, folder, tuple(shlex.split(flags)))


def measure(variant: Variant, core: str, seconds: float, warmup: float, preset: str = "popgym") -> dict:
    """One ``fwrl bench throughput`` run of ``core`` in ``variant``'s code, at ``preset`` unless the
    variant's flags name their own."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        preset_flags = [] if "--preset" in variant.flags else ["--preset", preset]
        command = [sys.executable, "-m", "fwrl.launch.cli", "bench", "throughput", *preset_flags,
                   *core_flags(core), *variant.flags, "--seconds", str(seconds), "--warmup", str(warmup),
                   "--ceiling-seconds", "0", "--json-path", str(out)]
        env = {**os.environ, "PYTHONPATH": str(variant.code)}
        done = subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            lines = [line for line in done.stderr.splitlines() if line.startswith("fwrl: error")]
            return {"error": (lines[-1] if lines else done.stderr[-300:]).strip()}
        record = json.loads(out.read_text())
    learner = record["thread_shares"]["learner"]
    config = record.get("config", {})
    busy = 1.0 - learner["learner_idle"]
    return {"steps_per_second": record["steps_per_second"], "updates": record["updates"],
            "seconds": record["seconds"], "learner_idle": learner["learner_idle"],
            "learner_ms_per_update": busy * record["seconds"] / max(record["updates"], 1) * 1e3,
            "batch": f"{config.get('batch_size', '?')} x {config.get('unroll_length', '?')}",
            "envs": f"{config.get('num_workers', '?')} x {config.get('envs_per_worker', '?')}",
            "stem": config.get("stem", "?") + (" bf16" if config.get("stem_precision") == "bfloat16" else ""),
            "update process": config.get("learner_process", "auto")}


def _ratio(runs: list[dict], baseline: list[dict]) -> float | None:
    pairs = [(r, b) for r, b in zip(runs, baseline) if "error" not in r and "error" not in b]
    return statistics.median(r["steps_per_second"] / b["steps_per_second"] for r, b in pairs) if pairs else None


def summarise(results: dict[tuple[str, str], list[dict]], variants: list[Variant], cores: list[str],
              baseline_core: str = "gru") -> list[dict]:
    rows = []
    for variant in variants:
        for core in cores:
            runs = results[variant.label, core]
            ok = [r for r in runs if "error" not in r]
            row = {"variant": variant.label, "core": core, "rounds": runs, "measured": len(ok)}
            for key in ("steps_per_second", "learner_ms_per_update", "learner_idle"):
                row[key] = statistics.median(r[key] for r in ok) if ok else None
            for key in ("batch", "envs", "stem", "update process"):
                row[key] = ok[0][key] if ok else ""
            row["x_first"] = _ratio(runs, results[variants[0].label, core])
            row["x_core"] = _ratio(runs, results.get((variant.label, baseline_core), []))
            rows.append(row)
    return rows


def markdown(rows: list[dict], variants: list[Variant], args: argparse.Namespace) -> str:
    fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
    base = args.baseline_core
    lines = [f"# Agent steps/s at the {args.preset} preset, side by side ({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/preset_speed.py {shlex.join(sys.argv[1:])}`", "",
             f"`fwrl bench throughput --preset {args.preset}` (or a variant's own): {args.seconds:g} s measured "
             f"after {args.warmup:g} s of warm-up, {args.rounds} rounds, the variants and cores alternated within "
             f"each round; medians over the rounds, and medians of the per-round ratios (x {variants[0].label}: to "
             f"the first variant's same core; x {base}: to the same variant's {base}).", "", "Variants:", ""]
    lines += [f"- **{v.label}**: code `{v.code}`" + (f", flags `{shlex.join(v.flags)}`" if v.flags else "")
              for v in variants]
    lines += ["", f"| variant | core | stem | workers x envs | B x T | agent steps/s | x {variants[0].label} | x {base} | "
              "learner ms / update | learner idle | update process |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["steps_per_second"] is None:
            errors = "; ".join(sorted({x["error"] for x in r["rounds"] if "error" in x}))[:200]
            lines.append(f"| {r['variant']} | {r['core']} | | | | failed: {errors} | | | | | |")
            continue
        some = "" if r["measured"] == len(r["rounds"]) else f" ({r['measured']} rounds)"
        lines.append(f"| {r['variant']} | {r['core']} | {r['stem']} | {r['envs']} | {r['batch']} | "
                     f"{r['steps_per_second']:,.0f}{some} | {fmt(r['x_first'], '.2f')} | {fmt(r['x_core'], '.2f')} | "
                     f"{r['learner_ms_per_update']:.0f} | {r['learner_idle']:.0%} | {r['update process']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", type=parse_variant, action="append", required=True,
                        help="LABEL=DIR[:FLAGS]: a folder of fwrl's code and the flags its runs add (repeatable; "
                             "the first is the baseline of the x columns)")
    parser.add_argument("--preset", default="popgym", help="the preset every run starts from (a variant's "
                        "flags may name their own --preset)")
    parser.add_argument("--cores", default="gru,srwm", help="comma-separated name[:key=value] specs")
    parser.add_argument("--baseline-core", default="gru", help="the core of the x BASELINE column (each variant's own)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=15.0, help="warm-up seconds per run")
    parser.add_argument("--out", type=Path, help="write the markdown table here")
    parser.add_argument("--json-path", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error(f"--rounds {args.rounds} must be >= 1, --seconds {args.seconds:g} > 0, --warmup >= 0")
    labels = [v.label for v in args.variant]
    if len(set(labels)) != len(labels):
        parser.error(f"--variant labels must differ: {', '.join(labels)}")
    cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    results: dict[tuple[str, str], list[dict]] = {(v.label, c): [] for v in args.variant for c in cores}
    for round_ in range(args.rounds):
        for core in cores:
            for variant in args.variant:
                result = measure(variant, core, args.seconds, args.warmup, args.preset)
                results[variant.label, core].append(result)
                said = result.get("error") or f"{result['steps_per_second']:,.0f} agent steps/s"
                print(f"round {round_ + 1} / {args.rounds}: {variant.label} {core}: {said}", file=sys.stderr, flush=True)
                rows = summarise(results, args.variant, cores, args.baseline_core)
                text = markdown(rows, args.variant, args)
                if args.out:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    args.out.write_text(text)
                if args.json_path:
                    args.json_path.parent.mkdir(parents=True, exist_ok=True)
                    args.json_path.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
