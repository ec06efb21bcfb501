"""``fwrl report`` on synthetic runs with known numbers: per-game means and CIs, human-normalised
scores, IQM / median / mean with stratified bootstrap CIs (checked against direct computations), the
random-policy baseline and its cache, groups from sweep labels, the files written, bad input."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fwrl.launch.cli import main
from fwrl.settings.config import TrainConfig, config_yaml
from fwrl.launch.sweep.grid import Cell
from fwrl.launch.sweep.plan import write_sweep

PONG, BREAKOUT = (-20.7, 14.6), (1.7, 30.5)  # random, human (DQN-zoo table)
REPS = 5000


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def make_run(folder: Path, env: str, core: str, seed: int, final: float, evaluated: bool = True,
             **settings) -> Path:
    """A run folder as fwrl train and fwrl evaluate leave it: config.yaml, metrics.csv, evaluation.json."""
    folder.mkdir(parents=True)
    config = TrainConfig.from_dict({"env": env, "core": core, "seed": seed, "total_steps": 1000, **settings})
    (folder / "config.yaml").write_text(config_yaml(config))
    with (folder / "metrics.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["time", "agent_steps", "episodes", "mean_return"])
        for i, steps in enumerate(range(0, 1001, 250)):
            writer.writerow([i, steps, 10 * i, final * i / 4 - 1.0 * (4 - i)])
    if evaluated:
        task = env.split(":", 1)[1].split("?")[0]
        (folder / "evaluation.json").write_text(json.dumps({
            "env": env, "episodes": 30, "repeats": 5,
            "aggregates": [{"task": task, "split": "test", "repeats": 5, "episodes": 150, "mean": final}]}))
    return folder


def iqm(matrix: np.ndarray, axis: int | None = None):
    """The interquartile mean of all of ``matrix`` (a float), or of each slice along ``axis``."""
    value = stats.trim_mean(matrix, proportiontocut=0.25, axis=axis)
    return float(value) if axis is None else value


def stratified_bootstrap_ci(matrix: np.ndarray, statistic, reps: int, seed: int) -> tuple[float, float]:
    """Percentile CI of ``statistic`` under resampling of runs within each game (column), done here
    directly: all ``reps`` resamples at once, ``statistic`` taking each one's scores (flattened)."""
    rng = np.random.default_rng(seed)
    n, games = matrix.shape
    samples = matrix[rng.integers(0, n, size=(reps, n, games)), np.arange(games)].reshape(reps, n * games)
    values = statistic(samples, axis=1)
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


@pytest.fixture(scope="module")
def atari_report(tmp_path_factory):
    """Two Atari games x three groups x eight seeds; one run has only training returns."""
    root = tmp_path_factory.mktemp("atari")
    rng = np.random.default_rng(7)
    finals = {  # group -> game -> the seeds' final returns
        "lstm": {"Pong": rng.normal(-10, 6, 8), "Breakout": rng.normal(8, 4, 8)},
        "rdn": {"Pong": rng.normal(5, 8, 8), "Breakout": rng.normal(20, 6, 8)},
        "elstm": {"Pong": np.full(8, 0.0), "Breakout": np.full(8, 16.1)},  # every seed alike: CIs are points
    }
    for core, games in finals.items():
        for game, values in games.items():
            for seed, value in enumerate(values, start=1):
                training_only = core == "rdn" and game == "Breakout" and seed == 3
                make_run(root / "runs" / f"{game}-{core}-{seed}", f"atari:{game}", core, seed, float(value),
                         evaluated=not training_only)
    out = root / "report"
    code, stdout, err = cli("report", str(root / "runs"), "--out", str(out), "--reps", str(REPS), "--html")
    assert code == 0, err
    return finals, json.loads((out / "report.json").read_text()), out, stdout


