"""Experiment tracking in Weights & Biases (``fwrl train --wandb``, ``fwrl sweep --wandb``): an
offline run's local files hold the config, every metrics row and the ``--video-every`` videos; a missing package or login is
refused in one line before the run starts; a sweep's cells are grouped by the sweep."""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest

from cli_runs import assert_refused, run_cli
from fwrl.errors import FwrlError
from fwrl.runner import tracking

TINY = ["--num-workers", "1", "--envs-per-worker", "4", "--batch-size", "2", "--unroll-length", "8",
        "--total-steps", "96", "--log-interval", "0.2"]


def test_offline_quickstart_run_logs_the_config_and_every_metrics_row(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb_records import finished_run_file, run_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    code, _, err = run_cli(["train", "--preset", "quickstart", "--wandb", *TINY, "--runs-dir", tmp_path, "--name", "q",
                            "--video-every", "3"])
    assert code == 0, err
    run = tmp_path / "q"
    config, history = run_records(finished_run_file(run))
    import yaml

    saved = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("env", "core", "batch_size", "total_steps", "learning_rate", "wandb", "wandb_project"):
        assert config[key] == saved[key], key
    assert config["core_options"]["forget_bias"] == 1.0  # the preset's
    with (run / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 2
    logged = [h for h in history if "time" in h]  # the metrics rows, in the order they were written
    assert len(logged) == len(rows)
    for row, sent in zip(rows, logged):  # every row, each of its numbers
        numbers = {k: float(v) for k, v in row.items() if v not in ("", "nan")}
        assert set(numbers) <= set(sent), row
        for key, value in numbers.items():
            assert sent[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert (run / "wandb" / "run-id").read_text().strip() in finished_run_file(run).name
    videos = sorted(p.name for p in (run / "videos").iterdir())  # --video-every 3: once 3 (and 6) updates are done
    assert videos and all(re.fullmatch(r"update[3-6]-cue_delay-test-episode0-return[01]\.mp4", v) for v in videos)
    sent = [h for h in history if "video/cue_delay/test/_type" in h]  # a video's fields, flattened
    assert len(sent) == len(videos) and sent[0]["video/cue_delay/test/_type"] == "video-file"
    assert (run / "tensorboard").is_dir()  # unchanged beside it


def test_missing_package_or_login_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code, _, err = run_cli(["train", "--preset", "quickstart", "--wandb", "--runs-dir", tmp_path])
    assert_refused(code, err, "'wandb'", "[wandb]", one_line=True)
    monkeypatch.setattr(importlib.util, "find_spec", real)
    if real("wandb") is None:
        pytest.skip("wandb is not installed")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    code, _, err = run_cli(["train", "--preset", "quickstart", "--wandb", "--runs-dir", tmp_path / "runs"])
    assert_refused(code, err, "no W&B login", "wandb login", "WANDB_MODE=offline", one_line=True)
    monkeypatch.setenv("WANDB_MODE", "sideways")
    code, _, err = run_cli(["train", "--preset", "quickstart", "--wandb", "--runs-dir", tmp_path / "runs"])
    assert_refused(code, err, "WANDB_MODE='sideways'", "offline", one_line=True)
    assert not (tmp_path / "runs").exists()


def test_sweep_refuses_wandb_without_the_package_before_writing_its_folder(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    code, _, err = run_cli(["sweep", tmp_path / "sw", "--env", "memory:cue_delay", "--core", "lstm", "--wandb",
                            "--total-steps", "100"])
    assert_refused(code, err, "[wandb]", one_line=True)
    assert not (tmp_path / "sw").exists()


def test_a_netrc_entry_is_a_login(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_IDENTITY_TOKEN_FILE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    assert tracking._logged_in()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert not tracking._logged_in()
    if importlib.util.find_spec("wandb") is not None:
        with pytest.raises(FwrlError, match="wandb.example.org"):
            tracking.check_wandb()


def test_sweep_cells_are_grouped_by_their_sweep(tmp_path):
    sweep = tmp_path / "minatar-sweep"
    (sweep / "runs" / "cell").mkdir(parents=True)
    assert tracking.sweep_group(sweep / "runs" / "cell") == ""  # not a sweep yet: no sweep.yaml
    (sweep / "sweep.yaml").write_text("format: 1\n")
    assert tracking.sweep_group(sweep / "runs" / "cell") == "minatar-sweep"
    assert tracking.sweep_group(tmp_path / "runs" / "other") == ""


def test_sweep_passes_wandb_to_every_cell(tmp_path):
    """``fwrl sweep --wandb --wandb-project P``: every cell's config tracks its run in project P."""
    from cli_runs import tiny_sweep

    sweep = tiny_sweep(tmp_path / "sw", "--env", "memory:cue_delay", "--core", "lstm", "gru", "--wandb",
                       "--wandb-project", "mine")
    assert len(sweep.cells) == 2
    for cell in sweep.cells:
        assert cell.config.wandb and cell.config.wandb_project == "mine" and cell.config.wandb_group == ""


def test_evaluate_logs_its_table_and_videos_to_the_runs_wandb_run(tmp_path, monkeypatch):
    """``fwrl evaluate RUN`` on a run trained with --wandb continues that W&B run with the table and videos."""
    pytest.importorskip("wandb")
    from cli_runs import write_memory_checkpoint
    from wandb_records import finished_run_files, raw_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    write_memory_checkpoint(run)
    tracker = tracking.WandbTracker(run, {"env": "memory:cue_delay"}, resume=False)
    tracker.log_row({"agent_steps": 10, "time": 1.0, "mean_return": 0.5, "note": "text"})
    tracker.close()
    code, _, err = run_cli(["evaluate", run, "--episodes", "2", "--num-workers", "1", "--video", tmp_path / "v"])
    assert code == 0, err
    files = finished_run_files(run, 2)  # the training session's and evaluate's, each with its exit record
    run_id = (run / "wandb" / "run-id").read_text().strip()
    assert all(run_id in f.name for f in files)  # one W&B run, continued
    records = [r for f in files for r in raw_records(f)]
    assert any(b"evaluation/table" in r for r in records) and any(b"evaluation/video" in r for r in records)
