"""The GPU suite (benchmarks/gpu/) in its dry run: the same code at tiny sizes on the CPU, so it
cannot rot between GPU runs. Each part must leave its report, CSV, PNG and JSON, headed by the
run's metadata, in at most 8 files (what the device tool brings back)."""

import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from result_cache import cache_folder

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("ale_py", reason="the learner and pong parts step Atari Pong (pip install 'fwrl[atari]')")


# A part's dry run is kept (result_cache.py) once its checks passed, keyed by everything it runs
# (the suite, the fwrl package, this file, the Python and its torch): it runs again only when one
# of them changed.
DRY_RUN_CACHE = cache_folder("gpu-suite")
KEYED = ("benchmarks/gpu", "fwrl")


def _dry_run_key(part: str) -> str:
    import torch

    digest = hashlib.sha256(f"{part} {sys.version} {torch.__version__}".encode())
    files = [Path(__file__).resolve()] + sorted(p for folder in KEYED for p in (ROOT / folder).rglob("*")
                                                 if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _dry_run(part: str, out: Path, check: Callable[[Path], None]) -> None:
    """Run ``part`` of the suite in its dry run into ``out`` (or take the files of an earlier run
    with the same key, whose checks passed), check what every part leaves, then ``check`` it."""
    cached = DRY_RUN_CACHE / _dry_run_key(part) if DRY_RUN_CACHE is not None else None
    folder = out / part
    if cached is not None and (cached / "passed").is_file():
        shutil.copytree(cached / part, folder)
    else:
        env = {**os.environ, "PYTHON": sys.executable, "FWRL_COMMIT": "test", "FWRL_SITE": str(out / "site")}
        proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run", part, str(out)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) <= 8, files  # nothing stray
    expected = [f"{part}{suffix}" for suffix in (".md", ".png", ".json", ".log")]
    # pong keeps each run's metrics.csv in place of its CSV, procgen beside it
    expected += ["metrics-rdn.csv", "metrics-lstm.csv"] if part == "pong" else [f"{part}.csv"]
    expected += ["metrics-srwm.csv", "metrics-lstm.csv"] if part == "procgen" else []
    assert set(expected) <= set(files), files
    meta = json.loads((folder / f"{part}.json").read_text())["meta"]
    assert meta["commit"] == "test" and meta["dry_run"] is True and meta["torch"]
    report = (folder / f"{part}.md").read_text()
    assert "commit `test`" in report and "Dry run" in report
    assert (folder / f"{part}.png").stat().st_size > 1000
    check(folder)
    if cached is not None and not (cached / "passed").is_file():
        _keep(folder, cached, part)


def _keep(folder: Path, cached: Path, part: str) -> None:
    """Copy a checked dry run into the cache, whole or not at all (a cache that cannot be written
    is no error)."""
    staging = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
    try:
        shutil.copytree(folder, staging / part)
        (staging / "passed").write_text("")
        os.replace(staging, cached)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)


def test_learner_part_dry_run(tmp_path):
    _dry_run("learner", tmp_path, _check_learner_part)


