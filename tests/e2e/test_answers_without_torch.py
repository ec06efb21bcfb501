"""Answers that come before the heavy imports: a typo, a bad core option, a refused stem, a run
folder without a checkpoint and ``fwrl info``'s lists answer without importing torch (``fwrl
report``'s refusal without rliable), from the shipped core catalogue, which must be the registry's.

The commands run through ``fwrl.launch.cli.main`` in a fresh interpreter, where the import graph
is the point; the catalogue is checked against the registry in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cli_in_subprocess(argv: list, cwd: Path, heavy: str = "torch") -> tuple[int, str, bool]:
    """``main(argv)`` in a fresh interpreter: (exit status, stderr, whether module ``heavy`` was imported)."""
    script = textwrap.dedent(f"""
        import sys
        from fwrl.launch.cli import main
        code = main({[str(a) for a in argv]!r})
        print("IMPORTED=" + str({heavy!r} in sys.modules))
        sys.exit(code)
    """)
    environ = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stderr, "IMPORTED=True" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["train", "--env", "atari:Pongg"], "unknown atari game 'Pongg'. Did you mean Pong"),
    (["train", "--env", "memory:cue_delay", "--core", "lstmm"], "unknown core 'lstmm'; valid choices:"),
    (["train", "--env", "atarii:Pong"], "unknown env family 'atarii'"),
    (["bench", "throughput", "--env", "memory:cue_delai"], "unknown memory game 'cue_delai'"),
    (["info", "--env", "memory:cue_delay", "--core", "rdnn"], "unknown core 'rdnn'"),
])
def test_a_typo_is_reported_without_importing_torch(argv, message, tmp_path):
    if any(a.startswith("atari:") for a in argv):
        pytest.importorskip("ale_py")
    code, err, torch_imported = cli_in_subprocess(argv, tmp_path)
    assert code == 2 and message in err, err
    assert len(err) < 400, f"a {len(err)}-character message for one typo: {err[:200]}..."  # not 104 game names
    assert not torch_imported, "torch was imported before the typo was reported"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, message, heavy", [
    (["train", "--env", "memory:cue_delay", "--core", "rdn", "--core-opt", "heads=4"],
     "unknown core option 'heads' of core rdn; valid choices:", "torch"),
    (["train", "--env", "memory:cue_delay", "--core", "rdn", "--core-opt", "head_dim=-1"],
     "core option head_dim=-1 of core rdn is not valid", "torch"),
    (["evaluate", "."], "holds no checkpoint.pt", "torch"),
    (["inspect", "."], "holds no checkpoint.pt", "torch"),
    (["sweep", "sw", "--env", "memory:cue_delay", "--core", "lstm", "rdnn"], "unknown core 'rdnn' in sweep cell",
     "torch"),
    (["report", "."], "holds no runs", "rliable"),
    (["info", "--env", "memory:cue_delay", "--probe", "--probe-updates", "0"], "--probe-updates 0 is not valid",
     "torch"),
])
def test_these_answers_come_without_the_heavy_imports(argv, message, heavy, tmp_path):
    """README: input errors answer before torch is imported (about a second); report before rliable."""
    code, err, imported = cli_in_subprocess(argv, tmp_path, heavy)
    assert code == 2 and message in err, err
    assert not imported, f"{heavy} was imported before the answer"
    assert list(tmp_path.iterdir()) == []


def test_train_refuses_the_stem_before_importing_torch(tmp_path):
    pytest.importorskip("minatar")
    code, err, torch_imported = cli_in_subprocess(["train", "--env", "minatar:breakout", "--stem", "nature"],
                                                  tmp_path)
    assert code == 2 and "stem 'nature' does not fit" in err, err
    assert not torch_imported
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["info"], ["info", "--cores"], ["info", "--presets"]])
def test_info_lists_the_cores_without_importing_torch(tmp_path, argv):
    """``fwrl info`` alone: a line per core and the presets (30 lines, not 574); ``--cores``: every option.
    Printed into a pipe, the tables keep every row on one line at their natural width (rich draws 80
    columns off a terminal: headers cut to ``step…``, envs cut)."""
    script = textwrap.dedent(f"""
        import sys
        from fwrl.launch.cli import main
        code = main({argv!r})
        print("TORCH_IMPORTED=" + str("torch" in sys.modules))
        sys.exit(code)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH_IMPORTED=False" in proc.stdout
    lines = proc.stdout.splitlines()
    if argv == ["info", "--cores"]:
        assert "rdn:" in proc.stdout and "head_dim" in proc.stdout
    else:
        assert "meaning" not in proc.stdout and len(lines) < 60  # no option tables
        assert any(line.startswith("│ memory:cue_delay?delay=10") or "│ memory:cue_delay?delay=10 " in line
                   for line in lines)  # the quickstart preset's env, whole
    if argv == ["info"]:
        assert any(line.startswith("│ rdn ") for line in lines) and "fwrl info --cores" in proc.stdout


def test_core_catalogue_is_the_registrys():
    """The shipped catalogue (fwrl info, the --core check) matches the registry; after changing a core
    or its options, write it again: python -m fwrl.settings.core_catalog."""
    from fwrl.settings import core_catalog

    shipped = json.loads(core_catalog.CATALOGUE.read_text())
    live = core_catalog.live_catalogue()
    assert shipped == live, (
        "fwrl/settings/core_catalog.json is stale: run python -m fwrl.settings.core_catalog")


def test_the_catalogue_checks_core_options_as_the_registry_does():
    """Every option of every core: a bad value gets the registry's own message from the catalogue."""
    from fwrl.errors import FwrlError
    from fwrl.settings.core_catalog import check_core_options
    from fwrl.memory_modules import core_config_class, core_names

    def message(check) -> str | None:
        try:
            check()
        except FwrlError as exc:
            return str(exc)
        return None

    for core in core_names():
        cls = core_config_class(core)
        for name in [*cls.model_fields, "heads"]:
            for value in ("abc", "-1", "2.5", "nan", "0", "1.5", "softmaxx", True):
                real = message(lambda: cls.from_options({name: value}, core=core))
                ours = message(lambda: check_core_options(core, {name: value}))
                assert ours == real or (ours is None and "split the hidden vector" in str(real)), (core, name, value)