def test_per_game_means_cis_and_human_normalised_scores(atari_report):
    finals, report, out, stdout = atari_report
    constants = {"atari:Pong": PONG, "atari:Breakout": BREAKOUT}
    rows = {(r["game"], r["group"]): r for r in report["per_game"]}
    assert len(rows) == 6
    for group, games in finals.items():
        for game, values in games.items():
            row = rows[(f"atari:{game}", group)]
            random, human = constants[f"atari:{game}"]
            assert row["mean"] == pytest.approx(values.mean(), abs=1e-9)
            assert row["normalised_mean"] == pytest.approx((values.mean() - random) / (human - random), abs=1e-9)
            if group == "elstm":
                assert row["ci"] == [values[0], values[0]]
                continue
            low, high = stratified_bootstrap_ci(values[:, None], np.mean, 20000, seed=1)
            width = high - low
            assert row["ci"][0] == pytest.approx(low, abs=0.08 * width)
            assert row["ci"][1] == pytest.approx(high, abs=0.08 * width)
    pong = {Path(run["path"]).name: run for run in report["runs"]}
    assert pong["Pong-lstm-1"]["normalised"]["atari:Pong"] == pytest.approx(
        (finals["lstm"]["Pong"][0] + 20.7) / (14.6 + 20.7), abs=1e-9)
    assert pong["Breakout-rdn-2"]["normalised"]["atari:Breakout"] == pytest.approx(
        (finals["rdn"]["Breakout"][1] - 1.7) / (30.5 - 1.7), abs=1e-9)
    # the run without evaluation.json counts with its last training return, marked as such
    assert pong["Breakout-rdn-3"]["scores"]["atari:Breakout"]["source"] == "training"
    assert rows[("atari:Breakout", "rdn")]["sources"] == ["evaluation", "training"]
    assert "(n=8)†" in stdout and "-20.7 (published)" in stdout


def test_aggregates_equal_a_direct_computation(atari_report):
    finals, report, out, _ = atari_report
    aggregates = report["aggregates"]
    assert aggregates["games"] == ["atari:Breakout", "atari:Pong"]  # in the order the runs came (by folder name)
    for group, games in finals.items():
        matrix = np.stack([(games["Breakout"] - BREAKOUT[0]) / (BREAKOUT[1] - BREAKOUT[0]),
                           (games["Pong"] - PONG[0]) / (PONG[1] - PONG[0])], axis=1)
        result = aggregates["groups"][group]
        assert result["IQM"]["point"] == pytest.approx(iqm(matrix), abs=1e-9)
        assert result["median"]["point"] == pytest.approx(float(np.median(matrix.mean(axis=0))), abs=1e-9)
        assert result["mean"]["point"] == pytest.approx(float(matrix.mean()), abs=1e-9)
        if group == "elstm":  # no spread within a game: every resample is the data itself
            assert (result["IQM"]["low"], result["IQM"]["high"]) == pytest.approx((iqm(matrix), iqm(matrix)))
            continue
        for metric, statistic in (("IQM", iqm), ("mean", np.mean)):
            low, high = stratified_bootstrap_ci(matrix, statistic, 20000, seed=2)
            width = high - low
            assert result[metric]["low"] == pytest.approx(low, abs=0.08 * width), (group, metric)
            assert result[metric]["high"] == pytest.approx(high, abs=0.08 * width), (group, metric)
    profile = report["profiles"]["groups"]["rdn"]
    taus = np.array(report["profiles"]["taus"])
    rdn = np.stack([(finals["rdn"]["Pong"] - PONG[0]) / (PONG[1] - PONG[0]),
                    (finals["rdn"]["Breakout"] - BREAKOUT[0]) / (BREAKOUT[1] - BREAKOUT[0])], axis=1)
    assert profile["fraction"] == pytest.approx([(rdn > t).mean() for t in taus])