def _check_learner_part(folder: Path) -> None:
    with (folder / "learner.csv").open() as f:
        f.readline()  # the metadata line
        rows = list(csv.DictReader(f))
    assert not [(r["core"], r["note"]) for r in rows if r.get("note")]  # a row that failed says why
    # the CUDA-graph rows ("lstm graph", "rdn x8 graph", ...) need a GPU: the dry run leaves them out, and the
    # rows of cores that run as rdn's do (delta_net, srwm), the goal width's lstm and the layouts it only passes
    # on (their commands are parsed by test_every_learner_row_is_a_command_fwrl_takes)
    assert [r["core"] for r in rows] == ["lstm x8", "rdn x8", "rdn", "rdn x8 2 learners"]
    assert [int(r["envs_per_worker"]) for r in rows] == [2, 2, 1, 2]  # the dry run's widths
    assert [int(r["acting_threads"]) for r in rows] == [1, 1, 1, 1]
    assert [int(r["learners"]) for r in rows] == [1, 1, 1, 2]  # two ranks, each acting in its process
    assert [int(r["worker_splits"]) for r in rows] == [1, 1, 1, 1]
    for row in rows:
        assert float(row["agent_steps_per_s"]) > 0 and 0 < float(row["of_ceiling"]) < 1.5, row
    data = json.loads((folder / "learner.json").read_text())
    assert sorted(data["env_ceilings"]) == ["1", "2"]  # each width's rows against their own ceiling
    assert len(data["goals"]) == 5  # both widths, the rate; the goal width's lstm goals are left out with its row
    assert [g["met"] for g in data["goals"] if g["measured"] is None] == ["not measured", "not measured"]
    assert {g["met"] for g in data["goals"] if g["measured"] is not None} <= {"yes", "NO"}
    assert "at 2 envs per worker" in (folder / "learner.md").read_text()
    profile = (folder / "learner-profile-lstm.md").read_text()  # the lstm row's acting thread, op by op
    assert "| fwrl/env_wait |" in profile and "Self CPU time total" in profile  # its stages and ops tables
    # a forward in the window shows its torch ops (a 2 s window on a machine loaded past its two cores once
    # held only 20 waits for the workers, no forward)
    assert "aten::" in profile if "| fwrl/inference_forward |" in profile else "fwrl/acting_call" in profile
    assert "learner-profile-lstm.md" in (folder / "learner.md").read_text()
    two = data["two_learner_ranks"]
    assert two["two_ranks"]["allreduce_ms"] > 0 and two["one_rank"]["update_ms"] > 0


def test_every_learner_row_is_a_command_fwrl_takes():
    """Every row of the learner part, those the dry run leaves out included (graphs, other cores, layouts),
    as the box and as the dry run would run it: a command line ``fwrl`` parses (a renamed flag or a
    value it no longer takes fails here, not on a lent box)."""
    import contextlib
    import io

    import yaml

    from fwrl.launch.cli import main

    suite = _suite()
    for dry in (False, True):
        _, batch = suite._learner_workers_and_batch(dry)
        for label, core, envs, extra in suite.LEARNER_RUNS:
            argv = [str(a) for a in suite.learner_row_args(suite.learner_common_args(dry), core, envs, extra, batch)]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main([*argv, "--print-config"])  # the settings checked, nothing run
            assert code == 0, (label, dry, err.getvalue()[-2000:])
            config = yaml.safe_load(out.getvalue())
            assert config["core"] == core and config["envs_per_worker"] == envs, (label, dry)
            if "--learners" in extra:  # B per rank
                assert config["batch_size"] == batch // int(extra[extra.index("--learners") + 1]), label
            default = "off" if dry else "auto"  # the dry run keeps the box's path (auto is off on CUDA)
            assert config["learner_process"] == ("on" if "--learner-process" in extra else default), label


def _suite():
    """benchmarks/gpu/suite.py as a module (it is a script, not part of the package)."""
    sys.path.insert(0, str(ROOT / "benchmarks/gpu"))
    try:
        import suite
    finally:
        sys.path.remove(str(ROOT / "benchmarks/gpu"))
    return suite


def test_pong_part_dry_run(tmp_path):
    _dry_run("pong", tmp_path, _check_pong_part)


