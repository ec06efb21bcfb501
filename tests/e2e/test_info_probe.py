"""``fwrl info --probe``: the init probe's figures written as JSON (``--json-path``), a reference
core probed on the same batch (``--probe-reference``), and the flags that need ``--probe``.
"""

from __future__ import annotations

import json

from cli_runs import assert_refused, run_cli


def test_info_probe_writes_its_figures_to_json(tmp_path):
    """``fwrl info --probe --json-path``: the probe's settings and figures, for scripts (the GPU suite)."""
    out = tmp_path / "probe" / "rdn.json"
    code, stdout, err = run_cli(["info", "--env", "memory:cue_delay?delay=3", "--core", "rdn", "--probe",
                                 "--probe-updates", "2", "--batch-size", "2", "--unroll-length", "6",
                                 "--json-path", out])
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["settings"]["core"] == "rdn" and data["settings"]["batch_size"] == 2
    assert data["settings"]["updates"] == 2 and len(data["entropy"]) == 2 == len(data["value_error"])
    assert data["init_grad_norm"] > 0 and data["first_logit_change"] > 0
    assert f"{data['init_grad_norm']:.3g}" in stdout.replace(",", "")
    assert [p.name for p in out.parent.iterdir()] == ["rdn.json"]


def test_info_probe_says_its_progress_as_it_goes(monkeypatch):
    """A large probe (many envs, a slow env) is never silent for minutes: a line as each phase starts (the envs
    made, the warm-up, acting, the updates) and one every few seconds within it."""
    import time

    from fwrl.launch import cli

    code, _, err = run_cli(["info", "--env", "memory:cue_delay?delay=3", "--probe", "--probe-updates", "2",
                            "--batch-size", "3", "--unroll-length", "4"])
    assert code == 0, err
    for line in ("probe: envs made 1 of 3", "probe: warm-up steps 1 of 100", "probe: acting steps 1 of 5",
                 "probe: updates 1 of 2"):
        assert line in err, err
    clock = iter([0.0, 1.0, 6.0, 7.0])  # within a phase: a line once 5 s passed
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    said = []
    progress = cli.ProbeProgress(out=type("Out", (), {"write": lambda self, text: said.append(text),
                                                      "flush": lambda self: None})())
    for done in range(1, 5):
        progress("envs made", done, 4)
    assert [line for line in "".join(said).splitlines()] == ["probe: envs made 1 of 4", "probe: envs made 3 of 4"]


def test_info_probe_reference_probes_a_second_core_on_the_same_batch(tmp_path):
    """``--probe-reference lstm``: the LSTM probed too, and each figure printed as a multiple of its."""
    out = tmp_path / "rdn.json"
    code, stdout, err = run_cli(["info", "--env", "memory:cue_delay?delay=3", "--core", "rdn", "--probe",
                                 "--probe-updates", "1", "--batch-size", "2", "--unroll-length", "6",
                                 "--probe-reference", "lstm", "--json-path", out])
    assert code == 0, err
    data = json.loads(out.read_text())
    reference = data["reference"]
    assert reference["core"] == "lstm" and data["settings"]["core"] == "rdn"
    assert reference["init_grad_norm"] > 0 and reference["init_grad_norm"] != data["init_grad_norm"]
    assert "reference init probe: memory:cue_delay?delay=3 / lstm / B 2, T 6" in stdout
    ratio = data["init_grad_norm"] / reference["init_grad_norm"]
    assert f"gradient norm: {reference['init_grad_norm']:.4g} -> {ratio:.2g}x" in stdout, stdout
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--probe", "--probe-reference", "lsmt"])
    assert_refused(code, err, "'lsmt'", "lstm", "rdn")
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--probe-reference", "lstm"])
    assert_refused(code, err, "--probe-reference", "--probe")


def test_info_json_path_needs_probe(tmp_path):
    code, _, err = run_cli(["info", "--env", "memory:cue_delay", "--json-path", tmp_path / "p.json"])
    assert_refused(code, err, "--json-path", "--probe")
    assert not (tmp_path / "p.json").exists()
