"""How evaluations read: ``fwrl evaluate``'s progress line (episodes played, the running mean, an
ETA), its results table without empty columns, and ``fwrl report``'s mark on an evaluation of an
earlier checkpoint than the run's last.
"""

from __future__ import annotations

import pytest

from cli_runs import run_cli, write_memory_checkpoint


def test_evaluate_shows_episodes_done_the_running_mean_and_an_eta(tmp_path):
    checkpoint = write_memory_checkpoint(tmp_path / "run")
    code, _, err = run_cli(["evaluate", checkpoint.parent, "--episodes", "6", "--repeats", "2", "--num-workers", "1",
                            "--envs-per-worker", "2", "--out", tmp_path / "e.json"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("evaluating memory:cue_delay")]
    assert lines[0].endswith("starting workers ...")
    assert any("(test, repeat 1 of 2)" in line for line in lines), err
    assert lines[-1].startswith("evaluating memory:cue_delay (test, repeat 2 of 2): 12 / 12 episodes, mean return "), err
    assert "elapsed" in lines[-1] and "ETA 0:00" in lines[-1], err


def test_evaluate_progress_eta_is_the_time_per_episode_times_those_left():
    from fwrl.evaluation.evaluate_progress import EvalProgress

    progress = EvalProgress("atari:Pong", console=None)
    progress.started = 100.0
    text = progress.text("test, repeat 1 of 5", 30, 150, -20.5, now=160.0)
    assert text == ("evaluating atari:Pong (test, repeat 1 of 5): 30 / 150 episodes, mean return -20.5, "
                    "elapsed 1:00, ETA 4:00")
    assert "mean return -, elapsed 0:05, ETA -" in progress.text("test", 0, 150, float("nan"), now=105.0)


def test_evaluation_table_drops_empty_columns():
    from fwrl.evaluation.results import shown_table

    row = {"task": "cue_delay", "split": "test", "episodes": 10, "mean": 0.5, "std": 0.5, "repeats": 1,
           "std_of_repeat_means": None, "normalised": None, "published": []}
    header, rows = shown_table({"aggregates": [row]})
    assert header == ["task", "split", "episodes", "return (mean ± sd)"], header
    header, _ = shown_table({"aggregates": [{**row, "success": 0.5, "normalised": 0.2}]})
    assert "normalised x100" in header and "success" in header and "published" not in header


def test_report_marks_an_evaluation_of_an_earlier_checkpoint_and_says_so(tmp_path):
    """Evaluated at 209,600 steps, resumed to 300,800: the report's cell is marked and the notes
    (and the terminal) say which run to evaluate again; a current evaluation is not marked."""
    import csv
    import json

    from fwrl.settings.config import TrainConfig, config_yaml

    pytest.importorskip("rliable")
    for name, evaluated_at, seed in (("stale", 209_600, 1), ("fresh", 300_800, 2)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        config = TrainConfig.from_dict({"env": "memory:cue_delay?delay=2", "core": "lstm", "seed": seed,
                                        "total_steps": 300_800})  # finished: the one mark is the stale one
        (run / "config.yaml").write_text(config_yaml(config))
        with (run / "metrics.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["time", "agent_steps", "episodes", "mean_return"])
            for i, steps in enumerate((100_000, 209_600, 300_800)):
                writer.writerow([10 * i, steps, 100 * i, 0.5 + 0.1 * i])
        (run / "evaluation.json").write_text(json.dumps({
            "checkpoint": str(run / "checkpoint.pt"), "agent_steps": evaluated_at, "env": "memory:cue_delay?delay=2",
            "episodes": 10, "repeats": 1,
            "aggregates": [{"task": "cue_delay", "split": "test", "repeats": 1, "episodes": 10, "mean": 0.6}]}))
    out = tmp_path / "out"
    code, stdout, err = run_cli(["report", tmp_path / "runs" / "stale", "--out", out, "--reps", "200",
                                 "--random-episodes", "2"])
    assert code == 0, err
    assert "209,600 agent steps" in err and "300,800" in err and "fwrl evaluate" in err, err
    assert "‡" in stdout, stdout
    report = json.loads((out / "report.json").read_text())
    (score,) = report["runs"][0]["scores"].values()
    assert score["stale"] is True and score["agent_steps"] == 209_600 and score["run_agent_steps"] == 300_800
    assert any("209,600" in note for note in report["notes"])
    assert "‡" in (out / "report.md").read_text()

    code, stdout, err = run_cli(["report", tmp_path / "runs" / "fresh", "--out", tmp_path / "out2", "--reps", "200",
                                 "--random-episodes", "2"])
    assert code == 0, err
    assert "‡" not in stdout and "agent steps" not in err