def _check_pong_part(folder: Path) -> None:
    summary = json.loads((folder / "pong.json").read_text())
    assert sorted(summary["agents"]) == ["lstm", "rdn"]  # the rdn agent and its control, side by side
    assert summary["goals"][0]["goal"].startswith("rdn: mean return")
    assert summary["goals"][1]["goal"].startswith("lstm: best mean return") and summary["goals"][1]["met"] == "NO"
    for name, agent in summary["agents"].items():
        assert agent["trained"] and agent["final"][1] > 0, (name, agent)  # agent steps were trained
        assert agent["evaluation_mean"] is not None and -21 <= agent["evaluation_mean"] <= 21
        assert all(0 < e <= 1.7918 for e in agent["entropy_first_min_last"])  # nats per step, at most ln 6
        assert agent["grad_norm_first_max_last"][1] > 0 and agent["steps_per_second"] > 0
        probe = agent["init_probe"]
        assert probe["init_grad_norm"] > 0 and len(probe["entropy"]) == 2
    assert "fwrl train --preset pong-cpu --core rdn" in summary["commands"]["rdn"]
    report = (folder / "pong.md").read_text()
    assert "| rdn |" in report and "| lstm |" in report
    log = (folder / "pong.log").read_text()
    assert "[rdn] " in log and "[lstm] " in log  # each run's output, labelled


def test_procgen_part_dry_run(tmp_path):
    pytest.importorskip("procgen", reason="the procgen part steps ProcGen (pip install --no-deps procgen2 gym3)")
    _dry_run("procgen", tmp_path, _check_procgen_part)


def _check_procgen_part(folder: Path) -> None:
    summary = json.loads((folder / "procgen.json").read_text())
    games = ["bigfish", "starpilot"]  # the dry run's two of the six
    assert summary["env"].startswith("procgen:bigfish+starpilot?distribution=easy&num_levels=200&start_level=0")
    assert sorted(summary["agents"]) == ["lstm", "srwm"] and sorted(summary["random_returns"]) == sorted(games)
    assert "fwrl train --preset srwm-procgen-easy --env" in summary["commands"]["srwm"]
    assert "--preset srwm-procgen-easy --core lstm" in summary["commands"]["lstm"]
    for name, agent in summary["agents"].items():
        assert agent["trained"] and agent["agent_steps"] > 0, (name, agent)
        assert sorted(agent["games"]) == games
        # fwrl evaluate ran on the training levels and the paper's three test splits, normalised per game
        assert sorted(agent["eval_normalised"]) == ["test", "test_1000", "test_1200", "test_1400", "train"]
        assert agent["test_splits_scored"] == 3
        for game in games:
            assert agent["games"][game]["eval_test_1000_normalised"] is not None
    goals = [g["goal"] for g in summary["goals"]]
    assert goals[0].startswith("srwm: games whose training return") and goals[1].startswith("srwm: test splits")
    rows = list(csv.DictReader(line for line in (folder / "procgen.csv").open() if not line.startswith("#")))
    assert {(r["agent"], r["game"]) for r in rows} == {(a, g) for a in ("srwm", "lstm") for g in games}
    report = (folder / "procgen.md").read_text()
    assert "| bigfish |" in report and "| starpilot |" in report and "SRWM paper's figures" in report
    log = (folder / "procgen.log").read_text()
    assert "[srwm] " in log and "[lstm] " in log and "random policy, bigfish" in log


def test_kernels_part_dry_run(tmp_path):
    _dry_run("kernels", tmp_path, _check_kernels_part)


def _check_kernels_part(folder: Path) -> None:
    data = json.loads((folder / "kernels.json").read_text())
    assert "passed" in data["tests"]
    cores = {row["core"] for row in data["rows"] if row.get("fwd_bwd_ms")}
    assert cores == {"delta_rule", "gated_delta_rule", "srwm", "rdn", "delta_rnn", "delta_lstm", "sr_delta_net"}
    assert any(g["goal"].startswith("delta_rule") for g in data["goals"])
    gated = [g for g in data["goals"] if g["goal"].startswith("gated delta rule / delta rule")]
    assert len(gated) == 2 and all(g["target"] == "<= 1.2x" for g in gated)
    assert {row["core"] for row in data["rows"] if row.get("dtype") == "bf16"} == {"delta_rule"}  # one bf16 pass
    capped = {(row["core"], row["impl"]) for row in data["rows"] if "maxnreg=" in row["impl"] and row.get("fwd_bwd_ms")}
    assert {core for core, _ in capped} == {"delta_rule", "rdn", "srwm"}  # the register-cap A/B ran
    assert "Register cap A/B" in (folder / "kernels.md").read_text()