def test_the_report_files(atari_report):
    _, report, out, _ = atari_report
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.json", "report.html", "curves.png",
                                               "aggregates.png", "profiles.png"}
    for png in ("curves.png", "aggregates.png", "profiles.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (out / "report.md").read_text()
    for section in ("## Per game", "## Normalised scores", "## Aggregates", "## Learning curves",
                    "## Published figures", "![learning curves](curves.png)"):
        assert section in markdown
    # RFWP's Pong figure for lstm and rdn beside fwrl's (no published Pong figure for elstm)
    published = [line for line in markdown.splitlines() if line.startswith("| atari:Pong |") and "RFWP" in line]
    assert sorted(line.split(" | ")[1] for line in published) == ["lstm", "rdn"]
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3 and 'src="http' not in page and "curves.png" not in page


def test_random_policy_baseline_relative_normalisation_and_its_cache(tmp_path, monkeypatch):
    game = "memory:cue_delay?delay=2"
    finals = {"lstm": [1.0, 0.9], "feedforward": [0.5, 0.62]}
    for core, values in finals.items():
        for seed, value in enumerate(values, start=1):
            make_run(tmp_path / "runs" / f"{core}-{seed}", game, core, seed, value)
    out = tmp_path / "report"
    code, _, err = cli("report", str(tmp_path / "runs"), "--out", str(out), "--random-episodes", "40")
    assert code == 0, err
    cache = json.loads((out / "random_policy.json").read_text())
    assert cache[game]["episodes"] == 40 and len(cache[game]["returns"]) == 40
    random = float(np.mean(cache[game]["returns"]))
    assert 0.2 < random < 0.8  # two cues, a random answer: success half the time
    report = json.loads((out / "report.json").read_text())
    assert report["games"][0]["random"] == pytest.approx(random)
    rows = {r["group"]: r for r in report["per_game"]}
    best = np.mean(finals["lstm"])
    assert rows["lstm"]["normalised_mean"] == pytest.approx(1.0)
    assert rows["feedforward"]["normalised_mean"] == pytest.approx((np.mean(finals["feedforward"]) - random)
                                                                   / (best - random))
    assert "relative" in (out / "report.md").read_text()

    def no_env(*args, **kwargs):
        raise AssertionError("the cached random-policy returns should be used")

    monkeypatch.setattr("fwrl.envs.registry.make_env", no_env)
    code, _, err = cli("report", str(tmp_path / "runs"), "--out", str(out), "--random-episodes", "40")
    assert code == 0, err
    assert json.loads((out / "report.json").read_text())["games"][0]["random"] == pytest.approx(random)


def test_groups_of_a_sweep_take_the_cells_labels(tmp_path):
    sweep = tmp_path / "sw"
    cells = []
    for label, settings in (("lstm", {"core": "lstm"}), ("elstm-rtrl", {"core": "elstm",
                                                                         "core_options": {"grad": "rtrl"}})):
        for seed in (1, 2):
            config = TrainConfig.from_dict({"env": "memory:cue_delay?delay=2", "seed": seed, **settings})
            cells.append(Cell(f"{label}__seed-{seed}", {"core": label, "seed": f"seed-{seed}"}, config))
    write_sweep(sweep, None, cells)
    for i, cell in enumerate(cells):
        make_run(sweep / "runs" / cell.name, cell.config.env, cell.config.core, cell.config.seed, 0.5 + 0.1 * i,
                 core_options=cell.config.core_options)
    code, stdout, err = cli("report", str(sweep), "--random-episodes", "0")
    assert code == 0, err
    report = json.loads((sweep / "report" / "report.json").read_text())
    assert [g["label"] for g in report["groups"]] == ["lstm", "elstm-rtrl"]
    assert [g["seeds"] for g in report["groups"]] == [[1, 2], [1, 2]]
    assert "| game | random | lstm | elstm-rtrl |" in stdout
    assert any("no normalised score" in note for note in report["notes"])  # no random baseline asked for


@pytest.mark.parametrize("argv, names", [
    (["EMPTY"], ["holds no runs", "sweep folders"]),
    (["MISSING"], ["does not exist"]),
    (["RUNS", "--reps", "5"], ["reps=5", "x >= 100"]),
    (["RUNS", "--confidence", "1.5"], ["confidence=1.5", "0 < x < 1"]),
])
def test_bad_input_is_a_one_line_error(tmp_path, argv, names):
    (tmp_path / "empty").mkdir()
    make_run(tmp_path / "runs" / "a", "memory:cue_delay?delay=2", "lstm", 1, 0.5)
    paths = {"EMPTY": str(tmp_path / "empty"), "MISSING": str(tmp_path / "nope"), "RUNS": str(tmp_path / "runs")}
    code, _, err = cli("report", *[paths.get(a, a) for a in argv], "--out", str(tmp_path / "out"))
    assert code == 2 and err.startswith("fwrl: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert not (tmp_path / "out").exists()


def test_missing_rliable_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    make_run(tmp_path / "runs" / "a", "memory:cue_delay?delay=2", "lstm", 1, 0.5)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rliable" else real(name, *a))
    code, _, err = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"))
    assert code == 2 and "pip install -e '.[report]'" in err and "rliable" in err


def test_one_seed_gets_a_ci_over_its_evaluation_episodes(tmp_path):
    """A group with one seed in a game (the CPU learning suite): the CI comes from its evaluation
    episodes' returns (percentile bootstrap of their mean), and says so."""
    returns = [3.0, 5.0, 4.0, 9.0, 2.0, 6.0, 7.0, 4.0, 5.0, 5.0]
    run = make_run(tmp_path / "runs" / "b-lstm-1", "atari:Breakout", "lstm", 1, float(np.mean(returns)))
    result = json.loads((run / "evaluation.json").read_text())
    result["runs"] = [{"task": "Breakout", "split": "test", "returns": returns}]
    (run / "evaluation.json").write_text(json.dumps(result))
    make_run(tmp_path / "runs" / "b-rdn-1", "atari:Breakout", "rdn", 1, 6.0)  # no episode returns: no CI
    code, stdout, err = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--reps", "4000")
    assert code == 0, err
    rows = {r["group"]: r for r in json.loads((tmp_path / "out" / "report.json").read_text())["per_game"]}
    direct = stats.bootstrap((np.array(returns),), np.mean, n_resamples=4000, method="percentile",
                             rng=np.random.default_rng(0)).confidence_interval
    low, high = rows["lstm"]["ci"]
    assert rows["lstm"]["ci_over"] == "episodes" and low < np.mean(returns) < high
    assert abs(low - direct.low) < 0.25 and abs(high - direct.high) < 0.25
    assert rows["rdn"]["ci_over"] == "seeds" and rows["rdn"]["ci"] == [None, None]  # NaN as JSON null
    assert "(n=1, 10 episodes)" in stdout


def test_a_report_of_runs_without_any_score_is_refused_and_writes_nothing(tmp_path, capsys):
    from fwrl.launch.cli import main
    from fwrl.settings.config import TrainConfig, save_config

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    save_config(TrainConfig(env="memory:cue_delay", core="lstm"), run / "config.yaml")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    assert "none of the 1 run(s) has a score yet" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _cut_metrics(run: Path, last_steps: int) -> None:
    """Keep the rows of the run's metrics.csv up to ``last_steps`` agent steps (a run still training)."""
    with (run / "metrics.csv").open() as f:
        rows = list(csv.reader(f))
    with (run / "metrics.csv").open("w", newline="") as f:
        csv.writer(f).writerows([rows[0], *[r for r in rows[1:] if int(r[1]) <= last_steps]])


def test_runs_short_of_their_budget_are_marked_or_left_out(tmp_path):
    """A run that has not logged its total_steps (a sweep still running) is scored on what it reached,
    marked § in the table, named with its steps in the notes and report.json; --finished-only leaves
    it out, and refuses a report with nothing finished."""
    for seed in (1, 2):
        make_run(tmp_path / "runs" / f"p-lstm-{seed}", "atari:Pong", "lstm", seed, 5.0 * seed)
    _cut_metrics(make_run(tmp_path / "runs" / "p-rdn-1", "atari:Pong", "rdn", 1, 4.0, evaluated=False), 500)
    code, stdout, err = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "all"), "--reps", "200")
    assert code == 0, err
    assert "1 of 3 runs have not reached their step budget: p-rdn-1 (500 of 1,000)" in err
    rdn_row = next(line for line in stdout.splitlines() if line.startswith("| atari:Pong"))
    assert rdn_row.count("§") == 1 and rdn_row.rstrip(" |").endswith("§")  # the rdn column, not the lstm's
    report = json.loads((tmp_path / "all" / "report.json").read_text())
    assert {Path(r["path"]).name: (r["agent_steps"], r["unfinished"]) for r in report["runs"]} == {
        "p-lstm-1": (1000, False), "p-lstm-2": (1000, False), "p-rdn-1": (500, True)}
    assert any("p-rdn-1 (500 of 1,000)" in note for note in report["notes"])
    code, stdout, err = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "done"), "--reps", "200",
                            "--finished-only")
    assert code == 0, err
    assert [g["label"] for g in json.loads((tmp_path / "done" / "report.json").read_text())["groups"]] == ["lstm"]
    assert "left out (--finished-only)" in err and "§" not in stdout
    code, _, err = cli("report", str(tmp_path / "runs" / "p-rdn-1"), "--out", str(tmp_path / "none"),
                       "--finished-only")
    assert code == 2 and "none of the 1 run(s) has reached its step budget" in err
    assert not (tmp_path / "none").exists()


