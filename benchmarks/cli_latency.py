"""How long the command line takes to answer: ``fwrl --help``, input errors, ``fwrl info``.

``--only TEXT`` (repeatable) times only the commands whose label contains TEXT.

Each command runs ``--repeats`` times as ``python -X importtime -m fwrl ...`` in an
empty folder, for each source tree given (``--tree LABEL=PATH``, put first on
``PYTHONPATH``; default: this repository), the trees alternating so that they
see the same machine load. The table gives the wall time (median, min, max),
the import time ``-X importtime`` reports for the top-level modules (summed),
and whether torch was imported. Benchmarks are not tests: the figures depend on
the machine and its load; compare trees measured in one run.

    python benchmarks/cli_latency.py --repeats 5 --tree before=/tmp/fwrl-before --tree after=. \\
        --json-path benchmarks/results/cli_latency.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (
    ("fwrl --help", ["--help"]),
    ("fwrl train --env atari:Pongg", ["train", "--env", "atari:Pongg"]),
    ("fwrl train --core lstmm", ["train", "--env", "memory:cue_delay", "--core", "lstmm"]),
    ("fwrl train --no-such-flag (argparse)", ["train", "--no-such-flag"]),
    ("fwrl info", ["info"]),
    # issue 39, item 5: answers that waited for torch (EMPTY_DIR: the empty folder the commands run in)
    ("fwrl train --core rdn --core-opt heads=4",
     ["train", "--env", "memory:cue_delay", "--core", "rdn", "--core-opt", "heads=4"]),
    ("fwrl evaluate EMPTY_DIR", ["evaluate", "."]),
    ("fwrl sweep --core rdnn (a typo)", ["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "rdnn"]),
    ("fwrl report EMPTY_DIR", ["report", "."]),
    ("fwrl info --probe --probe-updates 0",
     ["info", "--env", "memory:cue_delay", "--probe", "--probe-updates", "0"]),
)
TOP_LEVEL = re.compile(r"^import time:\s+\d+ \|\s+(\d+) \| (\S+)$")  # a module imported at the top level


def run_once(tree: Path, argv: list[str], cwd: str) -> dict:
    """One run: wall seconds, summed top-level import microseconds, torch imported, exit status."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "fwrl", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    wall = time.perf_counter() - began
    imports = [TOP_LEVEL.match(line) for line in proc.stderr.splitlines()]
    modules = {m.group(2): int(m.group(1)) for m in imports if m}
    torch = any(re.search(r"\|\s+torch$", line) for line in proc.stderr.splitlines())
    return {"wall_s": wall, "import_s": sum(modules.values()) / 1e6, "torch": torch, "exit": proc.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=5, help="runs per command and tree (default 5)")
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a source tree holding fwrl/ (repeatable); default: this repository")
    parser.add_argument("--json-path", metavar="PATH", help="also write every run as JSON")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="time only the commands whose label contains TEXT (repeatable)")
    args = parser.parse_args(argv)
    commands = [(name, cmd) for name, cmd in COMMANDS if not args.only or any(t in name for t in args.only)]
    trees = [(t.partition("=")[0], Path(t.partition("=")[2]).resolve()) for t in args.tree] or [("this", ROOT)]
    for label, path in trees:
        if not (path / "fwrl" / "__init__.py").is_file():
            parser.error(f"--tree {label}={path}: no fwrl/ package there")
    runs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fwrl-cli-latency-") as cwd:
        for _ in range(args.repeats):
            for name, command in commands:
                for label, path in trees:  # alternating: each tree sees the same load
                    runs.setdefault((name, label), []).append(run_once(path, command, cwd))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.repeats} runs each, {os.cpu_count()} CPUs, load average {load:.1f} at the end\n")
    print("| command | tree | wall s (median) | min | max | imports s (median) | torch imported | exit |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in commands:
        for label, _ in trees:
            rs = runs[(name, label)]
            walls = [r["wall_s"] for r in rs]
            print(f"| `{name}` | {label} | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | "
                  f"{statistics.median(r['import_s'] for r in rs):.2f} | "
                  f"{'yes' if any(r['torch'] for r in rs) else 'no'} | {rs[0]['exit']} |")
    if args.json_path:
        record = {"repeats": args.repeats, "cpus": os.cpu_count(), "load_average": load,
                  "trees": {label: str(path) for label, path in trees},
                  "runs": [{"command": name, "tree": label, **r} for (name, label), rs in runs.items() for r in rs]}
        Path(args.json_path).write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
