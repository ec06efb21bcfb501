"""A run folder's files after damage, kills and edits (issue 55, items 3, 4 and 6): metrics.csv rows
cut short or glued together, a garbled header, rows a killed run wrote after its checkpoint (kept by
the order they were written, not by their step count), a new run in a dead run's folder, and a
config.yaml edited before a resume."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

import pytest
import torch
import yaml

from cli_runs import run_cli
from fwrl.runner.rundir import MetricsCSV
from fwrl.utils.metrics_file import read_metrics_file

TINY = ["--env", "memory:cue_delay?delay=3", "--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1",
        "--envs-per-worker", "4", "--batch-size", "4", "--unroll-length", "5", "--log-interval", "0.2",
        "--num-threads", "1", "--device", "cpu"]


def rows(path) -> list[dict]:
    return read_metrics_file(path).rows


def _write(path, steps_list):
    metrics = MetricsCSV(path)
    for steps in steps_list:
        metrics.write({"time": steps / 10, "agent_steps": steps, "episodes": steps // 10, "mean_return": 0.5})
    return metrics


def test_a_row_cut_short_is_dropped_and_the_next_row_starts_on_its_own_line(tmp_path):
    path = tmp_path / "metrics.csv"
    _write(path, (100, 200, 300))
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # a kill in the middle of the last row's write
    assert read_metrics_file(path).torn_last_line
    metrics = MetricsCSV(path)  # the next writer repairs the tail first
    assert metrics.repaired == 1 and metrics.rows == 2
    metrics.write({"time": 40.0, "agent_steps": 400, "episodes": 40, "mean_return": 0.5})
    table = read_metrics_file(path)
    assert not table.damaged_rows
    assert [r["agent_steps"] for r in table.rows] == ["100", "200", "400"]
    assert [r["episodes"] for r in table.rows] == ["10", "20", "40"]  # no row of 272,512 steps/s glued together


def test_rows_glued_together_are_left_out_by_readers(tmp_path):
    path = tmp_path / "metrics.csv"
    _write(path, (100, 200))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1].rstrip("\n") + lines[2])  # an old writer's torn row with the next glued on
    table = read_metrics_file(path)
    assert table.rows == [] and table.malformed_rows == 1
    code, _, err = run_cli(["plot", str(tmp_path), "--out", str(tmp_path / "p.png")])
    assert code == 2 and err.count("left out 1 damaged row(s)") == 1, err  # said, not drawn as a wild row


@pytest.mark.parametrize("header", ["agent_st\x00eps,time\n", "time,episodes\n", "time,time,agent_steps\n"])
def test_a_garbled_header_is_refused_in_one_line_by_resume_and_plot(tmp_path, header):
    runs = ["--runs-dir", tmp_path, "--name", "g"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *runs])[0] == 0
    path = tmp_path / "g" / "metrics.csv"
    text = path.read_text()
    path.write_text(header + text.split("\n", 1)[1])
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 200])
    assert code == 2 and "Traceback" not in err, err
    assert f"{path} is not a metrics.csv fwrl wrote: its header is damaged" in err, err
    code, _, err = run_cli(["plot", str(tmp_path / "g"), "--out", str(tmp_path / "p.png")])
    assert code == 2 and "its header is damaged" in err and len(err.strip().splitlines()) == 1, err


def test_resume_keeps_the_rows_written_before_the_checkpoint_by_their_order(tmp_path):
    """Rows a killed run wrote after its checkpoint are dropped even where their step count is not
    past the checkpoint's (an evaluation row, a row of the same update): time and episodes never go
    backwards, and no step count repeats."""
    runs = ["--runs-dir", tmp_path, "--name", "k"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *runs])[0] == 0
    payload = torch.load(tmp_path / "k" / "checkpoint.pt", weights_only=True)
    saved, written = payload["agent_steps"], payload["progress"]["metrics_rows"]
    path = tmp_path / "k" / "metrics.csv"
    assert written == len(rows(path))  # the final row is written before the final checkpoint, which counts it
    metrics = MetricsCSV(path)  # what a run killed after its checkpoint left: rows at the checkpoint's steps
    metrics.write({"time": 999.0, "agent_steps": saved, "episodes": 99999, "updates": 77})
    metrics.write({"time": 999.5, "agent_steps": saved, "eval/test/mean_return": 1.0})
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", saved + 100])
    assert code == 0, err
    assert f"dropped 2 row(s) of {path}" in err, err
    kept = rows(path)
    assert all(r["updates"] != "77" and r.get("eval/test/mean_return", "") == "" for r in kept), kept
    times = [float(r["time"]) for r in kept]
    episodes = [int(r["episodes"]) for r in kept]
    assert times == sorted(times) and episodes == sorted(episodes), kept


def test_tensorboard_hides_the_events_a_killed_run_wrote_after_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard events need the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = ["--runs-dir", tmp_path, "--name", "t"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *runs])[0] == 0
    saved = torch.load(tmp_path / "t" / "checkpoint.pt", weights_only=True)["agent_steps"]
    from torch.utils.tensorboard import SummaryWriter

    killed = SummaryWriter(str(tmp_path / "t" / "tensorboard"))  # a session killed after the checkpoint
    killed.add_scalar("mean_return", 123.0, saved + 1000)
    killed.close()
    assert run_cli(["train", "--resume", *runs, "--total-steps", saved + 40])[0] == 0
    events = EventAccumulator(str(tmp_path / "t" / "tensorboard"))
    events.Reload()
    assert all(e.value != 123.0 for e in events.Scalars("mean_return"))


def test_around_a_resume_no_step_repeats_and_tensorboard_keeps_no_killed_points_at_the_checkpoint(tmp_path):
    """The resumed session writes no row at its checkpoint's step (the previous session's final row holds it; at
    9f18864 the resumed run's first row repeated it at steps_per_second 0), and TensorBoard drops what a killed
    session wrote at the checkpoint's step too (at 9f18864 it purged from the step after), keeping the rows
    metrics.csv keeps there."""
    pytest.importorskip("tensorboard", reason="TensorBoard events need the tensorboard package")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    runs = ["--runs-dir", tmp_path, "--name", "s"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *runs])[0] == 0
    saved = torch.load(tmp_path / "s" / "checkpoint.pt", weights_only=True)["agent_steps"]
    killed = SummaryWriter(str(tmp_path / "s" / "tensorboard"))  # a session killed after the checkpoint
    killed.add_scalar("mean_return", 123.0, saved)
    killed.close()
    time.sleep(1.1)  # event files sort by their second, then by a counter this process shares: a later second
    assert run_cli(["train", "--resume", *runs, "--total-steps", saved + 100])[0] == 0
    steps = [int(r["agent_steps"]) for r in rows(tmp_path / "s" / "metrics.csv")]
    after = steps[steps.index(saved) + 1:]
    assert steps.count(saved) == 1 and after and min(after) > saved, steps
    events = EventAccumulator(str(tmp_path / "s" / "tensorboard"))
    events.Reload()
    at_saved = [e.value for e in events.Scalars("mean_return") if e.step == saved]
    kept = [float(r["mean_return"]) for r in rows(tmp_path / "s" / "metrics.csv")
            if int(r["agent_steps"]) == saved and r["mean_return"] not in ("", "nan")]
    assert 123.0 not in at_saved and at_saved == pytest.approx(kept), (at_saved, kept)


def test_rows_glued_inside_the_file_are_said_as_such_not_as_the_end(tmp_path, capsys):
    from fwrl.runner.run_metrics import MetricsSink

    path = tmp_path / "metrics.csv"
    _write(path, (100, 200, 300, 400))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1] + lines[2].rstrip("\n") + lines[3] + lines[4])  # rows 200 and 300 glued
    sink = MetricsSink(tmp_path, None, resumed={"agent_steps": 400, "metrics_rows": 2})
    sink.close()
    err = capsys.readouterr().err
    assert "dropped 1 damaged row(s)" in err and "rows glued together" in err and "at the end" not in err, err
    assert [r["agent_steps"] for r in rows(path)] == ["100", "400"]


def test_a_resume_leaves_a_live_writers_temporary_file_and_removes_a_dead_ones(tmp_path):
    """A resume cleans the run folder of temporary files killed writes left, but not the one of a write in
    progress in another live process (fwrl evaluate writing evaluation.json: at 9f18864 its file was removed
    and its evaluation lost)."""
    import subprocess
    import sys

    from fwrl.runner.rundir import RunDir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env: memory:cue_delay\n")
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from fwrl.utils.files import atomic_write\n"
        "def slow(f):\n    f.write(b'{}'); f.flush(); print('writing', flush=True); sys.stdin.readline()\n"
        f"atomic_write(Path({str(run / 'evaluation.json')!r}), slow)\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / f".checkpoint.pt.{dead.stdout.strip()}.abc123.tmp").write_bytes(b"half")  # a killed write's
    (run / ".metrics.csv.k1lled_.tmp").write_bytes(b"half")  # an older fwrl's, without its writer's pid
    live = [p for p in run.glob(".evaluation.json.*.tmp")]
    assert len(live) == 1
    RunDir(run).prepare(resume=True)
    assert sorted(p.name for p in run.glob(".*.tmp")) == [live[0].name]
    writer.communicate("done\n", timeout=60)
    assert writer.returncode == 0 and (run / "evaluation.json").read_text() == "{}"


def test_a_new_run_in_the_folder_of_a_run_killed_before_its_first_checkpoint_starts_its_own_metrics(tmp_path):
    run = tmp_path / "d"
    run.mkdir()
    _write(run / "metrics.csv", (1000, 2000, 3000))  # a dead run's rows, and no checkpoint
    code, _, err = run_cli(["train", *TINY, "--total-steps", 60, "--runs-dir", tmp_path, "--name", "d"])
    assert code == 0, err
    assert "removed the metrics a run killed before its first checkpoint left" in err, err
    steps = [int(r["agent_steps"]) for r in rows(run / "metrics.csv")]
    assert steps and max(steps) <= 100 and steps == sorted(steps), steps


def test_an_edited_config_is_refused_on_resume_unless_accepted_and_then_recorded(tmp_path):
    runs = ["--runs-dir", tmp_path, "--name", "e"]
    assert run_cli(["train", *TINY, "--total-steps", 60, *runs])[0] == 0
    path = tmp_path / "e" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    lr = config["learning_rate"]
    config["learning_rate"] = 0.5  # plausible values, edited by hand
    config["env"] = "memory:cue_delay?delay=4"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 120])
    assert code == 2 and "Traceback" not in err, err
    assert "was edited since its checkpoint was written" in err and f"learning_rate {lr!r} -> 0.5" in err, err
    assert "env 'memory:cue_delay?delay=3' -> 'memory:cue_delay?delay=4'" in err, err
    assert "--accept-config-edits" in err and not (tmp_path / "e" / "config-edits.log").exists()

    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 120, "--accept-config-edits"])
    assert code == 0, err
    log = (tmp_path / "e" / "config-edits.log").read_text()
    assert f"learning_rate {lr!r} -> 0.5" in log and "resumed on an edited config.yaml" in log
    trained = torch.load(tmp_path / "e" / "checkpoint.pt", weights_only=True)["config"]
    assert trained["learning_rate"] == 0.5  # the checkpoint now holds what it was trained on
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", 160])  # no edit left to accept
    assert code == 0, err


def test_a_checkpoint_of_another_run_is_refused_on_resume_naming_both_runs(tmp_path):
    """A donor run's checkpoint copied into a host run's folder: --resume refuses it in one line naming both
    runs (not as an edited config.yaml), with --accept-config-edits too, and the host's metrics stay whole."""
    import json

    from cli_runs import assert_refused

    host, donor = ["--runs-dir", tmp_path, "--name", "host"], ["--runs-dir", tmp_path, "--name", "donor"]
    assert run_cli(["train", *TINY, "--total-steps", 100, *host])[0] == 0
    donor_tiny = [a.replace("delay=3", "delay=4") for a in TINY]
    assert run_cli(["train", *donor_tiny, "--total-steps", 20, *donor])[0] == 0
    ids = {name: json.loads((tmp_path / name / "run.json").read_text())["id"] for name in ("host", "donor")}
    assert ids["host"] != ids["donor"]
    assert torch.load(tmp_path / "host" / "checkpoint.pt", weights_only=True)["run"]["id"] == ids["host"]
    kept = rows(tmp_path / "host" / "metrics.csv")
    shutil.copy(tmp_path / "donor" / "checkpoint.pt", tmp_path / "host" / "checkpoint.pt")
    for extra in ([], ["--accept-config-edits"]):
        code, _, err = run_cli(["train", "--resume", *host, "--total-steps", 200, *extra])
        assert_refused(code, err, "is a checkpoint of another run", ids["donor"], ids["host"], str(tmp_path / "donor"),
                       one_line=True)
        assert "edited" not in err and rows(tmp_path / "host" / "metrics.csv") == kept
    assert not (tmp_path / "host" / "config-edits.log").exists()


