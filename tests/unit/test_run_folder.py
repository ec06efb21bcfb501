"""Run folders: what a killed run leaves behind is cleaned when the folder is used again.

SIGKILL (or a power cut) during an atomic write leaves its temporary file (``.<name>.<random>.tmp``);
the process cannot remove it. ``RunDir.prepare`` (of ``RunDir.open``), which ``fwrl train`` calls on a new run and on
``--resume`` before anything is written, removes such files, and only those.
"""

from __future__ import annotations

import pytest

from fwrl.errors import FwrlError
from fwrl.runner.rundir import RunDir
from fwrl.utils.files import atomic_write_text, temporary_files


def _killed_write(folder, name: str) -> str:
    """A temporary file as ``atomic_write`` names it, left as if its writer was killed mid-write."""
    stale = folder / f".{name}.k1lled_.tmp"
    stale.write_bytes(b"half a checkpoint")
    return stale.name


def test_resume_removes_the_temporary_files_a_killed_write_left(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    atomic_write_text(run / "config.yaml", "core: lstm\n")
    (run / "checkpoint.pt").write_bytes(b"the last complete checkpoint")
    (run / "notes.tmp").write_text("not fwrl's: no leading dot")
    stale = [_killed_write(run, "checkpoint.pt"), _killed_write(run, "metrics.csv")]
    assert sorted(p.name for p in temporary_files(run)) == sorted(stale)

    RunDir(run).prepare(resume=True)

    assert temporary_files(run) == []
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt", "config.yaml", "notes.tmp"]
    assert (run / "checkpoint.pt").read_bytes() == b"the last complete checkpoint"
    err = capsys.readouterr().err
    assert "removed 2 half-written file(s)" in err and all(name in err for name in stale)


def test_a_new_run_in_a_folder_a_killed_run_left_starts_clean(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    _killed_write(run, "config.yaml")  # killed before its first checkpoint

    RunDir(run).prepare(resume=False)
    assert temporary_files(run) == []
    assert "removed 1 half-written file(s)" in capsys.readouterr().err


def test_other_learner_ranks_leave_the_folder_alone(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    stale = _killed_write(run, "checkpoint.pt")  # rank 0 may be writing it right now
    RunDir(run).prepare(resume=False, clean=False)
    assert [p.name for p in temporary_files(run)] == [stale]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("failure", [KeyboardInterrupt, lambda: FwrlError("a vision stem of another shape")])
def test_a_run_stopped_before_its_first_checkpoint_leaves_no_folder(tmp_path, monkeypatch, failure):
    """A new run refused or interrupted while it is built (a checkpoint to load that does not fit, Ctrl-C
    during start-up) leaves no run folder with a config and nothing to resume; a folder that existed
    before (a resume) is left alone."""
    import fwrl.runner.train as train_module
    from fwrl.launch.cli import main

    def fail(config, run_dir, **kwargs):
        (run_dir / "config.yaml").write_text("written before the failure\n")
        raise failure()

    monkeypatch.setattr(train_module, "train", fail)
    code = main(["train", "--env", "memory:cue_delay", "--core", "lstm", "--runs-dir", str(tmp_path), "--name", "r",
                 "--num-workers", "1", "--envs-per-worker", "1"])
    assert code in (2, 130) and not (tmp_path / "r").exists()


@pytest.mark.parametrize("resumed, kept", [
    ({"agent_steps": 300, "metrics_rows": 3}, ["100", "200", "300"]),  # the rows the checkpoint counted
    ({"agent_steps": 300, "metrics_rows": -1}, ["100", "200", "300"]),  # an older checkpoint: by their steps
])
@pytest.mark.parametrize("torn", [False, True])
def test_a_resume_reads_metrics_csv_once(tmp_path, monkeypatch, resumed, kept, torn):
    """Opening a resumed run's metrics (the repair of a damaged tail, the trim to the checkpoint's rows,
    the rows at its step that TensorBoard writes again) reads metrics.csv once (issue 72: three times)."""
    from fwrl.runner import rundir
    from fwrl.runner.rundir import MetricsCSV, RunDir

    metrics = MetricsCSV(tmp_path / "metrics.csv")
    for steps in (100, 200, 300, 400):  # 400: a killed session's row after the checkpoint
        metrics.write({"time": steps / 10, "agent_steps": steps, "mean_return": 0.5})
    if torn:  # and a row cut short after it
        with (tmp_path / "metrics.csv").open("a") as f:
            f.write("50.0,500")
    reads = []
    read = rundir.read_metrics_file
    monkeypatch.setattr(rundir, "read_metrics_file", lambda path: reads.append(path) or read(path))

    session = RunDir(tmp_path).metrics(resumed)

    assert len(reads) == 1, reads
    assert session.purge_step == 300 and [row["agent_steps"] for row in session.at_purge_step] == ["300"]
    assert session.csv.rows == 3 and [row["agent_steps"] for row in read(tmp_path / "metrics.csv").rows] == kept
    session.csv.write({"time": 40.0, "agent_steps": 400, "mean_return": 0.6})  # the session's rows follow them
    assert [row["agent_steps"] for row in read(tmp_path / "metrics.csv").rows] == kept + ["400"]