def test_kernel_goals_from_the_h100_rows(tmp_path):
    """The first H100 timings (benchmarks/results/gpu/kernels-h100) re-derived with --rebuild: the delta
    rule's Triton rows are labelled with their split (``triton[split=auto]``) and still count for its
    goals, and FLA's comparison is one line per shape at which both kernels were timed."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    source = json.loads((ROOT / "benchmarks/results/gpu/kernels-h100/kernels.json").read_text())
    (folder / "kernels.json").write_text(json.dumps(source))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/suite.py"), "--rebuild", str(folder),
                           "kernels"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    goals = {g["goal"]: g for g in json.loads((folder / "kernels.json").read_text())["goals"]}
    small = goals["delta_rule: fused fwd+bwd vs eager at 32x51x4x32"]
    assert small["met"] == "yes" and abs(small["measured"] - 62.703 / 0.929) < 0.1
    fla = [g for name, g in goals.items() if "FLA" in name]
    assert len(fla) == 1 and abs(fla[0]["measured"] - 1.886 / 0.929) < 0.01, fla
    assert "Register cap A/B" not in (folder / "kernels.md").read_text()  # that run had no capped rows
    assert goals["delta_lstm: fused fwd+bwd vs eager at 256x101x8x64"]["met"] == "NO"
    gated = goals["gated delta rule / delta rule, fused fwd+bwd at 32x51x4x32"]  # not timed on that box
    assert (gated["target"], gated["met"]) == ("<= 1.2x", "not measured")
    assert "| delta_rule: fused fwd+bwd vs eager at 32x51x4x32 | >= 50x | 67.5 | yes |" in (
        folder / "kernels.md").read_text()


def test_rows_of_the_learner_part_are_named_or_refused(tmp_path):
    """``--rows`` (a box with less time than the whole learner part) takes labels of its rows only,
    and names the valid ones when one is not."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/suite.py"), "--dry-run", "learner",
                           "--rows", "rdn x8 graph, rdn x8 graf", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "unknown: 'rdn x8 graf'" in proc.stderr and "rdn x8 graph shared" in proc.stderr
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/suite.py"), "--dry-run", "pong",
                           "--rows", "rdn x8 graph", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "got part pong" in proc.stderr


