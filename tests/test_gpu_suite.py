"""The GPU suite (benchmarks/gpu/) in its dry run: the same code at tiny sizes on the CPU, so it
cannot rot between GPU runs. Each part must leave its report, CSV, PNG and JSON, headed by the
run's metadata, in at most 8 files (what the device tool brings back)."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("ale_py", reason="the learner and pong parts step Atari Pong (pip install 'fwrl[atari]')")


def _dry_run(part: str, out: Path) -> Path:
    env = {**os.environ, "PYTHON": sys.executable, "FWRL_COMMIT": "test", "FWRL_SITE": str(out / "site")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run", part, str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = out / part
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) <= (11 if part == "pong" else 8), files  # nothing stray
    expected = [f"{part}{suffix}" for suffix in (".md", ".png", ".json", ".log")]
    expected.append("metrics.csv" if part == "pong" else f"{part}.csv")  # pong keeps the run's metrics.csv
    assert set(expected) <= set(files), files
    meta = json.loads((folder / f"{part}.json").read_text())["meta"]
    assert meta["commit"] == "test" and meta["dry_run"] is True and meta["torch"]
    report = (folder / f"{part}.md").read_text()
    assert "commit `test`" in report and "Dry run" in report
    assert (folder / f"{part}.png").stat().st_size > 1000
    return folder


@pytest.mark.slow
def test_learner_part_dry_run(tmp_path):
    folder = _dry_run("learner", tmp_path)
    with (folder / "learner.csv").open() as f:
        f.readline()  # the metadata line
        rows = list(csv.DictReader(f))
    # the CUDA-graph rows ("lstm graph", "rdn graph") need a GPU: the dry run leaves them out
    assert [r["core"] for r in rows] == ["lstm", "rdn", "lstm x8", "rdn x8", "delta_net", "srwm", "elstm rtrl"]
    assert [int(r["envs_per_worker"]) for r in rows] == [1, 1, 2, 2, 1, 1, 1]  # the dry run's widths
    for row in rows:
        assert float(row["agent_steps_per_s"]) > 0 and 0 < float(row["of_ceiling"]) < 1.5, row
    data = json.loads((folder / "learner.json").read_text())
    assert sorted(data["env_ceilings"]) == ["1", "2"]  # each width's rows against their own ceiling
    assert len(data["goals"]) == 4 and {g["met"] for g in data["goals"]} <= {"yes", "NO"}  # both widths
    assert "at 2 envs per worker" in (folder / "learner.md").read_text()
    profile = (folder / "learner-profile-lstm.md").read_text()  # the lstm row's acting thread, op by op
    assert "fwrl/inference_forward" in profile and "aten::" in profile
    assert "learner-profile-lstm.md" in (folder / "learner.md").read_text()
    two = data["two_learner_ranks"]
    assert two["two_ranks"]["allreduce_ms"] > 0 and two["one_rank"]["update_ms"] > 0


@pytest.mark.slow
def test_pong_part_dry_run(tmp_path):
    folder = _dry_run("pong", tmp_path)
    summary = json.loads((folder / "pong.json").read_text())
    assert summary["final"] is not None and summary["final"][1] > 0  # agent steps were trained
    assert summary["evaluation_mean"] is not None and -21 <= summary["evaluation_mean"] <= 21
    assert (folder / "evaluation.md").exists() and (folder / "metrics.csv").exists()
    assert (folder / "entropy.png").stat().st_size > 1000 and (folder / "grad_norm.png").stat().st_size > 1000
    first, last = summary["entropy_first_last"]
    assert 0 < first[1] <= 1.7918 and 0 < last[1] <= 1.7918  # nats per step, at most ln 6
    assert summary["grad_norm_first_max_last"][1] > 0
    probe = summary["init_probe"]
    assert probe["init_grad_norm"] > 0 and len(probe["entropy"]) == 2
    assert "Init probe" in (folder / "pong.md").read_text()


def test_kernels_part_dry_run(tmp_path):
    folder = _dry_run("kernels", tmp_path)
    data = json.loads((folder / "kernels.json").read_text())
    assert "passed" in data["tests"]
    cores = {row["core"] for row in data["rows"] if row.get("fwd_bwd_ms")}
    assert cores == {"delta_rule", "srwm", "rdn", "delta_rnn", "delta_lstm", "sr_delta_net"}
    assert any(g["goal"].startswith("delta_rule") for g in data["goals"])
