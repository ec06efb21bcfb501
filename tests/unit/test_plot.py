"""fwrl plot: learning curves from metrics.csv, one line per run, one panel per task."""

from __future__ import annotations

import struct

import matplotlib
import pytest

from fwrl.errors import FwrlError
from fwrl.launch.cli import main
from fwrl.launch.plot import plot_runs, series, smooth
from fwrl.runner.rundir import MetricsCSV

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def make_run(path, rows):
    path.mkdir(parents=True)
    metrics = MetricsCSV(path / "metrics.csv")
    for row in rows:
        metrics.write(row)
    return path


@pytest.fixture
def runs(tmp_path):
    a = make_run(tmp_path / "lstm", [{"agent_steps": 100 * i, "mean_return": float(i)} for i in range(1, 6)]
                 + [{"agent_steps": 600, "eval/test/mean_return": 0.5}])  # an eval row: no mean_return
    b = make_run(tmp_path / "delta_net", [{"agent_steps": 100 * i, "mean_return": 2.0 * i} for i in range(1, 4)])
    return a, b


def test_one_line_per_run_with_labelled_axes_and_png_of_the_requested_size(runs, tmp_path):
    out = tmp_path / "curves.png"
    fig = plot_runs(runs, out=out, size=(640, 480))
    (ax,) = [ax for ax in fig.axes if ax.get_visible()]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["lstm", "delta_net"]
    assert list(lines[0].get_xdata()) == [100, 200, 300, 400, 500]  # the eval row is skipped
    assert list(lines[1].get_ydata()) == [2.0, 4.0, 6.0]
    assert ax.get_xlabel() == "agent steps" and ax.get_ylabel() == "mean_return"
    assert out.stat().st_size > 1000 and png_size(out) == (640, 480)
    plt.close(fig)


def test_smoothing_is_a_trailing_moving_average():
    assert smooth([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert smooth([3.0, 6.0, 9.0], 3) == [3.0, 4.5, 6.0]
    assert smooth([1.0, 5.0], 1) == [1.0, 5.0]
    assert series([{"agent_steps": "5", "x": "nan"}, {"agent_steps": "6", "x": "2"}], "x") == ([6.0], [2.0])


def test_one_panel_per_task_for_multi_task_runs(tmp_path):
    rows = [{"agent_steps": 10 * i, "mean_return": 1.0, "return/bigfish": float(i), "return/maze": 5.0 + i}
            for i in range(1, 4)]
    r1, r2 = make_run(tmp_path / "r1", rows), make_run(tmp_path / "r2", rows)
    fig = plot_runs([r1, r2], by="task")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["bigfish", "maze"]
    assert all(len(ax.get_lines()) == 2 for ax in panels)
    assert list(panels[1].get_lines()[0].get_ydata()) == [6.0, 7.0, 8.0]
    plt.close(fig)
    with pytest.raises(FwrlError, match="return/bigfish"):
        plot_runs([r1], metric="no_such_metric")


def test_random_draws_each_tasks_random_return_from_its_train_split(tmp_path, capsys):
    """``--random``: a dashed line per task panel at the random policy's train-split mean (its other
    splits and the over-task rows ignored); with --by run, or a file that is not such JSON, one line."""
    import json

    rows = [{"agent_steps": 10 * i, "return/bigfish": float(i), "return/maze": 5.0 + i} for i in range(1, 4)]
    run = make_run(tmp_path / "r", rows)
    random = tmp_path / "random_policy.json"
    random.write_text(json.dumps({"aggregates": [
        {"task": "bigfish", "split": "test_1000", "mean": 9.0, "std": 1.0},
        {"task": "bigfish", "split": "train", "mean": 1.5, "std": 1.0},
        {"task": "maze", "split": "train", "mean": 5.5, "std": 2.0},
        {"task": "all", "split": "train", "mean": 3.5, "std": None}]}))
    fig = plot_runs([run], by="task", random=random)
    floors = {ax.get_title(): [line for line in ax.get_lines() if line.get_label() == "random policy"]
              for ax in fig.axes if ax.get_visible()}
    assert {title: [line.get_ydata()[0] for line in lines] for title, lines in floors.items()} == \
        {"bigfish": [1.5], "maze": [5.5]}
    assert floors["maze"][0].get_linestyle() == "--"
    plt.close(fig)
    capsys.readouterr()
    assert main(["plot", str(run), "--random", str(random), "--out", str(tmp_path / "x.png")]) == 2
    assert "add --by task" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["plot", str(run), "--by", "task", "--random", str(tmp_path / "bad.json"),
                 "--out", str(tmp_path / "y.png")]) == 2
    assert "not a random policy's JSON" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()


def test_cli_plot(runs, tmp_path, capsys):
    out = tmp_path / "cli.png"
    assert main(["plot", *map(str, runs), "--out", str(out), "--size", "500x300", "--smooth", "2"]) == 0
    assert png_size(out) == (500, 300)
    assert main(["plot", str(runs[0])]) == 0
    assert png_size(runs[0] / "mean_return.png") == (1200, 800)
    assert main(["plot", str(runs[0]), "--by", "task"]) == 2
    assert "return/<task>" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert main(["plot", str(runs[0]), "--size", "big"]) == 2


def test_cli_plot_checks_where_it_writes_before_drawing(runs, tmp_path, monkeypatch, capsys, read_only):
    import fwrl.launch.plot as plot

    monkeypatch.setattr(plot, "plot_runs", lambda *a, **k: pytest.fail("drew although the PNG cannot be written"))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["plot", str(runs[0]), "--out", str(blocker / "curves.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fwrl: error: plot") and "not writable" in err and "--out" in err
    read_only(runs[0])
    assert main(["plot", str(runs[0])]) == 2
    assert "mean_return.png is not writable (Permission denied)" in capsys.readouterr().err


def test_plot_refuses_a_format_and_a_size_before_drawing_and_leaves_nothing_on_a_full_disk(tmp_path, monkeypatch,
                                                                                           capsys):
    """--out with a suffix matplotlib cannot write and an absurd --size are one-line errors (exit 2, no
    file); a write that fails (here: the disk full while saving) leaves no truncated image and ends in
    one line naming the path (exit 74), not a traceback."""
    import errno

    import matplotlib.figure

    from fwrl.launch.cli import main
    from fwrl.launch.exits import EXIT_OS_ERROR

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text("agent_steps,mean_return\n100,1.0\n200,2.0\n")
    assert main(["plot", str(run), "--out", str(tmp_path / "p.txt")]) == 2
    assert ".txt is not an image format" in capsys.readouterr().err
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png"), "--size", "100000x100000"]) == 2
    assert "each from 100 to 10000" in capsys.readouterr().err

    def full(self, fname, **kwargs):
        fname.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "p.png"))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    assert main(["plot", str(run), "--out", str(tmp_path / "p.png")]) == EXIT_OS_ERROR
    err = capsys.readouterr().err
    assert err.startswith("fwrl: error: No space left on device") and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no image, no temporary file