def test_resuming_a_run_at_its_budget_says_how_to_give_it_more_and_writes_nothing(tmp_path):
    runs = ["--runs-dir", tmp_path, "--name", "f"]
    assert run_cli(["train", *TINY, "--total-steps", 20, *runs])[0] == 0
    steps = torch.load(tmp_path / "f" / "checkpoint.pt", weights_only=True)["agent_steps"]
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "f").rglob("*"))
    code, _, err = run_cli(["train", "--resume", *runs])
    from cli_runs import assert_refused

    assert_refused(code, err, "has reached its budget", f"{steps:,} agent steps of total_steps 20",
                   f"Pass --total-steps above {steps:,}", one_line=True)
    after = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "f").rglob("*"))
    assert after == before  # no new TensorBoard file, no row, no checkpoint


def test_accept_config_edits_without_resume_is_refused(tmp_path):
    code, _, err = run_cli(["train", *TINY, "--accept-config-edits", "--runs-dir", tmp_path])
    assert code == 2 and "--accept-config-edits applies to --resume only" in err
    assert not os.listdir(tmp_path)


def test_a_run_folder_removed_mid_run_ends_in_one_line_with_exit_74(tmp_path):
    run = tmp_path / "gone"

    def remove_once_checkpointed():
        deadline = time.monotonic() + 60
        while not (run / "checkpoint.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        shutil.rmtree(run)

    remover = threading.Thread(target=remove_once_checkpointed)
    remover.start()
    code, _, err = run_cli(["train", *TINY, "--total-steps", 10_000_000, "--max-seconds", 60, "--runs-dir", tmp_path,
                            "--name", "gone"])
    remover.join()
    assert code == 74 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fwrl: error: No such file or directory") and str(run) in last, err


@contextlib.contextmanager
def _small_tmpfs(folder, size: str = "4m"):
    """A tmpfs of ``size`` mounted on ``folder`` (root with CAP_SYS_ADMIN only: else the test skips)."""
    import subprocess

    folder.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to make a disk fault ({made.stderr.strip() or made.returncode})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_disk_fault_mid_run_ends_in_one_line_with_exit_74_and_the_last_checkpoint_whole(tmp_path, fault):
    """The run folder's file system fills up, or is remounted read-only, after the first checkpoint:
    the command ends with one line naming the path and the error (exit 74), no traceback, and the
    checkpoint written before still loads."""
    import subprocess

    with _small_tmpfs(tmp_path / "disk") as disk:
        run = disk / "r"

        def fault_once_checkpointed():
            deadline = time.monotonic() + 60
            while not (run / "checkpoint.pt").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if fault == "full":
                with open(disk / "filler", "wb", buffering=0) as f:  # unbuffered: close has nothing to flush
                    try:
                        while True:
                            f.write(b"\0" * 65536)
                    except OSError:
                        pass
            else:  # a read-only mount over the run folder (open files keep writing: TensorBoard's, if any)
                subprocess.run(["mount", "--bind", str(run), str(run)], check=True)
                subprocess.run(["mount", "-o", "remount,bind,ro", str(run)], check=True)

        faulty = threading.Thread(target=fault_once_checkpointed)
        faulty.start()
        code, _, err = run_cli(["train", *TINY, "--total-steps", 10_000_000, "--max-seconds", 60,
                                "--checkpoint-interval", 0.5, "--runs-dir", disk, "--name", "r"])
        faulty.join()
        subprocess.run(["umount", "-l", str(run)], capture_output=True)  # the read-only mount, if made
        assert code == 74 and "Traceback" not in err, err[-3000:]
        last = err.strip().splitlines()[-1]
        reason = "No space left on device" if fault == "full" else "Read-only file system"
        assert last.startswith(f"fwrl: error: {reason}") and str(run) in last, err[-3000:]
        payload = torch.load(run / "checkpoint.pt", weights_only=True)
        assert payload["model"] and payload["agent_steps"] >= 0


def test_a_checkpoint_that_does_not_fit_a_full_disk_is_named_a_full_disk(tmp_path):
    """torch's zip writer words a full disk "unexpected pos 832 vs 726" as often as "file write failed": a real
    full tmpfs is said as such (ENOSPC, "No space left on device"), not "Input/output error (errno 5)"."""
    import errno

    from fwrl.agents.checkpoint import write_checkpoint

    with _small_tmpfs(tmp_path / "disk", "1m") as disk:
        with pytest.raises(OSError) as caught:
            write_checkpoint(disk / "checkpoint.pt", {"model": {"w": torch.zeros(300_000)}})  # 1.2 MB on 1 MB
        assert caught.value.errno == errno.ENOSPC, caught.value
        assert "No space left on device while writing the checkpoint" in str(caught.value)
        assert not (disk / "checkpoint.pt").exists() and not list(disk.iterdir())  # no half-written file left


def test_the_sweeps_progress_shows_the_last_whole_row(tmp_path):
    from fwrl.launch.sweep.sweep_progress import last_metrics_row

    path = tmp_path / "metrics.csv"
    _write(path, (100, 200))
    with open(path, "ab") as f:
        f.write(b"5.0,30")  # a row being written as the sweep looks
    assert last_metrics_row(path)["agent_steps"] == "200"


def test_episodes_csv_has_every_finished_episode_and_a_resume_drops_those_after_the_checkpoint(tmp_path):
    """episodes.csv: one row per finished training episode (its task, return, length, worker, and the
    agent steps of the metrics row written after it), as many as metrics.csv's ``episodes`` count; a
    run killed after its checkpoint leaves rows of more steps, which the resume drops (and says so)."""
    runs = ["--runs-dir", tmp_path, "--name", "e"]
    assert run_cli(["train", *TINY, "--total-steps", 200, *runs])[0] == 0
    path, metrics = tmp_path / "e" / "episodes.csv", rows(tmp_path / "e" / "metrics.csv")
    episodes = rows(path)
    assert len(episodes) == int(metrics[-1]["episodes"]) > 0, (len(episodes), metrics[-1])
    assert set(episodes[0]) == {"agent_steps", "task", "return", "length", "worker"}, episodes[0]
    # cue_delay?delay=3: the cue, 3 blank steps, the query (5 steps), and a reward of 1 or 0 at the end
    assert {r["task"] for r in episodes} == {"cue_delay"} and {r["length"] for r in episodes} == {"5"}, episodes[:3]
    assert {float(r["return"]) for r in episodes} <= {0.0, 1.0}, episodes[:3]
    row_steps = {r["agent_steps"] for r in metrics}
    assert {r["agent_steps"] for r in episodes} <= row_steps  # stamped with the row written after them
    saved = torch.load(tmp_path / "e" / "checkpoint.pt", weights_only=True)["agent_steps"]
    MetricsCSV(path).write({"agent_steps": saved + 40, "task": "cue_delay", "return": 9.0, "length": 5, "worker": 0})
    code, _, err = run_cli(["train", "--resume", *runs, "--total-steps", saved + 100])
    assert code == 0, err
    assert f"dropped 1 row(s) of {path} logged after the checkpoint" in err, err
    kept = rows(path)
    assert "9.0" not in {r["return"] for r in kept} and len(kept) > len(episodes), len(kept)
    assert len(kept) == int(rows(tmp_path / "e" / "metrics.csv")[-1]["episodes"])
    steps = [int(r["agent_steps"]) for r in kept]
    assert steps == sorted(steps), steps