def test_runs_scored_by_training_returns_are_said_with_how_to_evaluate_them(tmp_path):
    """A run without evaluation.json (a sweep cell never evaluated) is scored by its training returns: the
    report says so on stderr and in its notes, naming the runs and the command that evaluates them, not
    only with a dagger in the table."""
    make_run(tmp_path / "runs" / "p-lstm-1", "atari:Pong", "lstm", 1, 5.0)
    make_run(tmp_path / "runs" / "p-lstm-2", "atari:Pong", "lstm", 2, 6.0, evaluated=False)
    code, stdout, err = cli("report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--reps", "200")
    assert code == 0, err
    said = "1 of 2 run(s) have no evaluation.json, so they are scored by their last training returns"
    assert said in err and "p-lstm-2" in err and "fwrl evaluate RUN" in err and "--evaluate" in err
    assert any(said in note for note in json.loads((tmp_path / "out" / "report.json").read_text())["notes"])
    code, _, err = cli("report", str(tmp_path / "runs" / "p-lstm-1"), "--out", str(tmp_path / "one"), "--reps", "200")
    assert code == 0 and "no evaluation.json" not in err


def test_report_json_names_runs_relative_to_their_common_parent(tmp_path):
    """report.json names each run relative to the folder that holds the runs (a sweep's cells by their names,
    cells of two sweeps as SWEEP/runs/CELL), never by the absolute path it was read from, so a report filed
    with the code does not carry the temporary folder its runs lay in."""
    from fwrl.launch.report.build import run_names

    for seed in (1, 2):
        make_run(tmp_path / "a" / "runs" / f"p-lstm-{seed}", "atari:Pong", "lstm", seed, 5.0 * seed)
    make_run(tmp_path / "b" / "runs" / "p-rdn-1", "atari:Pong", "rdn", 1, 4.0)
    code, _, err = cli("report", str(tmp_path / "a" / "runs"), "--out", str(tmp_path / "one"), "--reps", "200")
    assert code == 0, err
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert sorted(r["path"] for r in report["runs"]) == ["p-lstm-1", "p-lstm-2"]
    assert report["groups"][0]["runs"] == ["p-lstm-1", "p-lstm-2"]
    code, _, err = cli("report", str(tmp_path / "a" / "runs"), str(tmp_path / "b" / "runs"), "--out",
                       str(tmp_path / "two"), "--reps", "200")
    assert code == 0, err
    text = (tmp_path / "two" / "report.json").read_text()
    assert sorted(r["path"] for r in json.loads(text)["runs"]) == ["a/runs/p-lstm-1", "a/runs/p-lstm-2",
                                                                   "b/runs/p-rdn-1"]
    assert str(tmp_path) not in text.replace(json.dumps(str(tmp_path / "two"))[1:-1], "")  # the --out given aside
    assert run_names([tmp_path / "a" / "runs" / "p-lstm-1"]) == {tmp_path / "a" / "runs" / "p-lstm-1": "p-lstm-1"}
