"""``fwrl bench throughput`` and ``fwrl bench kernels`` through the command line.

The throughput bench's time shares add up per thread (a stage under way at an interval's end split
between the intervals), it measures learner ranks acting in their own processes, profiles the
acting thread per call, measures acting alone (``--acting-only``), refuses a profile it cannot
take, picks the stem as ``fwrl train`` does, starts its window at the first update and says why
when the window holds none; the kernel bench's options (``--json-path``, a missing Triton). Runs
are ``memory:`` tasks with tiny agents, through ``fwrl.launch.cli.main`` in this process.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time

import pytest
import torch

from cli_runs import assert_refused, run_cli


TINY = ["--core", "lstm", "--core-opt", "hidden_size=16", "--num-workers", "1", "--envs-per-worker", "4",
        "--batch-size", "4", "--unroll-length", "5", "--log-interval", "1"]


def test_stage_split_at_interval_ends():
    """A stage under way when an interval is collected counts in each interval only its own part
    (a wait that began before an interval cannot make its share exceed 100%)."""
    from fwrl.agents.stage_timer import StageTimer

    timer = StageTimer()
    with timer.stage("learner_idle"):
        time.sleep(0.15)
        first, first_wall = timer.collect()
        time.sleep(0.05)
    second, second_wall = timer.collect()
    assert first["learner_idle"] <= first_wall and second["learner_idle"] <= second_wall
    assert 0.03 < second["learner_idle"] < 0.1, second


def test_a_stage_whose_block_raises_counts_its_time_and_closes():
    from fwrl.agents.stage_timer import StageTimer

    timer = StageTimer()
    with pytest.raises(KeyError):
        with timer.stage("env_wait"):
            time.sleep(0.02)
            raise KeyError("the block's own error goes on")
    assert not timer._open  # nothing left under way to count into later intervals
    seconds, _ = timer.collect()
    assert seconds["env_wait"] >= 0.02
    with torch.profiler.profile() as prof, timer.stage("inference_forward"):
        torch.ones(2).sum()
    assert "fwrl/inference_forward" in {event.name for event in prof.events()}  # its range under a profiler


def test_bench_throughput_shares_sum_to_100_percent_per_thread(tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3, "--json-path", out])
    assert code == 0, err
    record = json.loads(out.read_text())
    threads = record["thread_shares"]
    assert set(threads) == {"acting", "learner"}
    for thread, shares in threads.items():
        assert all(0 <= value <= 1 for value in shares.values()), (thread, shares)
        assert sum(shares.values()) == pytest.approx(1.0, abs=0.005), (thread, shares)
    assert "share of this thread's wall time" in stdout
    assert " 0 steps/s" not in err


def test_bench_throughput_measures_learner_ranks_acting_in_their_processes(tmp_path):
    """``--learners 2``: two ranks, each acting in its own process over half the workers; the rate
    counts both ranks' steps (rank 0's rows), the record and the table say how many ranks."""
    out = tmp_path / "bench.json"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3,
                                 "--num-workers", 2, "--learners", 2, "--json-path", out])
    assert code == 0, err
    # the ranks' launcher left this process's own signal handlers in place (it installs its own)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    record = json.loads(out.read_text())
    assert record["learners"] == 2 and record["acting_threads"] == 1
    assert record["steps_per_second"] > 0 and record["updates"] > 0
    per_update = record["config"]["batch_size"] * record["config"]["unroll_length"] * 2  # every rank's B x T
    assert record["agent_steps"] % per_update == 0, record
    assert record["shares"]["share/learner_allreduce"] > 0  # the ranks summed their gradients
    assert re.search(r"learner ranks\s+│\s+2", stdout), stdout


def test_bench_throughput_profiles_the_acting_thread_per_call(tmp_path):
    report = tmp_path / "profile" / "acting.md"
    code, _, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2], "--stem", "auto",
                            "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 1, "--profile-seconds", 2,
                            "--profile-path", report])
    assert code == 0, err
    text = report.read_text()
    calls = int(re.search(r"Profiled window: ([\d,]+) acting calls", text).group(1).replace(",", ""))
    assert calls > 10, text[:400]
    stages = {name: int(count.replace(",", "")) for name, count in re.findall(r"^\| fwrl/(\w+) \| ([\d,]+) \|", text, re.M)}
    assert {"env_wait", "inference_forward", "rollout_bookkeeping"} <= set(stages), text[:800]
    assert "acting_call" not in stages
    # a call that served workers has two forward ranges (the forward, the actions' copy to the host)
    assert stages["inference_forward"] % 2 == 0 and 0 < stages["inference_forward"] <= 2 * calls, stages
    assert "## Ops by own CPU time" in text and "aten::" in text
    assert not list(report.parent.glob("*.tmp*"))  # written atomically


def test_bench_throughput_acting_only_measures_acting_without_updates(tmp_path):
    """``--acting-only``: the learner makes no update; every batch goes back to the store unread and
    counts as agent steps, so the rate is the acting path's alone (and the run does not stall on a
    full store); with learner ranks it is refused."""
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", *TINY[:-2],
                                 "--stem", "auto", "--ceiling-seconds", 0, "--warmup", 1, "--seconds", 3,
                                 "--acting-only", "--json-path", out])
    assert code == 0, err
    record = json.loads(out.read_text())
    assert record["acting_only"] is True and record["updates"] == 0
    per_batch = record["config"]["batch_size"] * record["config"]["unroll_length"]
    assert record["agent_steps"] > 0 and record["agent_steps"] % per_batch == 0, record
    assert record["shares"]["share/learner_backward"] == 0
    assert "none (--acting-only" in stdout
    code, _, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay?delay=3", "--learners", 2,
                            "--acting-only"])
    assert_refused(code, err, "drop --learners or --acting-only")


@pytest.mark.parametrize("flags, needle", [
    (["--profile-seconds", 0], "profile_seconds=0 is not valid"),
    (["--paths", "all"], "--profile-path profiles one measured run"),
    (["--learners", 2], "--learners 2 runs 2: drop --learners or --profile-path"),
])
def test_bench_throughput_refuses_a_profile_it_cannot_take(tmp_path, flags, needle):
    report = tmp_path / "p.md"
    code, _, err = run_cli(["bench", "throughput", "--env", "atari:Pong", *flags, "--profile-path", report])
    assert_refused(code, err, needle)
    assert not report.exists()


def test_bench_picks_the_stem_as_train_does(tmp_path, monkeypatch):
    """Without --env the bench runs its own Pong with the nature stem; with --env, stem auto."""
    pytest.importorskip("minatar")
    code, out, err = run_cli(["bench", "throughput", "--env", "minatar:breakout", "--print-config"])
    assert code == 0, err
    assert "stem: auto" in out, out
    code, out, err = run_cli(["bench", "throughput", "--print-config"])
    assert code == 0, err
    assert "stem: nature" in out and "env: atari:Pong" in out, out


def test_bench_window_starts_at_the_first_update():
    from fwrl.launch.bench.throughput import window_summary

    rows = [{"time": str(t), "agent_steps": str(s), "updates": str(u), "steps_per_second": "1"}
            for t, s, u in [(1, 0, 0), (5, 0, 0), (9, 0, 0), (12, 640, 1), (13, 1280, 2), (14, 1920, 3)]]
    result = window_summary(rows, warmup=5.0)
    assert (result.agent_steps, result.seconds, result.updates) == (1280, 2.0, 2)  # from 12 s, not from 5 s


def test_a_window_of_seconds_ends_at_the_first_row_that_long_after_its_start():
    """Rows a log interval apart come with jitter: a one-second window whose next row is logged
    1.04 s after its start still holds that row (the profile after it starts at the same row), and
    the row after that is left out."""
    from fwrl.launch.bench.throughput import window_summary

    rows = [{"time": str(t), "agent_steps": str(s), "updates": str(u), "steps_per_second": "1"}
            for t, s, u in [(0.5, 0, 0), (1.02, 20, 1), (2.06, 60, 3), (3.1, 100, 5)]]
    result = window_summary(rows, warmup=1.0, seconds=1.0)
    assert (result.agent_steps, result.updates) == (40, 2)
    assert abs(result.seconds - 1.04) < 1e-9


def test_bench_without_an_update_in_its_window_says_why_not(tmp_path, monkeypatch):
    """A first batch that takes longer than the window and the wait for a first update after it (1 s
    here, 2 minutes by default): no '0 steps/s', but what the learner waited for."""
    import fwrl.launch.bench.throughput

    monkeypatch.setattr(fwrl.launch.bench.throughput, "FIRST_UPDATE_WAIT", 1.0)
    code, out, err = run_cli(["bench", "throughput", "--env", "memory:cue_delay", "--core", "lstm",
                              "--core-opt", "hidden_size=8", "--num-workers", "1", "--envs-per-worker", "1",
                              "--batch-size", "64", "--unroll-length", "400", "--ceiling-seconds", "0",
                              "--warmup", "0", "--seconds", "2"])
    said = err.splitlines()[-1]  # after the bench's own progress lines
    assert code == 2 and said.startswith("fwrl: error: no update finished"), err
    for needle in ("first batch", "--batch-size", "--seconds"):
        assert needle in said, said
    assert "Traceback" not in err and "steps/s" not in out


def test_bench_kernels_json_path_and_its_deprecated_alias(capsys):
    from fwrl.launch.bench import kernels as benchmark

    assert benchmark._parser().parse_args(["--json-path", "a.json"]).json_path == "a.json"
    assert benchmark._parser().parse_args(["--json", "b.json"]).json_path == "b.json"


def test_missing_triton_names_the_extra(monkeypatch):
    from fwrl.launch.bench import kernels as benchmark

    for name in [m for m in sys.modules if m == "triton" or m.startswith(("triton.", "fwrl.kernels.triton"))
                 or m.startswith("fwrl.kernels.") and ".fused_recurrent" in m]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "triton", None)
    args = benchmark._parser().parse_args(["--core", "rdn", "--dry-run"])
    inputs = benchmark._inputs("rdn", (2, 3, 1, 4), torch.float32, "cpu")
    (runner, note, _), = benchmark._triton_runners("rdn", args, inputs).values()
    assert runner is None and "pip install -e '.[kernels]'" in note, note