def test_rebuild_names_what_it_needs(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/suite.py"), "--rebuild", str(tmp_path),
                           "kernels"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "kernels.json" in proc.stderr and str(tmp_path) in proc.stderr


def test_resume_skips_the_passes_an_earlier_run_timed():
    """--resume: the H100 run at c7ffd00 timed every fp32 goal pass, FLA's fused recurrent kernel at the RL
    shape and bf16 of three cores; its delta_rnn bf16 pass was stopped, so that pass and every later one
    are timed again."""
    suite = _suite()
    meta: dict = {}
    rows = suite._resumed_rows(ROOT / "benchmarks/results/gpu/kernels-h100/kernels.json", meta)
    assert meta["resumed_from"]["commit"].startswith("c7ffd00") and meta["resumed_from"]["rows"] == len(rows)
    assert all(r["note"].startswith("timed at c7ffd00") for r in rows)
    pending = [(core, impls, dtypes, caps) for core, impls, dtypes, shapes, caps in suite._kernel_passes()
               if not suite._pass_timed(rows, core, impls, dtypes, shapes, caps)]
    passes = suite._kernel_passes()
    assert len(pending) == len(passes) - 10
    # the gated delta rule (issue 70) and the register-cap A/B passes (large shape, then small) came after
    # that run: pending, in goal order, before delta_rnn's bf16
    assert pending[0] == ("gated_delta_rule", ("reference", "triton"), ("fp32",), ())
    assert pending[1:7] == [(core, ("triton",), ("fp32",), (255, 128)) for core in ("delta_rule", "rdn", "srwm")] * 2
    assert pending[7] == ("gated_delta_rule", ("reference", "triton"), ("bf16",), ())
    assert pending[8] == ("delta_rnn", ("reference", "triton"), ("bf16",), ())
    # --retime delta_lstm drops that core's rows: its fp32 goal pass is pending again
    retimed: dict = {}
    kept = suite._resumed_rows(ROOT / "benchmarks/results/gpu/kernels-h100/kernels.json", retimed, {"delta_lstm"})
    assert retimed["resumed_from"]["retimed"] == ["delta_lstm"] and retimed["resumed_from"]["rows"] == len(kept)
    assert len(kept) == len(rows) - 4 and all(r["core"] != "delta_lstm" for r in kept)
    assert not suite._pass_timed(kept, "delta_lstm", ("reference", "triton"), ("fp32",),
                                 ["32,51,4,32", "256,101,8,64"])
    assert suite._pass_timed(kept, "rdn", ("reference", "triton"), ("fp32",), ["32,51,4,32", "256,101,8,64"])
    # a run that resumed keeps each row's own origin: the H200 run at ed3df79 timed four cores and
    # resumed the H100's other rows from c7ffd00
    again = suite._resumed_rows(ROOT / "benchmarks/results/gpu/kernels-h200-ed3df79/kernels.json", {})
    origins = {r["core"]: r["note"] for r in again
               if r["impl"].startswith("triton") and r["dtype"] == "fp32" and r["shape"] == "32x51x4x32"}
    assert origins["delta_rule"].startswith("timed at c7ffd00"), origins
    assert origins["rdn"].startswith("timed at ed3df79, NVIDIA H200"), origins


def test_register_cap_rows_compare_each_cap_with_the_default():
    suite = _suite()
    rows = [{"core": "rdn", "dtype": "fp32", "shape": "256x101x8x64", "impl": "triton", "fwd_bwd_ms": 25.7,
             "speedup_fwd_bwd": 7.94},
            {"core": "rdn", "dtype": "fp32", "shape": "256x101x8x64", "impl": "triton[maxnreg=255]", "fwd_bwd_ms": 26.0},
            {"core": "rdn", "dtype": "fp32", "shape": "256x101x8x64", "impl": "triton[maxnreg=128]", "fwd_bwd_ms": 13.0,
             "speedup_fwd_bwd": 15.7},
            {"core": "rdn", "dtype": "fp32", "shape": "256x101x8x64", "impl": "reference", "fwd_bwd_ms": 204.0,
             "fwd_bwd_peak_mib": 6952.0}]
    caps = suite._register_cap_rows(rows)
    assert [(r["maxnreg"], r["vs_default"]) for r in caps] == [(255, 1.0), (128, 2.0)]
    assert suite._register_cap("triton[split=auto,maxnreg=128]") == 128 and suite._register_cap("triton") is None
    # the goals keep to the default binary: the uncapped row, not the faster capped one
    large = [g for g in suite._kernel_goals(rows) if g["goal"] == "rdn: fused fwd+bwd vs eager at 256x101x8x64"]
    assert large[0]["measured"] == 7.94  # not the capped row's 15.7


def test_a_dry_run_never_writes_into_the_committed_results(tmp_path):
    """A dry run's figures mean nothing: asked to write under benchmarks/results it refuses before it
    runs anything (it used to replace the committed GPU figures); without OUT_DIR it takes a new
    temporary folder (the part functions are what the tests above run)."""
    results = ROOT / "benchmarks" / "results" / "gpu"
    before = sorted(p.relative_to(ROOT) for p in results.rglob("*"))
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu/run.sh"), "--dry-run", "kernels", str(results)],
                          env={**env, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "a dry run writes no figures into" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.relative_to(ROOT) for p in results.rglob("*")) == before
