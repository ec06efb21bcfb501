"""A popgym run through the command line, as a researcher starts one: ``fwrl train --preset popgym
--env popgym:RepeatPrevious``, then ``fwrl report`` scores it by POPGym's MMER from its metrics.csv
(a few seconds of training on a 2-core CPU)."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("popgym", reason="needs POPGym (pip install -e '.[popgym]')")

CLI = [sys.executable, "-m", "fwrl.launch.cli"]


def test_train_a_popgym_task_then_report_its_mmer(tmp_path):
    train = subprocess.run([*CLI, "train", "--preset", "popgym", "--env", "popgym:RepeatPrevious", "--total-steps",
                            "5000", "--log-interval", "0.5", "--runs-dir", str(tmp_path), "--name", "rp"],
                           capture_output=True, text=True, timeout=120)
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    assert "stopped by budget" in train.stdout
    run = tmp_path / "rp"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["env"], config["core"], config["stem"]) == ("popgym:RepeatPrevious", "gru", "mlp")
    with (run / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["mean_return"] not in ("", "nan")]
    assert rows, "no episode ended in 5,000 steps of 51-step episodes (78 per env of the preset's 64)"
    means = [float(r["mean_return"]) for r in rows]
    assert all(-1 <= m <= 1 for m in means) and [float(r["normalised_return"]) for r in rows] == means

    pytest.importorskip("rliable", reason="fwrl report needs rliable (pip install -e '.[report]')")
    report = subprocess.run([*CLI, "report", str(run), "--out", str(tmp_path / "report"), "--reps", "200"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-3000:]
    result = json.loads((tmp_path / "report" / "report.json").read_text())
    (scored,) = result["runs"]
    score = scored["scores"]["popgym:RepeatPrevious"]
    assert score["source"] == "mmer" and math.isclose(score["value"], max(means))  # fewer than 100 episodes: all rows
    assert "popgym:RepeatPrevious: MMER over means of fewer than 100 episodes" in " ".join(result["notes"])
    assert "(n=1, MMER)" in report.stdout
