"""README.md says what the CLI does: its commands parse, its option lists are the real ones,
and CI runs its test command."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from fwrl.launch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def readme_commands() -> list[list[str]]:
    """Every ``fwrl <command> ...`` line of README's bash blocks, as argv (comments cut)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line.startswith("fwrl "):
                commands.append(shlex.split(line)[1:])
    return commands


def parser_options(*command: str) -> set[str]:
    parser = build_parser()
    for name in command:
        parser = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    return {s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_readme_commands_parse():
    from fwrl.launch.bench.kernels import _parser as kernel_bench_parser

    commands = readme_commands()
    assert len(commands) > 15
    for argv in commands:
        args, unknown = build_parser().parse_known_args(argv)
        if argv[:2] == ["bench", "kernels"]:  # its options belong to fwrl.launch.bench.kernels
            kernel_bench_parser().parse_args(unknown)
        else:
            assert not unknown, argv


def test_readme_lists_the_real_options_of_info_evaluate_and_plot():
    for command, heading in [("info", "### `fwrl info`"), ("evaluate", "### `fwrl evaluate`"),
                             ("plot", "### `fwrl plot`")]:
        section = README.split(heading, 1)[1].split("\n### ", 1)[0]
        listed = set(re.findall(r"`(--[a-z-]+)", section.split("Options: ", 1)[1].split(".", 1)[0]))
        assert listed == parser_options(command), command


def test_readme_flag_table_names_real_train_flags():
    section = README.split("### `fwrl train`", 1)[1].split("\n### ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `--"))
    listed = set(re.findall(r"`(--[a-z-]+)", table))
    real = parser_options("train")
    assert listed <= real, listed - real
    assert real - listed <= {f"--no-{flag[2:]}" for flag in listed}, real - listed


def test_ci_runs_the_readme_test_command_in_a_fresh_virtualenv():
    script = (ROOT / ".ci" / "run").read_text()
    assert "-m venv" in script and "/bin/activate" in script
    extract = next(line for line in script.splitlines() if line.startswith("COMMAND="))
    found = subprocess.run(["bash", "-c", f'{extract}; printf %s "$COMMAND"'], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    block = README.split("**Run the tests on a fresh machine**", 1)[1].split("```bash\n", 1)[1].split("\n```")[0]
    assert found == block.strip() and found.endswith("python -m pytest")


def test_docs_cite_the_papers_and_files_a_user_has():
    """Docstrings, messages, tests and docs cite the papers and PAPERS.md, never the developers' notes
    outside the repository (shared/REFERENCE.md, shared/ARCHITECTURE.md), which a user does not have;
    checked in every tracked text file under fwrl/, tests/, benchmarks/ (results included) and docker/
    and in README.md, ARCHITECTURE.md and PAPERS.md. Every ``PAPERS.md §N`` they name exists, every
    ``.md`` file fwrl's messages and docstrings name exists, and README's ``(#anchor)`` links are its
    headings."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    if not tracked:
        import pytest

        pytest.skip("not a git checkout")
    outside = re.compile(r"REFERENCE §|REFERENCE\.md|shared/REFERENCE|\.\./shared/|shared/ARCHITECTURE")
    found, sections, named = [], set(), set()
    for name in tracked:
        if not (name.startswith(("fwrl/", "tests/", "benchmarks/", "docker/"))
                or name in ("README.md", "ARCHITECTURE.md", "PAPERS.md")) or name == "tests/unit/test_readme.py":
            continue
        data = (ROOT / name).read_bytes() if (ROOT / name).is_file() else b""
        if b"\0" in data[:8192]:
            continue  # images and other binaries
        text = data.decode(errors="replace")
        found += [f"{name}: {m.group(0)}" for m in outside.finditer(text)]
        sections |= set(re.findall(r"PAPERS\.md §(\d)", text))
        if name.startswith("fwrl/"):
            named |= {path for path in re.findall(r"[\w./-]+\.md\b", text)
                      if "/" in path or path in ("README.md", "ARCHITECTURE.md", "PAPERS.md")}
    assert not found, "citations of files outside the repository:\n" + "\n".join(found)
    papers = (ROOT / "PAPERS.md").read_text()
    assert sections and all(f"## §{n} " in papers for n in sections), sorted(sections)
    assert not [path for path in named if not (ROOT / path).is_file()], sorted(named)
    headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                for line in re.sub(r"```.*?```", "", README, flags=re.S).splitlines() if re.match(r"#+ ", line)}
    links = set(re.findall(r"\]\(#([^)]+)\)", README))
    assert links and links <= headings, sorted(links - headings)


def test_pointers_into_architecture_md_name_its_sections():
    """``(ARCHITECTURE.md, <section>)`` in the code names a section heading that exists."""
    headings = {line.lstrip("#").strip() for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines()
                if line.startswith("## ")}
    pointer = re.compile(r"ARCHITECTURE\.md, ([A-Z][^).:]*)")
    wrong = [f"{path.relative_to(ROOT)}: {name!r}" for path in sorted((ROOT / "fwrl").rglob("*.py"))
             for name in pointer.findall(path.read_text()) if name.strip() not in headings]
    assert not wrong, f"sections that ARCHITECTURE.md does not have ({sorted(headings)}): {wrong}"


def test_the_quickstarts_rfwp_atari_example_says_what_machine_it_needs():
    """The rfwp-atari preset is 48 env workers and the papers' batch: README's example of it says it is for a
    GPU box with many cores, and names the preset for a CPU."""
    from fwrl.settings.config import load_preset

    assert load_preset("rfwp-atari")["num_workers"] >= 32
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    before, example, after = quickstart.partition("--preset rfwp-atari")
    assert example, "the quickstart's rfwp-atari example"
    near = before[-400:] + after[:400]
    assert "GPU" in near and "--preset pong-cpu" in near, near


def test_the_feature_maps_readme_lists_are_each_cores_own():
    """README's list of feature maps per fast-weight core is the catalogue's: cores that take softmax alone are
    named as such, not offered elu1_sumnorm and dpfp."""
    from fwrl.settings.core_catalog import catalogue

    choices = {core["name"]: option["valid"] for core in catalogue()["cores"] for option in core["options"]
               if option["name"] == "feature_map"}
    only_softmax = sorted(name for name, valid in choices.items() if valid == "one of softmax")
    assert only_softmax and len(only_softmax) < len(choices)
    section = README.split("## Memory cores", 1)[1].split("\n## ", 1)[0]
    sentence = section.split("`feature_map`", 1)[1].split(" and `grad_mode`", 1)[0]
    softmax_part = sentence.split("softmax` only", 1)
    assert len(softmax_part) == 2, sentence
    named = set(re.findall(r"`([a-z_]+)`", softmax_part[1].split(")", 1)[0]))
    assert named == set(only_softmax), (named, only_softmax)
    others = set(re.findall(r"`([a-z_]+)`", softmax_part[0]))
    assert others & set(choices) == set(choices) - set(only_softmax), others
