"""No ``--help`` names a commit: every ``fwrl`` command's help (each subcommand, ``fwrl bench kernels``' own
parser, the sweep's cell runner) and what every benchmark script prints for ``--help``. A help text says what
a flag does; a measurement's commit belongs in its results file (``benchmarks/results/``), where a commit
dates a figure."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

from fwrl.launch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]

# a git commit as people quote it: 7 to 40 hex digits, at least one a digit and one a letter (so neither a
# number such as 1000000 nor a word such as "defaced" is taken for one)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def commits_in(text: str) -> list[str]:
    return COMMIT.findall(text)


def test_the_commit_pattern_tells_commits_from_numbers_and_words():
    assert commits_in("measured at 2d31ea9 and 971d846, against e9041c2b0f") == ["2d31ea9", "971d846", "e9041c2b0f"]
    assert commits_in("10000000 steps, a defaced cafe, 0xdeadbeef, 1e-3, 64x64, 2026-11-30") == []


def parsers(parser: argparse.ArgumentParser, name: str = "fwrl"):
    """``parser`` and every subcommand's parser under it, with the command line that shows each one's help."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from parsers(child, f"{name} {sub}")


def test_no_fwrl_help_names_a_commit():
    from fwrl.launch.bench.kernels import _parser as kernel_bench_parser
    from fwrl.launch.sweep import cell

    helps = {name: p.format_help() for name, p in parsers(build_parser())}
    helps["fwrl bench kernels (its own options)"] = kernel_bench_parser().format_help()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cell.main(["--help"])
    helps["python -m fwrl.launch.sweep.cell"] = out.getvalue()
    assert len(helps) > 10 and all(helps.values())
    found = {name: commits_in(text) for name, text in helps.items() if commits_in(text)}
    assert not found, f"--help texts naming commits: {found}"


# Runs each script as ``python SCRIPT --help`` would, in one process (torch imported once): what it printed
# on stdout and stderr, per script, as JSON.
HELP_OF_EVERY_SCRIPT = r"""
import contextlib, io, json, runpy, sys
printed = {}
for script in sys.argv[1:]:
    out = io.StringIO()
    sys.argv = [script, "--help"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")
    printed[script] = out.getvalue()
sys.__stdout__.write(json.dumps(printed))
"""


def test_no_benchmark_scripts_help_names_a_commit():
    """Every script under benchmarks/ that runs as a program (``if __name__ == "__main__"``), with ``--help``:
    its argparse description and flag help, or the usage text it prints instead."""
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py")
                     if 'if __name__ == "__main__"' in p.read_text())
    assert len(scripts) > 15
    done = subprocess.run([sys.executable, "-c", HELP_OF_EVERY_SCRIPT, *scripts], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)
    assert sorted(printed) == scripts and sum("usage:" in text for text in printed.values()) > 10
    found = {script: commits_in(text) for script, text in printed.items() if commits_in(text)}
    assert not found, f"--help of benchmark scripts naming commits: {found}"
