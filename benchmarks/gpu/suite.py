"""The GPU proof (issue 14): kernels, learner throughput and a real game, one part per command.

Run through ``benchmarks/gpu/run.sh [--dry-run] PART [OUT_DIR]`` (it installs the
carried wheels first). Each part stays well inside 10 minutes on an H100 with
16 cores and writes, into ``OUT_DIR/<part>/``, a markdown report, a CSV, a PNG
and the raw JSON, each headed by the commit, GPU, torch and triton versions:

- ``kernels``: the CUDA tests (the CUDA and sm_90 tests of every
  ``tests/*/test_kernels_*.py``, and ``tests/unit/test_gpu_data_path.py``), then ``fwrl bench kernels`` for every
  recurrence at its preset shapes and at the issue's two goal shapes, fp32 and
  bf16, against the eager reference and FLA's ``fused_recurrent_delta_rule``
  and ``chunk_delta_rule`` for the delta rule, then ``torch.compile`` of the
  reference in fp32 while the part's time lasts;
- ``learner``: ``fwrl bench throughput`` on Atari Pong (RFWP settings, impala
  stem, one worker per core; the default env path, ale-py's C++ vector env)
  for lstm (its acting thread then profiled op by op), rdn, both again with 8 envs per worker
  (against the env ceiling at that width) and with CUDA-graph acting, delta_net, srwm and elstm
  with RTRL, the env ceiling measured once per width on the same workers; the env ceiling of
  each env path (the Python chain and ale-py's vector env, ``fwrl bench envs --paths``) on
  those workers; then
  two learner ranks sharing the GPU (``benchmarks/multi_learner_overhead.py``);
- ``pong``: 8-minute ``fwrl train`` runs on Pong of the rdn agent (the settings with which it learned
  Pong on the CPU: ``pong-cpu`` with ``--core rdn``) and, side by side on the other half of the cores,
  the preset's LSTM as the control (8 envs per worker), then the curves of the return, the policy
  entropy and the gradient norm, the init probe of each agent (``fwrl info --probe``) and
  ``fwrl evaluate``.
- ``procgen``: the SRWM paper's multi-task ProcGen setting (Sec. 4.3: bigfish, fruitbot, maze, leaper,
  plunder, starpilot; easy; training levels 0-199; the ``srwm-procgen-easy`` preset), the srwm agent and
  the lstm agent side by side on half the cores each for 5 minutes, then each game's training return
  against a random policy's on the same levels, and ``fwrl evaluate`` of both on the training levels
  and the paper's three test splits (levels 1000-1199, 1200-1399, 1400-1599), min-max normalised with
  ProcGen's constants (Cobbe et al. 2020). ProcGen has no cp312 wheel: ``stage_procgen.sh`` puts the
  cp311 one (its C library is loaded by cffi, not built against CPython) and the system libraries it
  links into ``.procgen-site/`` in a command of its own (the wheel alone is most of a call's 64 MiB).

``--dry-run`` runs the same code at tiny sizes on the CPU (CI does, so the
suite cannot rot between GPU runs); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("kernels", "learner", "pong", "procgen")
KERNEL_CORES = ("delta_rule", "gated_delta_rule", "srwm", "rdn", "delta_rnn", "delta_lstm", "sr_delta_net")
DTYPES = ("fp32", "bf16")
# The goal shapes (B, T, H, D) for every recurrence, beside each one's preset shapes.
GOAL_SHAPES = ((32, 51, 4, 32), (256, 101, 8, 64))
GOALS = {
    "speedup_small": 50.0,  # fused fwd+bwd vs eager reference at (32, 51, 4, 32)
    "speedup_large": 15.0,  # ... at (256, 101, 8, 64)
    "memory_large": 20.0,  # eager reference peak memory / fused peak memory at (256, 101, 8, 64)
    "vs_fla": 1.3,  # delta rule fused vs FLA fused_recurrent_delta_rule, RL shapes
    "gated_vs_delta": 1.2,  # gated delta rule fused fwd+bwd at most 1.2x the delta rule's, same shape (issue 70)
    "lstm_of_ceiling": 0.70,  # lstm agent steps/s / env ceiling
    "rdn_of_lstm": 0.80,  # rdn agent steps/s / lstm's
    "rdn_steps": 18_800.0,  # rdn x8 agent steps/s on the whole box: 2x c7ffd00's 9,397 (issue 36)
}
# (row label, core, envs per worker, extra flags) in the order the learner part runs them, the goals'
# rows first. The first GPU run (H200, 16 workers x 2 envs) found the acting thread busy with the eager
# forward (60-65% of its time) and the store (21-25%), the env workers waiting, and the four cores acting
# within 10% of each other: a cost per acting step, not per slot. So lstm and rdn run again with 8 envs
# per worker (each forward then serves 4x the slots; their env ceiling is measured at that width too),
# and with the forward replayed as CUDA graphs (--inference-graph). The dry run (CPU) skips the graph rows.
# The H200 run at ed3df79 (benchmarks/results/gpu/learner-h200-ed3df79) measured the eager rows: 8 envs
# per worker 2.4x (lstm) and 2.8x (rdn) the 2-env rate, still 0.40 of the env ceiling; two acting
# threads 0.83x one (the forward's share rose from 57% to 70%: the two threads' launches contend), two
# learner processes 1.03x; and, before the part's budget ran out, "lstm graph" at about 8,000 agent
# steps/s against the eager 4,571 (1.75x). So the graphed rows now run right after the two eager 2-env
# rows (which give the ceiling and the profile), at both widths and with two learner processes, and
# the eager x8 layouts after them. The H100 at 5902696 ran the graphed rows (graphs 1.56x / 1.77x eager at
# 2 envs per worker, 1.19x / 1.28x at 8; rdn x8 graph 10,187 agent steps/s, 0.54 of its ceiling): the
# wide graphed rows now run first, then the same with worker splits (SPLIT2), then the rest. The H100 at
# 19cb767 (learner-h100-19cb767): splits 0.95-0.97x, 16 envs per worker in two splits the best row (12,520),
# and its profile put 24% of the acting thread in stream syncs of 1.6 ms, waiting for the acting step's
# kernels behind the learner's, and 3.0 ms of each 7.4 ms call waiting for workers (dynamic batching waits
# for half of them once one is ready). So after the two wide graphed rows come rdn's layouts against them in
# one run: rdn with no learner (ACTING_ONLY), high-priority acting streams (PRIORITY, "prio"), no batching
# wait (NO_WAIT, "nowait"), both, two graphed acting threads (TWO_THREADS), and
# lstm with both; 14 workers (FEWER_WORKERS, "w14"); rdn at 16 envs per worker plain and with both; rdn
# with two learner processes (never reached yet); then the eager and split rows.
# "2 threads"
# acts with two threads (--acting-threads 2, each over half the workers), "2 learners" in two processes
# (--learners 2 sharing the GPU, each rank acting over half the workers with B / 2, so an update still
# takes B x T agent steps).
PROFILE_FILE = "learner-profile-{core}.md"  # the acting thread of the first row run (its core), op by op
# the acting thread of the acting-only row, op by op: its calls with no learner beside them
ACTING_ONLY_PROFILE_FILE = "learner-profile-acting-only.md"
LEARNER_ENVS_PER_WORKER = 2  # the goal rows' width (monobeast's 2 envs per actor process)
WIDE_ENVS_PER_WORKER = 8
GRAPH = ("--inference-graph",)
EAGER = ("--no-inference-graph",)  # what every other row adds: graphs are the default on CUDA since ed3df79
TWO_LEARNERS = ("--learners", "2")
# Double-buffered sampling (--worker-splits 2, sample-factory's worker_num_splits): each worker process
# steps its envs in two splits in turn, one while the learner acts for the other. The H100 at 5902696
# (learner-h100-5902696) left the graphed acting thread waiting for envs 37-42% of its time at 8 envs per
# worker while each worker, stepping at half its ceiling rate, waited for the forward's round trip.
# "x16 ... split2": 16 envs per worker in two splits of 8 (each split as wide as an x8 row's worker).
SPLIT2 = ("--worker-splits", "2")
PRIORITY = ("--acting-priority", "high")
# 14 env workers on the 16 cores (the row's flag comes after the part's --num-workers: the last one counts):
# the env ceiling is measured with the workers alone, while a run also keeps the acting and the learner
# thread busy; at 19cb767 the acting thread waited for envs 42-47% of its time while every worker stepped
# at 55% of its ceiling rate. "w14" faster than its 16-worker row says the cores are oversubscribed.
FEWER_WORKERS = ("--num-workers", "14")
# No dynamic-batching wait (--acting-batch-wait 0, "nowait"): by default the acting thread, once a worker is
# ready, waits up to 4 ms for half the workers (a default measured for eager forwards on a CPU). At 19cb767
# the acting thread spent 3.0 ms of each 7.4 ms call (about 9 workers) waiting for workers while the ready
# ones idled; each worker's cycle was 12.6 ms (its env step: 7 ms at the ceiling rate).
NO_WAIT = ("--acting-batch-wait", "0")
# No updates (--acting-only, "acting-only"): the learner hands every batch back to the store unread, so
# the row is the acting path's rate on this box with no learner beside it (neither its kernels on the
# GPU nor its Python on the GIL). Near the env ceiling: the learner's company is what holds acting back
# (the prio row and two learner processes say which part); near the plain row: the acting call itself is.
ACTING_ONLY = ("--acting-only",)
# Two graphed acting threads ("graph 2 threads"), each over half the workers on its own stream: at 19cb767
# 1.6 ms of each acting call went to a stream sync with the GIL released (the actions waiting for the
# step's kernels behind the learner's), time in which a second thread can stage, launch and complete its
# own call. Their graphed path passed its CUDA test at 19cb767 but has never been timed.
TWO_THREADS = ("--acting-threads", "2")
# Observations read from the workers' shared memory (--acting-staging shared, "shared"): at 35e8e0f the store's
# host work was 1.2 ms of each acting call, the largest part of it packing about 70 slots of frames into
# pinned staging; on the CPU proxy of the graphed path (acting_staging_proxy.md) shared staging cut the
# acting thread's host time per call of Pong frames from 1,475 to 974 us.
SHARED = ("--acting-staging", "shared")
# The learner's update in a process of its own (--learner-process on, "update process"; on a GPU since
# this row was added, never timed): the process trains the model's device memory through CUDA IPC, so
# the learner's Python (its launches, the optimiser's) no longer takes turns with the acting thread's at
# one GIL, while its kernels still share the GPU. Against the plain row and the acting-only row (1.19x the
# plain row at 35e8e0f: all the learner's company costs) it tells the GIL's part from the GPU's. Its
# peak_memory_mb is the run's process alone (the update process allocates its own activations).
UPDATE_PROCESS = ("--learner-process", "on")
# Order: what the next box most needs to know first (the part stops at its budget). At 35e8e0f (H200) the
# acting-only row reached 0.66 of the env ceiling and the prio, nowait and two-thread A/Bs did not pay
# (0.93-1.02x): the acting call's host work is the limit, so the rows never timed that change it come next:
# acting in two processes (two learner ranks, each acting over half the workers with its own interpreter),
# fewer workers than cores, 16 envs per worker; then the A/Bs already timed.
LEARNER_RUNS = (("lstm x8 graph", "lstm", WIDE_ENVS_PER_WORKER, GRAPH),
                ("rdn x8 graph", "rdn", WIDE_ENVS_PER_WORKER, GRAPH),
                ("rdn x8 graph update process", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *UPDATE_PROCESS)),
                ("rdn x8 graph shared", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *SHARED)),
                ("rdn x8 graph 2 learners", "rdn", WIDE_ENVS_PER_WORKER, (*TWO_LEARNERS, *GRAPH)),
                ("rdn x8 graph w14", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *FEWER_WORKERS)),
                ("rdn x16 graph", "rdn", 2 * WIDE_ENVS_PER_WORKER, GRAPH),
                ("rdn x8 graph acting-only", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *ACTING_ONLY)),
                ("rdn x16 graph split2", "rdn", 2 * WIDE_ENVS_PER_WORKER, (*GRAPH, *SPLIT2)),
                ("rdn x8 graph nowait", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *NO_WAIT)),
                ("rdn x16 graph prio nowait", "rdn", 2 * WIDE_ENVS_PER_WORKER, (*GRAPH, *PRIORITY, *NO_WAIT)),
                ("rdn x8 graph prio", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *PRIORITY)),
                ("rdn x8 graph prio nowait", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *PRIORITY, *NO_WAIT)),
                ("rdn x8 graph 2 threads", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *TWO_THREADS)),
                ("lstm x8 graph prio nowait", "lstm", WIDE_ENVS_PER_WORKER, (*GRAPH, *PRIORITY, *NO_WAIT)),
                # the eager rows of the wide graphed ones: graphed over eager in one run measures the graph
                # of the whole acting step (1.35x / 1.48x at 19cb767)
                ("lstm x8", "lstm", WIDE_ENVS_PER_WORKER, ()), ("rdn x8", "rdn", WIDE_ENVS_PER_WORKER, ()),
                ("lstm x8 graph split2", "lstm", WIDE_ENVS_PER_WORKER, (*GRAPH, *SPLIT2)),
                ("rdn x8 graph split2", "rdn", WIDE_ENVS_PER_WORKER, (*GRAPH, *SPLIT2)),
                ("lstm", "lstm", LEARNER_ENVS_PER_WORKER, ()), ("rdn", "rdn", LEARNER_ENVS_PER_WORKER, ()),
                ("lstm graph", "lstm", LEARNER_ENVS_PER_WORKER, GRAPH),
                ("rdn graph", "rdn", LEARNER_ENVS_PER_WORKER, GRAPH),
                ("rdn x8 2 learners", "rdn", WIDE_ENVS_PER_WORKER, TWO_LEARNERS),
                ("rdn x8 2 threads", "rdn", WIDE_ENVS_PER_WORKER, TWO_THREADS),
                ("rdn x8 split2", "rdn", WIDE_ENVS_PER_WORKER, SPLIT2),
                ("delta_net", "delta_net", LEARNER_ENVS_PER_WORKER, ()), ("srwm", "srwm", LEARNER_ENVS_PER_WORKER, ()),
                ("elstm rtrl", "elstm", LEARNER_ENVS_PER_WORKER, ("--core-opt", "grad=rtrl")))
# rows the dry run leaves out besides the graphed ones: other cores through the same code as rdn's rows,
# the goal width's lstm (rdn's row there gives that width its ceiling), and layouts whose flags the suite
# only passes on (each is trained in tests/e2e: two acting threads, worker splits, the RTRL eLSTM);
# tests/e2e/test_gpu_suite.py parses every row's command, these too
DRY_RUN_SKIPS = ("delta_net", "srwm", "lstm", "rdn x8 2 threads", "rdn x8 split2", "elstm rtrl")
# the plain graphed rows that the other layouts of their core and width are compared with
VARIANT_BASES = ("lstm x8 graph", "rdn x8 graph", "rdn x16 graph")
# the rows of rdn at 8 envs per worker, one per acting layout: the rate goal takes the best
WIDE_RDN_ROWS = ("rdn x8 graph", "rdn x8 graph update process", "rdn x8 graph shared", "rdn x8 graph prio", "rdn x8 graph nowait", "rdn x8 graph prio nowait",
                 "rdn x8 graph 2 threads",
                 "rdn x8 graph w14", "rdn x8 graph split2", "rdn x8 graph 2 learners", "rdn x8", "rdn x8 2 learners",
                 "rdn x8 2 threads", "rdn x8 split2")
# env paths whose ceilings the learner part compares (the box carries ale-py, not EnvPool)
ENV_PATHS = ("none", "ale")
PONG_SECONDS = 480
# The pong part's envs per worker: the first GPU run's acting thread, not the envs, set the rate at 2 per
# worker (3,553 agent steps/s for rdn on an H200); at 8 per worker one forward serves 4x the slots (the H100's
# rdn run: 9,400 agent steps/s, its acting thread still the limit).
PONG_ENVS_PER_WORKER = WIDE_ENVS_PER_WORKER
# The pong part's agents, trained side by side on half the cores each (each run has its own acting thread,
# the one that set the rate): rdn with the settings the stability work chose for Pong (issue 26, the pong-cpu
# preset: nature stem, T 20, B 32, lr 6e-4; rdn's start since d70062c: output_scale 1 with small heads, which
# on the 2-core CPU left random play at 1.26 M / 1.97 M agent steps and crossed 0 at 2.76 M / 3.18 M, two
# seeds; at output_scale 0.1, the default before, 2.49 M and 3.74 M); and the preset's own LSTM, the control,
# which did so at 1.5 M and 2.9 M. The H100's first pong run (rdn alone, 16 workers x 8 envs) stayed at random play for 4.3 M
# steps: the control tells a GPU-path fault (neither learns) from the rdn agent's slower, seed-dependent start.
PONG_AGENTS = {"rdn": ("--preset", "pong-cpu", "--core", "rdn"), "lstm": ("--preset", "pong-cpu")}
PONG_GOAL_AGENT = "rdn"
PONG_RANDOM_EXIT = -19.0  # a mean return above this has left random play (random: about -20.3)
PONG_LSTM_TARGET, PONG_LSTM_SECONDS = 18.0, 300  # issue 36: the lstm's mean return >= 18 within 5 minutes
PONG_EVAL_EPISODES = 4
# The register-cap A/B (fwrl bench kernels --maxnreg) at the large goal shape, fp32: the kernels' default
# maxnreg (255 up to 8 warps) leaves 1-2 programs per SM; a cap of 128 compiles the delta rule's backward
# without a spill at twice the programs per SM (kernels-h100/analysis.md, sections 2, 4 and 6). delta_lstm's
# streamed backward needs 248 registers: left out. On the H200 at ed3df79 the cap made the large shape's
# fwd+bwd 1.44x faster for the delta rule (1.08x rdn, 1.09x srwm); on the H100 at 5902696 the small goal
# shape's 1.08x (0.96x rdn, 1.06x srwm); on the H100 at 19cb767 the delta rule's 1.50x large, 0.92x small.
# So the delta rule's kernels cap at 128 from head dim 64 on (fused_recurrent.register_cap_for); its A/B
# rows keep 255, the uncapped binary, against 128.
REGISTER_CAPS = (255, 128)
REGISTER_CAP_CORES = ("delta_rule", "rdn", "srwm")
# pytest -k expression of the GPU tests in tests/*/test_kernels_*.py (test_cuda_*, test_compiles_for_sm90_*)
# and every test of tests/unit/test_gpu_data_path.py (its module name matches "gpu").
GPU_TEST_SELECTION = "cuda or sm90 or gpu"
# The most one ``fwrl bench kernels`` call of the kernels part may take on the GPU: the first
# run's single call (delta_rule, three shapes, two dtypes, Triton and both FLA kernels) had not
# finished after 235 s on an H200, its compiles and FLA's autotuning being the suspects.
KERNEL_PASS_SECONDS = 100


# ----------------------------------------------------------------------------- plumbing

class Part:
    """One part's output folder, log and time budget."""

    def __init__(self, name: str, out: Path, dry: bool, budget: float, skip_tests: bool = False,
                 resume: Path | None = None, retime: Sequence[str] = (), rows: Sequence[str] = ()):
        self.name, self.dry, self.skip_tests = name, dry, skip_tests
        self.rows = tuple(rows)  # learner: the rows of LEARNER_RUNS to run, in their order (empty: all)
        self.out = out / name
        if self.out.exists():
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True)
        self.log_path = self.out / f"{name}.log"
        self.started = time.monotonic()
        self.budget = budget
        self.resume = resume
        self.retime = set(retime)  # cores whose resumed rows are dropped (their kernels changed since)
        self._log_lock = threading.Lock()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def log(self, text: str) -> None:
        with self._log_lock:  # commands run side by side log from their own threads
            print(text, flush=True)
            with self.log_path.open("a") as f:
                f.write(text + "\n")

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = True,
            env: dict[str, str] | None = None, prefix: str = "") -> subprocess.CompletedProcess:
        """Run ``argv`` (``env`` added to the environment), its output going to the console and the
        log line by line as it comes (each line after ``prefix``: commands run side by side), so a
        command stopped at ``timeout`` (default: the time left) keeps what it printed; raises
        ``subprocess.TimeoutExpired`` (with that output) then."""
        argv = list(map(str, argv))
        timeout = self.left() if timeout is None else min(timeout, self.left())
        if timeout <= 0:
            raise TimeoutError(f"{self.name}: out of its time budget before {' '.join(argv[:6])}")
        tag = _tag(prefix)
        self.log(f"{tag}$ {' '.join(argv)}")
        began = time.monotonic()
        lines: list[str] = []
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})})

        def pump() -> None:
            for line in proc.stdout:
                lines.append(line)
                self.log(tag + line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            reader.join(5)
            raise subprocess.TimeoutExpired(argv, timeout, output="".join(lines)) from None
        reader.join()
        self.log(f"{tag}({time.monotonic() - began:.1f} s, exit {proc.returncode})")
        result = subprocess.CompletedProcess(argv, proc.returncode, stdout="".join(lines))
        if check and proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} ... exited with {proc.returncode}")
        return result

    def try_run(self, argv: Sequence[str], timeout: float | None = None, prefix: str = "") -> bool:
        """``run`` that logs a failure or timeout instead of raising; True if it succeeded."""
        try:
            return self.run(argv, timeout=timeout, check=False, prefix=prefix).returncode == 0
        except (TimeoutError, subprocess.TimeoutExpired) as exc:
            self.log(f"{_tag(prefix)}not finished: {exc}")
            return False


def _tag(prefix: str) -> str:
    """What starts the log lines of a command run beside others (``[rdn] ``); empty without a prefix."""
    return f"[{prefix}] " if prefix else ""


def fwrl(*args: Any) -> list[str]:
    return [sys.executable, "-m", "fwrl.launch.cli", *map(str, args)]


def metadata(dry: bool) -> dict[str, Any]:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    commit = os.environ.get("FWRL_COMMIT") or _git("rev-parse", "--short", "HEAD") or "unknown"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)"
    return {"commit": commit, "gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "dry_run": dry}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def header(title: str, meta: dict[str, Any]) -> str:
    dry = "  \n**Dry run at tiny sizes on the CPU: these figures mean nothing.**" if meta["dry_run"] else ""
    earlier = meta.get("resumed_from")
    retimed = f" ({', '.join(earlier['retimed'])} timed again here)" if earlier and earlier.get("retimed") else ""
    resumed = (f"  \n{earlier['rows']} rows were timed by an earlier run (commit `{earlier['commit']}`, "
               f"{earlier['gpu']}, {earlier['date']}; `--resume {earlier['path']}`){retimed}: their note says so."
               if earlier else "")
    return (f"# {title}\n\ncommit `{meta['commit']}` · GPU {meta['gpu']} · torch {meta['torch']} · "
            f"triton {meta['triton']} · Python {meta['python']} · {meta['cpus']} CPUs · {meta['date']}{dry}"
            f"{resumed}\n")


def table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="") as f:
        f.write("# " + ", ".join(f"{k}={v}" for k, v in meta.items()) + "\n")
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def goal_line(name: str, value: float | None, goal: float, unit: str = "x", at_most: bool = False) -> dict[str, Any]:
    """A goal's row: met where ``value`` >= ``goal`` (``at_most``: <=); "not measured" where it is None."""
    met = None if value is None else (value <= goal if at_most else value >= goal)
    return {"goal": name, "target": f"{'<=' if at_most else '>='} {goal:g}{unit}",
            "measured": None if value is None else round(value, 3),
            "met": {True: "yes", False: "NO", None: "not measured"}[met]}


# ----------------------------------------------------------------------------- kernels

def part_kernels(part: Part, meta: dict[str, Any]) -> None:
    # On the GPU: the kernel files' CUDA tests and sm_90 compile checks (their interpreter tests are
    # CI's; Triton 3.6's interpreter also fails under numpy 2.5, which the box has), and every test
    # of the GPU data path. The dry run takes a few of the data-path file's tests (CI's unit tier runs them
    # all): what it checks is that the part runs pytest and reads its summary.
    tests = (["tests/unit/test_gpu_data_path.py"] if part.dry
             else sorted(glob.glob("tests/*/test_kernels_*.py", root_dir=ROOT)) + ["tests/unit/test_gpu_data_path.py"])
    select = ["-k", "frozen_eval_copy or no_host_sync"] if part.dry else ["-k", GPU_TEST_SELECTION]
    if part.skip_tests:
        summary = "not run here (--skip-tests: they ran in an earlier command of the same session)"
        part.log(f"tests: {summary}")
    else:
        summary = _run_kernel_tests(part, tests, select)
    rows: list[dict[str, Any]] = []
    if part.resume is not None:  # an earlier session's timed rows: its passes are not timed again
        rows = _resumed_rows(part.resume, meta, part.retime)
        part.log(f"resumed {len(rows)} timed rows of {part.resume} (commit {meta['resumed_from']['commit']})")
    for n, (cores, impls, dtypes, shapes, caps) in enumerate(_kernel_calls(part, rows)):
        path = part.out / f"kernels-pass{n}.json"
        args = ["bench", "kernels", "--core", *cores, "--dtype", *dtypes, "--json-path", path]
        if part.dry:
            args += ["--dry-run"]
        else:
            args += ["--repeats", "10"] + [a for shape in shapes for a in ("--shape", shape)]
        args += [a for impl in impls for a in ("--impl", impl)]
        args += ["--maxnreg", *caps] if caps else []
        what = {"core": "/".join(cores), "dtype": "/".join(dtypes), "shape": " ".join(shapes),
                "impl": "/".join(impls) + (f" maxnreg {'/'.join(map(str, caps))}" if caps else "")}
        try:
            result = part.run(fwrl(*args), timeout=KERNEL_PASS_SECONDS if not part.dry else 240, check=False,
                              env={"TRITON_INTERPRET": "1"} if part.dry else None)
        except TimeoutError:
            rows.append({**what, "note": "skipped: out of the part's time"})
            continue
        except subprocess.TimeoutExpired as exc:
            rows.append({**what, "note": f"stopped after {exc.timeout:.0f} s (its rows so far: kernels.log)"})
            continue
        if result.returncode != 0 or not path.exists():
            rows.append({**what, "note": f"fwrl bench kernels exited with {result.returncode}"})
            continue
        for row in json.loads(path.read_text())["results"]:
            B, T, H, D = row["shape"]
            impl = row["impl"] + (f" split {row['split']}" if row.get("split") not in (None, 1)
                                  and "split" not in row["impl"] else "")
            rows.append({"core": row["core"], "dtype": row["dtype"], "shape": f"{B}x{T}x{H}x{D}", "impl": impl,
                         "fwd_ms": row.get("fwd_ms"), "fwd_bwd_ms": row.get("fwd_bwd_ms"),
                         "fwd_bwd_peak_mib": row.get("fwd_bwd_peak_mib"),
                         "speedup_fwd_bwd": row.get("speedup_fwd_bwd"),
                         "max_abs_error": row.get("max_abs_error"), "note": row.get("skipped") or row.get("note")})
        path.unlink()  # the CSV keeps every row; the device tool brings back at most 8 files
    write_kernel_report(part.out, meta, summary, " ".join(tests + select), rows)


def _kernel_calls(part: Part, rows: list[dict[str, Any]]):
    """``(cores, implementations, dtypes, shapes, register caps)`` of each ``fwrl bench kernels`` call:
    on the box one per pass of :func:`_kernel_passes` (but those a resumed run had timed, in ``rows``).
    The dry run (one tiny shape) takes the reference and Triton implementations only, bf16 once (it
    takes the same code path for every core) and each (core, implementation, dtype, caps) once, and
    runs consecutive passes that differ only in their core as one call of several cores."""
    calls: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], list[str], tuple[int, ...]]] = []
    done: set[tuple[str, str, str, tuple[int, ...]]] = set()
    for core, impls, dtypes, shapes, caps in _kernel_passes():
        if part.resume is not None and _pass_timed(rows, core, impls, dtypes, shapes, caps):
            continue
        if part.dry:
            dtypes = tuple(d for d in dtypes if d != "bf16" or not any(done_d == "bf16" for *_, done_d, _ in done))
            impls = tuple(i for i in impls if i in ("reference", "triton")
                          and any((core, i, d, caps) not in done for d in dtypes))
            if not impls:
                continue
            done.update((core, i, d, caps) for i in impls for d in dtypes)
            if calls and calls[-1][1:3] == (impls, dtypes) and calls[-1][4] == caps:
                calls[-1] = ((*calls[-1][0], core), *calls[-1][1:])
                continue
        calls.append(((core,), impls, dtypes, shapes, caps))
    return calls


def write_kernel_report(out: Path, meta: dict[str, Any], summary: str, tests: str,
                        rows: list[dict[str, Any]]) -> None:
    """The kernels part's ``kernels.{csv,json,png,md}`` from its timed rows: the goals are derived
    here, so ``--rebuild kernels`` can re-derive them from a committed ``kernels.json``."""
    goals = _kernel_goals(rows)
    write_csv(out / "kernels.csv", rows, meta)
    (out / "kernels.json").write_text(json.dumps({"meta": meta, "tests": summary, "test_command": tests,
                                                   "rows": rows, "goals": goals}, indent=2))
    _plot_kernels(out / "kernels.png", rows, meta)
    md = header("GPU suite: kernels", meta)
    md += f"\nCUDA tests ({tests}): **{summary}**\n\n## Goals (H100)\n\n"
    md += table(goals, ("goal", "target", "measured", "met"))
    caps = _register_cap_rows(rows)
    if caps:
        md += ("\n## Register cap A/B (`--maxnreg`: fwd and bwd compiled under each cap; 255 is the uncapped "
               "binary, the default of every kernel but the delta rule's, which caps at 128; vs_default: the "
               "255 row's fwd+bwd time over this one's)\n\n")
        md += table(caps, ("core", "dtype", "shape", "maxnreg", "fwd_ms", "fwd_bwd_ms", "vs_default"))
    md += "\n## Timings (median of CUDA events; memory = peak beyond the inputs)\n\n"
    md += table(rows, ("core", "dtype", "shape", "impl", "fwd_ms", "fwd_bwd_ms", "fwd_bwd_peak_mib",
                       "speedup_fwd_bwd", "max_abs_error", "note"))
    (out / "kernels.md").write_text(md)


def _resumed_rows(source: Path, meta: dict[str, Any], retime: Collection[str] = ()) -> list[dict[str, Any]]:
    """The timed rows of an earlier kernels part's JSON but those of the cores in ``retime``, each
    noted with the commit, GPU and date that timed it (a row that run had itself resumed keeps its
    own note); records where they came from in ``meta`` (the report's header says so)."""
    earlier = json.loads(source.read_text())
    commit = str(earlier["meta"].get("commit", "unknown"))
    where = ", ".join(str(v) for v in (earlier["meta"].get("gpu"), earlier["meta"].get("date")) if v)
    note = f"timed at {commit[:7]}" + (f", {where}" if where else "")
    timed = [{**row, "note": row["note"] if str(row.get("note", "")).startswith("timed at ") else note}
             for row in earlier["rows"]
             if (row.get("fwd_bwd_ms") or row.get("fwd_ms")) and row["core"] not in retime]
    meta["resumed_from"] = {"path": str(source), "commit": commit, "gpu": earlier["meta"].get("gpu"),
                            "date": earlier["meta"].get("date"), "rows": len(timed), "retimed": sorted(retime)}
    return timed


def _pass_timed(rows: list[dict[str, Any]], core: str, impls: Sequence[str], dtypes: Sequence[str],
                shapes: Sequence[str], caps: Sequence[int] = ()) -> bool:
    """Whether ``rows`` hold a timing of every (implementation, dtype, shape) of one pass (and, for a
    pass of register caps, of every cap)."""
    have = {(_impl_name(r["impl"]), r["dtype"], r["shape"], _register_cap(r["impl"])) for r in rows
            if r["core"] == core and (r.get("fwd_bwd_ms") or r.get("fwd_ms"))}
    return all((impl, dtype, shape.replace(",", "x"), cap) in have
               for impl in impls for dtype in dtypes for shape in shapes for cap in (caps or (None,)))


def _run_kernel_tests(part: Part, tests: list[str], select: list[str]) -> str:
    """Run the kernel tests with pytest; their summary line, or where they stopped."""
    try:
        # test files in parallel processes (pytest-xdist, carried in .whl): the box's 16 CPUs build the
        # sm_90 kernels side by side, and each process has its own CUDA context on the one GPU
        workers = ["-n", str(min(8, os.cpu_count() or 1))] if not part.dry else ["-n", "0"]
        proc = part.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *workers, *select,
                         *tests], timeout=240 if not part.dry else 120, check=False)
        return _pytest_summary(proc.stdout)
    except subprocess.TimeoutExpired as exc:  # keep the part's time for the benchmarks
        output = exc.output.decode() if isinstance(exc.output, bytes) else (exc.output or "")
        return f"stopped after {exc.timeout:.0f} s: {_pytest_summary(output)}"


def _kernel_passes() -> list[tuple[str, tuple[str, ...], tuple[str, ...], list[str], tuple[int, ...]]]:
    """``(core, implementations, dtypes, shapes, register caps)`` of each ``fwrl bench kernels``
    call, most wanted first, each small enough that one slow compile or autotune costs only its
    own call: the goals (fused against eager at the two goal shapes, fp32; the delta rule against
    FLA's fused recurrent kernel at the RL shape), the register-cap A/B at the large shape and then
    at the small one, then
    bf16, each core's other preset shapes, FLA's chunked kernel and last ``torch.compile`` of
    the reference (compiles are slow)."""
    from fwrl.launch.bench.kernels import CORE_SHAPES

    def text(shapes) -> list[str]:
        return [",".join(map(str, shape)) for shape in shapes]

    goal = text(GOAL_SHAPES)
    eager_fused = ("reference", "triton")
    passes = [(core, eager_fused, ("fp32",), goal, ()) for core in KERNEL_CORES]
    passes.append(("delta_rule", ("fla_recurrent",), ("fp32",), goal[:1], ()))
    passes += [(core, ("triton",), ("fp32",), goal[1:], REGISTER_CAPS) for core in REGISTER_CAP_CORES]
    # the cap at the small shape, where fewer programs than SMs run: a default picked by shape needs both
    passes += [(core, ("triton",), ("fp32",), goal[:1], REGISTER_CAPS) for core in REGISTER_CAP_CORES]
    passes += [(core, eager_fused, ("bf16",), goal, ()) for core in KERNEL_CORES]
    for core in KERNEL_CORES:
        presets = [shape for shape in text(CORE_SHAPES[core]) if shape not in goal]
        if presets:
            passes.append((core, eager_fused, DTYPES, presets, ()))
    delta_rule_shapes = list(dict.fromkeys(goal + text(CORE_SHAPES["delta_rule"])))
    passes.append(("delta_rule", ("fla_recurrent",), ("fp32",), delta_rule_shapes[1:], ()))
    passes.append(("delta_rule", ("fla_recurrent",), ("bf16",), delta_rule_shapes, ()))
    passes.append(("delta_rule", ("fla_chunk",), DTYPES, delta_rule_shapes, ()))
    passes += [(core, ("compiled",), ("fp32",), goal, ()) for core in KERNEL_CORES]
    return passes


def _pytest_summary(output: str) -> str:
    lines = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1].strip("= ") if lines else "no summary (see the log)"


def _kernel_goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def pick(core, shape, impl, dtype="fp32"):
        """The fastest timed row of ``impl`` (any of its splits: ``triton[split=auto] split auto``)
        for ``core`` at ``shape``."""
        found = [r for r in rows if (r["core"], r.get("shape"), r["dtype"]) == (core, shape, dtype)
                 and _impl_name(r["impl"]) == impl and _register_cap(r["impl"]) is None and r.get("fwd_bwd_ms")]
        return min(found, key=lambda r: r["fwd_bwd_ms"]) if found else None

    goals = []
    for core in KERNEL_CORES:
        small = pick(core, "32x51x4x32", "triton")
        goals.append(goal_line(f"{core}: fused fwd+bwd vs eager at 32x51x4x32",
                               small and small.get("speedup_fwd_bwd"), GOALS["speedup_small"]))
        large, ref = pick(core, "256x101x8x64", "triton"), pick(core, "256x101x8x64", "reference")
        goals.append(goal_line(f"{core}: fused fwd+bwd vs eager at 256x101x8x64",
                               large and large.get("speedup_fwd_bwd"), GOALS["speedup_large"]))
        memory = (ref["fwd_bwd_peak_mib"] / large["fwd_bwd_peak_mib"]
                  if large and ref and large.get("fwd_bwd_peak_mib") else None)
        goals.append(goal_line(f"{core}: eager / fused peak memory at 256x101x8x64", memory, GOALS["memory_large"]))
    # the gated delta rule against the delta rule, both fused, at the two goal shapes (issue 70: <= 1.2x)
    for shape in ("x".join(map(str, g)) for g in GOAL_SHAPES):
        gated, plain = pick("gated_delta_rule", shape, "triton"), pick("delta_rule", shape, "triton")
        ratio = gated["fwd_bwd_ms"] / plain["fwd_bwd_ms"] if gated and plain else None
        goals.append(goal_line(f"gated delta rule / delta rule, fused fwd+bwd at {shape}", ratio,
                               GOALS["gated_vs_delta"], at_most=True))
    # against FLA: the RL goal shape always (a line that says "not measured" where FLA's pass did
    # not run), then every other shape at which both kernels were timed
    rl_shape = "x".join(map(str, GOAL_SHAPES[0]))
    timed = {r["shape"] for r in rows if r["core"] == "delta_rule" and r.get("fwd_bwd_ms")
             and _impl_name(r["impl"]) == "fla_recurrent"}
    for shape in [rl_shape] + sorted(timed - {rl_shape}):
        ours, fla = pick("delta_rule", shape, "triton"), pick("delta_rule", shape, "fla_recurrent")
        ratio = fla["fwd_bwd_ms"] / ours["fwd_bwd_ms"] if ours and fla else None
        goals.append(goal_line(f"delta rule vs FLA fused_recurrent at {shape} (fwd+bwd)", ratio, GOALS["vs_fla"]))
    return goals


def _register_cap(impl: str) -> int | None:
    """The register cap in an implementation label (``triton[split=auto,maxnreg=128]`` -> 128), else None."""
    found = re.search(r"maxnreg=(\d+)", impl)
    return int(found.group(1)) if found else None


def _register_cap_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The register-cap A/B: per core, dtype and shape timed under caps, fwd+bwd at each cap and each
    cap's speed-up over the uncapped binary (255)."""
    groups: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for r in rows:
        cap = _register_cap(r["impl"])
        if cap is not None and r.get("fwd_bwd_ms"):
            groups.setdefault((r["core"], r["dtype"], r["shape"]), {})[cap] = r
    out = []
    for (core, dtype, shape), timed in sorted(groups.items()):
        base = timed[max(timed)]
        for cap, row in sorted(timed.items(), reverse=True):
            out.append({"core": core, "dtype": dtype, "shape": shape, "maxnreg": cap, "fwd_ms": row.get("fwd_ms"),
                        "fwd_bwd_ms": row["fwd_bwd_ms"],
                        "vs_default": round(base["fwd_bwd_ms"] / row["fwd_bwd_ms"], 3)})
    return out


def _impl_name(impl: str) -> str:
    """An implementation label without its options: ``triton[split=auto] split auto`` -> ``triton``."""
    return re.split(r"[\[ ]", impl, maxsplit=1)[0]


def _plot_kernels(path: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("fwd_bwd_ms") and r["dtype"] == "fp32"]
    keys = sorted({(r["core"], r["shape"]) for r in timed})
    impls = [i for i in ("reference", "compiled", "triton", "fla_recurrent", "fla_chunk")
             if any(r["impl"] == i for r in timed)]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(keys) + 3), 5))
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
        values = [next((r["fwd_bwd_ms"] for r in timed if (r["core"], r["shape"]) == key and r["impl"] == impl), 0)
                  for key in keys]
        ax.bar([i + j * width for i in range(len(keys))], values, width, label=impl)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], [f"{c}\n{s}" for c, s in keys], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("fwd+bwd ms (fp32, log scale)")
    ax.set_title(f"fused kernels vs reference · {meta['gpu']} · {meta['commit']}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- learner

def part_learner(part: Part, meta: dict[str, Any]) -> None:
    workers, batch = _learner_workers_and_batch(part.dry)
    common = learner_common_args(part.dry)
    rows: list[dict[str, Any]] = []
    ceilings: dict[int, float] = {}  # envs per worker -> the env ceiling of those workers
    for label, core, envs, extra in LEARNER_RUNS:
        if part.rows and label not in part.rows:
            continue
        if part.dry and ("--inference-graph" in extra or label in DRY_RUN_SKIPS):
            continue
        envs = _learner_width(envs, part.dry)
        path = part.out / f"learner-{label.replace(' ', '-')}.json"
        ceiling_seconds = (1 if part.dry else 10) if envs not in ceilings else 0
        # the first row run (lstm x8 graph; in the dry run, which skips graphs, eager lstm x8) and the
        # acting-only row run 5 s more under torch.profiler, left out of their figures
        profile_file = (PROFILE_FILE.format(core=core) if not rows
                        else ACTING_ONLY_PROFILE_FILE if "--acting-only" in extra else None)
        profile = (["--profile-path", part.out / profile_file, "--profile-seconds", 2 if part.dry else 5]
                   if profile_file else [])
        try:
            part.run(fwrl(*learner_row_args(common, core, envs, extra, batch), *profile,
                          "--ceiling-seconds", ceiling_seconds, "--json-path", path),
                     timeout=300 if part.dry else 150)  # a dry run on a loaded 2-core machine starts slowly
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as exc:
            part.log(f"{label}: {exc}")
            rows.append({"core": label, "envs_per_worker": envs, "note": str(exc)[:120]})
            continue
        record = json.loads(path.read_text())
        path.unlink()
        if record["env_ceiling_steps_per_second"]:
            ceilings.setdefault(envs, record["env_ceiling_steps_per_second"])
        ceiling = ceilings.get(envs)
        shares = record["shares"]
        rows.append({"core": label, "envs_per_worker": envs, "env_path": record.get("env_path"),
                     "acting_threads": record.get("acting_threads"), "learners": record.get("learners", 1),
                     "worker_splits": record.get("worker_splits", 1),
                     "agent_steps_per_s": record["steps_per_second"],
                     "of_ceiling": record["steps_per_second"] / ceiling if ceiling else None,
                     "updates": record["updates"], "policy_lag": record["policy_lag_mean"],
                     "peak_memory_mb": record["peak_memory_mb"],
                     **{k.removeprefix("share/"): v for k, v in shares.items()}})
    by = {r["core"]: r for r in rows if r.get("agent_steps_per_s")}
    goals = []
    for forward in ("", " x8", " graph", " x8 graph", " x8 graph prio nowait", " x8 graph split2"):
        lstm, rdn = by.get("lstm" + forward), by.get("rdn" + forward)
        if forward and not (lstm or rdn):
            continue
        goals += [goal_line(f"lstm{forward} agent steps/s / env ceiling", lstm and lstm["of_ceiling"],
                            GOALS["lstm_of_ceiling"], ""),
                  goal_line(f"rdn{forward} agent steps/s / lstm{forward}'s",
                            rdn["agent_steps_per_s"] / lstm["agent_steps_per_s"] if rdn and lstm else None,
                            GOALS["rdn_of_lstm"], "")]
    wide = [by[label]["agent_steps_per_s"] for label in WIDE_RDN_ROWS if label in by]
    goals.append(goal_line("rdn x8 agent steps/s, the best acting layout (c7ffd00: 9,397)",
                           max(wide) if wide else None, GOALS["rdn_steps"], ""))
    env_paths = _env_path_ceilings(part, workers, _learner_width(LEARNER_ENVS_PER_WORKER, part.dry))
    overhead = _multi_learner_overhead(part)
    write_csv(part.out / "learner.csv", rows, meta)
    ceiling = ceilings.get(_learner_width(LEARNER_ENVS_PER_WORKER, part.dry))
    (part.out / "learner.json").write_text(json.dumps({"meta": meta, "env_ceiling": ceiling,
                                                        "env_ceilings": ceilings, "rows": rows,
                                                        "goals": goals, "env_paths": env_paths,
                                                        "two_learner_ranks": overhead}, indent=2))
    _plot_learner(part.out / "learner.png", rows, ceilings, meta)
    md = header("GPU suite: learner throughput on Atari Pong", meta)
    paths_run = sorted({r["env_path"] for r in rows if r.get("env_path")})
    md += (f"\n`fwrl bench throughput {' '.join(map(str, common))} --envs-per-worker N --core CORE` (env path: "
           f"{', '.join(paths_run) or 'not measured'}); env ceiling (random actions, the same {workers} workers): "
           + (", ".join(f"**{round(c):,} steps/s** at {n} envs per worker" for n, c in sorted(ceilings.items()))
              or "not measured") + "\n\n## Goals\n\n")
    md += table(goals, ("goal", "target", "measured", "met"))
    md += ("\n## Agent steps/s and where the time goes (shares of each thread's wall time; of_ceiling: of the "
           "env ceiling at the row's envs per worker)\n\n")
    md += table(rows, ("core", "envs_per_worker", "worker_splits", "acting_threads", "learners", "agent_steps_per_s", "of_ceiling", "updates", "policy_lag",
                       "peak_memory_mb",
                       "env_wait", "inference_forward", "rollout_bookkeeping", "actor_other", "learner_idle",
                       "learner_forward", "learner_backward", "learner_optimiser", "note"))
    variants = [(label, base, by[label]["agent_steps_per_s"] / by[base]["agent_steps_per_s"])
                for base in VARIANT_BASES if base in by for label in by if label.startswith(base + " ")]
    if variants:
        md += ("\nEach layout over its plain graphed row, agent steps/s in one run (prio: `--acting-priority high`; "
               "nowait: `--acting-batch-wait 0`; w14: 14 workers; split2: `--worker-splits 2`; acting-only: no updates, "
               "`--acting-only`; 2 threads: `--acting-threads 2`; shared: `--acting-staging shared`; update process: `--learner-process on`, the update in its own process; 2 learners: `--learners 2`, each rank acting in its own process): "
               + "; ".join(f"{label} / {base} **{ratio:.2f}x**" for label, base, ratio in variants) + ".\n")
    first_profile = PROFILE_FILE.format(core=rows[0]["core"].split()[0]) if rows else None
    if first_profile and (part.out / first_profile).exists():
        md += (f"\nThe acting thread of the first row ({rows[0]['core']}), op by op (5 s after its window, under "
               f"torch.profiler): `{first_profile}`.\n")
    if (part.out / ACTING_ONLY_PROFILE_FILE).exists():
        md += (f"\nThe acting thread of the acting-only row (no learner beside it), op by op: "
               f"`{ACTING_ONLY_PROFILE_FILE}`.\n")
    if env_paths:
        md += (f"\n## Env ceiling by env path (random actions, the same {workers} workers)\n\n"
               f"`{env_paths['command']}`; per CPU s: env steps per second of the worker processes' CPU time\n\n")
        md += table(env_paths["rows"], ("env_path", "env_steps_per_s", "per_cpu_second", "cores_busy", "x_none"))
    if overhead:
        md += (f"\n## Two learner ranks sharing the device ({'cpu' if part.dry else 'one GPU'}, gloo)\n\n"
               f"`python benchmarks/multi_learner_overhead.py`: Pong / nature / lstm, B {overhead['batch_per_rank']} x "
               f"T {overhead['unroll']} per rank. One "
               f"rank: {overhead['one_rank']['update_ms']:.1f} ms per update; two: "
               f"{overhead['two_ranks']['update_ms']:.1f} ms, of which the all-reduce of the "
               f"{overhead['one_rank']['gradient_mib']:.1f} MiB gradient is {overhead['two_ranks']['allreduce_ms']:.1f} ms "
               f"({100 * overhead['allreduce_share_of_two_rank_update']:.1f}%).\n")
    (part.out / "learner.md").write_text(md)


def _learner_workers_and_batch(dry: bool) -> tuple[int, int]:
    """The learner part's env workers (the box's CPUs) and batch (rfwp-atari's 32); 2 and 2 in the dry run."""
    return (2, 2) if dry else (os.cpu_count() or 2, 32)


def learner_common_args(dry: bool) -> list[Any]:
    """The ``fwrl bench throughput`` arguments every learner row shares."""
    workers, batch = _learner_workers_and_batch(dry)
    if dry:  # the window lasts its 2 s past the first update, however late a loaded machine starts;
        # the box's paths: the update in the learner thread and eager acting (on the CPU both default to
        # their CPU forms, a process of its own for the update and a traced acting step, which CUDA never takes)
        return ["--env", "atari:Pong", "--stem", "impala", "--device", "cpu", "--num-workers", workers,
                "--batch-size", batch, "--unroll-length", 4, "--seconds", 2, "--warmup", 1,
                "--learner-process", "off", "--acting-trace", "off"]
    return ["--preset", "rfwp-atari", "--env", "atari:Pong", "--stem", "impala", "--device", "cuda",
            "--num-workers", workers, "--batch-size", batch, "--seconds", 30, "--warmup", 10]


def learner_row_args(common: Sequence[Any], core: str, envs: int, extra: Sequence[str], batch: int) -> list[Any]:
    """``bench throughput`` and the arguments of one row of :data:`LEARNER_RUNS` (before its profile,
    ceiling and output path): eager unless it asks for graphs, and B per rank where it has several
    learner ranks (every update still takes B x T agent steps)."""
    if "--inference-graph" not in extra:
        extra = (*extra, *EAGER)
    if "--learners" in extra:
        extra = (*extra, "--batch-size", batch // int(extra[extra.index("--learners") + 1]))
    return ["bench", "throughput", *common, "--envs-per-worker", envs, "--core", core, *extra]


def _learner_width(envs: int, dry: bool) -> int:
    """The envs per worker a learner row runs with: its own on the GPU; in the dry run 1 for the goal
    rows and 2 for the wide ones, so that the wide rows still get a ceiling of their own."""
    if not dry:
        return envs
    return 1 if envs == LEARNER_ENVS_PER_WORKER else 2


def _env_path_ceilings(part: Part, workers: int, envs_per_worker: int) -> dict[str, Any] | None:
    """The env ceiling of each of :data:`ENV_PATHS` on the learner part's workers (``fwrl bench envs
    --paths``), with each one's steps per worker CPU second and its ratio to the Python chain."""
    path = part.out / "env-paths.json"
    args = ["bench", "envs", "--env", "atari:Pong", "--num-workers", workers, "--envs-per-worker", envs_per_worker,
            "--seconds", 1 if part.dry else 10, "--warmup", 1 if part.dry else 3, "--paths", ",".join(ENV_PATHS)]
    if not part.try_run(fwrl(*args, "--json-path", path), timeout=120 if part.dry else 150) or not path.exists():
        return None
    data = json.loads(path.read_text())
    path.unlink()
    first = {name: runs[0] for name, runs in data["paths"].items()}
    base = first.get("none", {}).get("steps_per_second")
    rows = [{"env_path": name, "env_steps_per_s": r["steps_per_second"], "per_cpu_second": r["steps_per_cpu_second"],
             "cores_busy": r["cores_busy"], "x_none": r["steps_per_second"] / base if base else None}
            for name, r in first.items()]
    return {"command": "fwrl " + " ".join(map(str, args)), "rows": rows}


def _multi_learner_overhead(part: Part) -> dict[str, Any] | None:
    """Two learner ranks on this device: update time against the gradient all-reduce (issue 16)."""
    path = part.out / "multi-learner.json"
    argv = [sys.executable, "benchmarks/multi_learner_overhead.py", "--json-path", path,
            "--updates", 3 if part.dry else 20, "--device", "cpu" if part.dry else "cuda",
            *(["--unroll", 4, "--warmup", 1] if part.dry else [])]  # the dry run's figures mean nothing
    if not part.try_run(argv, timeout=120) or not path.exists():
        return None
    data = json.loads(path.read_text())
    path.unlink()
    return data


def _plot_learner(path: Path, rows: list[dict[str, Any]], ceilings: dict[int, float], meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.get("agent_steps_per_s")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([r["core"] for r in timed], [r["agent_steps_per_s"] for r in timed], color="tab:blue")
    for (envs, ceiling), color in zip(sorted(ceilings.items()), ("tab:red", "tab:purple", "tab:green")):
        ax.axhline(ceiling, color=color, linestyle="--", label=f"env ceiling, {envs} envs/worker: {ceiling:,.0f}")
        ax.axhline(GOALS["lstm_of_ceiling"] * ceiling, color=color, linestyle=":", label="70% of it")
    if ceilings:
        ax.legend(fontsize=7)
    ax.set_ylabel("agent steps/s")
    ax.set_title(f"Pong, impala stem · {meta['gpu']} · {meta['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- pong

# the dry run's games, trained and greedy: at most 500 agent steps, so that its one env ends a game within
# its 600 training steps however busy the machine is (a near-random policy's whole game lasts 850-1050
# agent steps; an untrained greedy agent can rally for minutes on a CPU)
PONG_DRY_RUN_FRAMES, PONG_DRY_RUN_STEPS = 2000, 600


def part_pong(part: Part, meta: dict[str, Any]) -> None:
    workers = 1 if part.dry else max(1, (os.cpu_count() or 2) // len(PONG_AGENTS))
    # The dry run stops by steps, not time, and caps its games (PONG_DRY_RUN_FRAMES).
    seconds = 150 if part.dry else PONG_SECONDS
    with tempfile.TemporaryDirectory(prefix="fwrl-pong-") as tmp:
        runs = {name: Path(tmp) / f"pong-{name}" for name in PONG_AGENTS}
        train = {name: _pong_train_args(name, workers, seconds, tmp, part.dry) for name in PONG_AGENTS}
        trained = _side_by_side(part, {name: fwrl(*args) for name, args in train.items()}, seconds + 120)
        # keep each run's figures before anything else can fail; then, in what time the part has left, the
        # init probes (CPU, bounded) and last the greedy games, whose length nothing bounds but Pong's score
        # (the first H100 run's evaluation took the 90 s that were left and so cost the curves and the probe)
        histories = _keep_metrics(part, runs)
        if histories:
            _plot_pong(part.out / "pong.png", histories, meta)
        probe_args = {name: ["info", *agent, "--probe", "--probe-updates", 2 if part.dry else 3]
                      + (["--batch-size", 2, "--unroll-length", 4] if part.dry else [])
                      + ["--json-path", Path(tmp) / f"probe-{name}.json"] for name, agent in PONG_AGENTS.items()}
        _side_by_side(part, {name: fwrl(*args) for name, args in probe_args.items()}, 120 if part.dry else 60)
        episodes = 1 if part.dry else PONG_EVAL_EPISODES
        capped = ["--env", f"atari:Pong?max_frames={PONG_DRY_RUN_FRAMES}"] if part.dry else []
        evaluate = {name: fwrl("evaluate", run, "--episodes", episodes, "--repeats", 1, *capped,
                               "--num-workers", min(episodes, workers), "--device", "cpu" if part.dry else "cuda",
                               "--out", Path(tmp) / f"evaluation-{name}.json")
                    for name, run in runs.items() if name in histories}
        _side_by_side(part, evaluate, 120 if part.dry else 150)
        agents = {name: _pong_summary(histories.get(name, []), _read_json(Path(tmp) / f"probe-{name}.json"),
                                      _read_json(Path(tmp) / f"evaluation-{name}.json"))
                  for name in PONG_AGENTS}
        for name, ok in trained.items():
            agents[name]["trained"] = ok
    goal = agents[PONG_GOAL_AGENT]
    goals = [goal_line(f"{PONG_GOAL_AGENT}: mean return (last 100 episodes) above 0 within {seconds} s",
                       goal["final"][2] if goal["final"] else None, 1e-9, ""),
             goal_line(f"lstm: best mean return (last 100 episodes) within {PONG_LSTM_SECONDS} s, on "
                       f"{workers} workers (the issue asks it of the whole box)",
                       agents["lstm"]["best_within_target_seconds"], PONG_LSTM_TARGET, "")]
    summary = {"meta": meta, "seconds": seconds, "workers_per_agent": workers,
               "commands": {name: "fwrl " + " ".join(map(str, args)) for name, args in train.items()},
               "goals": goals, "agents": agents}
    (part.out / "pong.json").write_text(json.dumps(summary, indent=2))
    (part.out / "pong.md").write_text(_pong_report(summary, meta, episodes))


def _pong_train_args(name: str, workers: int, seconds: int, runs_dir: str, dry: bool) -> list[Any]:
    args = ["train", *PONG_AGENTS[name], "--num-workers", workers, "--max-seconds", seconds, "--runs-dir", runs_dir,
            "--name", f"pong-{name}", "--log-interval", 2 if dry else 10]
    return args + (["--env", f"atari:Pong?max_frames={PONG_DRY_RUN_FRAMES}", "--device", "cpu",
                    "--envs-per-worker", 1, "--batch-size", 2, "--unroll-length", 8,
                    "--total-steps", PONG_DRY_RUN_STEPS] if dry else ["--device", "cuda", "--envs-per-worker", PONG_ENVS_PER_WORKER])


def _side_by_side(part: Part, commands: dict[str, list[str]], timeout: float) -> dict[str, bool]:
    """Run ``commands`` at once (their output prefixed with their name in the log); which succeeded."""
    done: dict[str, bool] = {}
    threads = [threading.Thread(target=lambda n=n, a=a: done.__setitem__(n, part.try_run(a, timeout, prefix=n)))
               for n, a in commands.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {name: done.get(name, False) for name in commands}


def _keep_metrics(part: Part, runs: dict[str, Path]) -> dict[str, list[dict[str, str]]]:
    """Each run's metrics.csv copied into the part's folder as ``metrics-<name>.csv``; its rows by name
    (a run that wrote none is left out)."""
    histories: dict[str, list[dict[str, str]]] = {}
    for name, run in runs.items():
        if (run / "metrics.csv").exists():
            shutil.copy(run / "metrics.csv", part.out / f"metrics-{name}.csv")
            histories[name] = list(csv.DictReader((run / "metrics.csv").open()))
    return histories


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _pong_summary(rows: list[dict[str, str]], probe: dict[str, Any] | None,
                  evaluation: dict[str, Any] | None) -> dict[str, Any]:
    """One agent's run in figures: where its training return stood and when it left random play and
    crossed 0, its rate, entropy and gradient norm, its init probe and its greedy games."""
    from fwrl.launch.plot import series  # a metric's finite values with their agent steps

    curve = [(float(r["time"]), int(r["agent_steps"]), float(r["mean_return"])) for r in rows
             if r.get("mean_return") not in (None, "", "nan")]
    entropy = list(zip(*series(rows, "entropy")))  # (agent steps, nats per step) of the rows that have it
    _, grad_norms = series(rows, "grad_norm")
    _, rates = series(rows, "steps_per_second")
    return {
        "final": curve[-1] if curve else None,
        "left_random": next(((t, s) for t, s, v in curve if v > PONG_RANDOM_EXIT), None),
        "first_positive": next(((t, s) for t, s, v in curve if v > 0), None),
        "reached_target": next(((t, s) for t, s, v in curve if v >= PONG_LSTM_TARGET), None),
        "best_within_target_seconds": max((v for t, s, v in curve if t <= PONG_LSTM_SECONDS), default=None),
        "steps_per_second": round(sum(rates[1:]) / len(rates[1:])) if len(rates) > 1 else None,  # past the first row
        "entropy_first_min_last": [entropy[0][1], min(e for _, e in entropy), entropy[-1][1]] if entropy else None,
        "grad_norm_first_max_last": [grad_norms[0], max(grad_norms), grad_norms[-1]] if grad_norms else None,
        "init_probe": {k: probe[k] for k in ("init_grad_norm", "first_logit_change", "first_value_change",
                                             "initial_entropy", "entropy", "max_entropy")} if probe else None,
        "evaluation_mean": _eval_mean(evaluation) if evaluation else None,
    }


def _pong_report(summary: dict[str, Any], meta: dict[str, Any], episodes: int) -> str:
    def at(point):
        return f"{point[1]:,} steps ({point[0]:.0f} s)" if point else "never"

    def triple(values, fmt):
        return " / ".join(format(v, fmt) for v in values) if values else "-"

    md = header("GPU suite: Pong, rdn and lstm side by side, pong-cpu settings", meta)
    md += (f"\nBoth agents trained at once for {summary['seconds']} s, {summary['workers_per_agent']} workers each "
           f"(half the cores), then {episodes} greedy full games each (`fwrl evaluate`) and the CPU init probe "
           "(`fwrl info --probe`):\n\n")
    md += "".join(f"- `{command}`\n" for command in summary["commands"].values())
    md += "\n" + table(summary["goals"], ("goal", "target", "measured", "met"))
    rows = []
    for name, a in summary["agents"].items():
        probe, final = a["init_probe"], a["final"]
        rows.append({"agent": name + ("" if a.get("trained") else " (run failed: pong.log)"),
                     "agent steps": f"{final[1]:,}" if final else "-", "steps/s": a["steps_per_second"],
                     "mean return (last 100)": round(final[2], 2) if final else None,
                     f"left random (> {PONG_RANDOM_EXIT:g})": at(a["left_random"]), "above 0": at(a["first_positive"]),
                     f"reached {PONG_LSTM_TARGET:g}": at(a["reached_target"]),
                     "entropy first / min / last": triple(a["entropy_first_min_last"], ".3f"),
                     "grad norm first / max / last": triple(a["grad_norm_first_max_last"], ".3g"),
                     "init grad norm": round(probe["init_grad_norm"], 3) if probe else None,
                     "greedy games": None if a["evaluation_mean"] is None else round(a["evaluation_mean"], 2)})
    md += "\n## The two runs\n\n" + table(rows, list(rows[0]))
    md += ("\nEntropy in nats per step (uniform over Pong's 6 actions: 1.79); gradient norm before the clip at 40; "
           "init grad norm from the CPU probe (`pong.json` has the first update's change of logits and value). "
           "Curves: `pong.png` (return, entropy, gradient norm against agent steps); every row: "
           "`metrics-<agent>.csv`; the runs' output: `pong.log`.\n")
    return md


def _plot_pong(path: Path, histories: dict[str, list[dict[str, str]]], meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fwrl.launch.plot import series

    metrics = (("mean_return", "mean return (last 100 episodes)"), ("entropy", "policy entropy (nats per step)"),
               ("grad_norm", "gradient norm (before the clip)"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4.5))
    for ax, (column, label) in zip(axes, metrics):
        for name, rows in histories.items():
            xs, ys = series(rows, column)
            ax.plot(xs, ys, label=name)
        ax.set_xlabel("agent steps")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Pong, pong-cpu settings, {meta['gpu']} ({meta['commit'][:7]})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _eval_mean(evaluation: dict[str, Any]) -> float | None:
    """The mean return of the first result row of an ``fwrl evaluate`` JSON."""
    for key in ("runs", "results"):
        for row in evaluation.get(key, []) or []:
            if "mean" in row:
                return float(row["mean"])
    return None


# ----------------------------------------------------------------------------- procgen

# The SRWM paper's multi-task setting (Sec. 4.3, Table 3): six games, easy, training levels 0-199, the
# srwm-procgen-easy preset (impala stem, B 32, T 50, lr 6e-4; 2 layers, hidden 128, 8 heads of 16).
PROCGEN_GAMES = ("bigfish", "fruitbot", "maze", "leaper", "plunder", "starpilot")
PROCGEN_DRY_RUN_GAMES = ("bigfish", "starpilot")  # two of the six whose episodes end soon under a constant action
PROCGEN_LEVELS = "distribution=easy&num_levels=200&start_level=0"
PROCGEN_AGENTS = {"srwm": ("--preset", "srwm-procgen-easy"), "lstm": ("--preset", "srwm-procgen-easy", "--core", "lstm")}
PROCGEN_SECONDS = 300
PROCGEN_ENVS_PER_WORKER = 16  # each worker steps 16 levels of its game in one gym3 env
PROCGEN_EVAL_EPISODES = 10  # per game and split (the paper's 200 do not fit a command)
PROCGEN_RANDOM_EPISODES = 10  # the random policy's episodes per game, on the training levels
PROCGEN_DRY_RUN_STEPS = 160


def part_procgen(part: Part, meta: dict[str, Any]) -> None:
    from fwrl.launch.report.baselines import random_policy_return

    games = PROCGEN_DRY_RUN_GAMES if part.dry else PROCGEN_GAMES
    env = f"procgen:{'+'.join(games)}?{PROCGEN_LEVELS}"
    # one worker per game (worker i runs game i mod n) or a multiple: as many as half the cores hold
    workers = len(games) * (1 if part.dry else max(1, (os.cpu_count() or 2) // len(PROCGEN_AGENTS) // len(games)))
    seconds = 150 if part.dry else PROCGEN_SECONDS
    with tempfile.TemporaryDirectory(prefix="fwrl-procgen-") as tmp:
        runs = {name: Path(tmp) / f"procgen-{name}" for name in PROCGEN_AGENTS}
        train = {name: _procgen_train_args(name, env, workers, seconds, tmp, part.dry) for name in PROCGEN_AGENTS}
        trained = _side_by_side(part, {name: fwrl(*args) for name, args in train.items()}, seconds + 120)
        histories = _keep_metrics(part, runs)  # the curves first: nothing after this can cost them
        random_returns: dict[str, float | None] = {}
        episodes = 1 if part.dry else PROCGEN_RANDOM_EPISODES
        for game in games:  # the random policy on the training levels, in this process (no model: seconds)
            random_returns[game] = random_policy_return(f"procgen:{game}?{PROCGEN_LEVELS}", episodes, 0)["mean"]
            part.log(f"random policy, {game}: {random_returns[game]} over {episodes} episodes")
        if histories:
            _plot_procgen(part.out / "procgen.png", histories, games, random_returns, meta)
        eval_episodes = 1 if part.dry else PROCGEN_EVAL_EPISODES
        evaluate = {name: fwrl("evaluate", run, "--episodes", eval_episodes, "--num-workers", workers,
                               "--device", "cpu" if part.dry else "cuda",
                               "--out", Path(tmp) / f"evaluation-{name}.json")
                    for name, run in runs.items() if name in histories}
        _side_by_side(part, evaluate, 240 if part.dry else 180)
        agents = {name: _procgen_summary(histories.get(name, []), games, random_returns,
                                         _read_json(Path(tmp) / f"evaluation-{name}.json"))
                  for name in PROCGEN_AGENTS}
        for name, ok in trained.items():
            agents[name]["trained"] = ok
    goals = []
    for name, agent in agents.items():
        above = agent["games_above_random"]
        goals.append(goal_line(f"{name}: games whose training return (last 100 episodes) is above the random "
                               f"policy's, after {seconds} s", above, len(games), f" of {len(games)}"))
        goals.append(goal_line(f"{name}: test splits evaluated (normalised score of every game)",
                               agent["test_splits_scored"], 3, " of 3"))
    summary = {"meta": meta, "env": env, "seconds": seconds, "workers_per_agent": workers,
               "eval_episodes": eval_episodes, "random_episodes": episodes, "random_returns": random_returns,
               "commands": {name: "fwrl " + " ".join(map(str, args)) for name, args in train.items()},
               "goals": goals, "agents": agents}
    rows = [{"agent": name, "game": game, **values} for name, a in agents.items() for game, values in a["games"].items()]
    write_csv(part.out / "procgen.csv", rows, meta)
    (part.out / "procgen.json").write_text(json.dumps(summary, indent=2))
    (part.out / "procgen.md").write_text(_procgen_report(summary, meta, games))


def _procgen_train_args(name: str, env: str, workers: int, seconds: int, runs_dir: str, dry: bool) -> list[Any]:
    args = ["train", *PROCGEN_AGENTS[name], "--env", env, "--num-workers", workers, "--max-seconds", seconds,
            "--runs-dir", runs_dir, "--name", f"procgen-{name}", "--log-interval", 2 if dry else 10]
    return args + (["--device", "cpu", "--envs-per-worker", 1, "--batch-size", 2, "--unroll-length", 8,
                    "--total-steps", PROCGEN_DRY_RUN_STEPS] if dry
                   else ["--device", "cuda", "--envs-per-worker", PROCGEN_ENVS_PER_WORKER])


def _procgen_summary(rows: list[dict[str, str]], games: Sequence[str], random_returns: dict[str, float | None],
                     evaluation: dict[str, Any] | None) -> dict[str, Any]:
    """One agent in figures: each game's training return (the last logged 100-episode mean) against the
    random policy's, the normalised training return, and each game's evaluation per split."""
    def last(column: str) -> float | None:
        values = [float(r[column]) for r in rows if r.get(column) not in (None, "", "nan")]
        return values[-1] if values else None

    steps = int(rows[-1]["agent_steps"]) if rows else 0
    rates = [float(r["steps_per_second"]) for r in rows[1:] if r.get("steps_per_second") not in (None, "", "nan")]
    evaluated = (evaluation or {}).get("aggregates") or []
    per_game: dict[str, dict[str, Any]] = {}
    for game in games:
        train = last(f"return/{game}")
        values = {"train_return": train, "random_return": random_returns.get(game),
                  "above_random": None if train is None or random_returns.get(game) is None
                  else train > random_returns[game]}
        for row in evaluated:
            if row.get("task") == game:
                values[f"eval_{row['split']}"] = row.get("mean")
                values[f"eval_{row['split']}_normalised"] = row.get("normalised")
        per_game[game] = values
    splits = {row["split"]: row.get("normalised") for row in evaluated if row.get("task") == "*"}
    tests = [s for s in splits if s.startswith("test_") and splits[s] is not None]
    return {"agent_steps": steps, "steps_per_second": round(statistics.mean(rates)) if rates else None,
            "normalised_train_return": last("normalised_return"), "games": per_game,
            "games_above_random": sum(bool(v["above_random"]) for v in per_game.values()) if rows else None,
            "eval_normalised": splits, "test_splits_scored": len(tests) if evaluation else None}


def _procgen_report(summary: dict[str, Any], meta: dict[str, Any], games: Sequence[str]) -> str:
    def x100(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    md = header("GPU suite: multi-task ProcGen, srwm and lstm side by side (SRWM paper Sec. 4.3)", meta)
    md += (f"\n`{summary['env']}`: both agents trained at once for {summary['seconds']} s, "
           f"{summary['workers_per_agent']} workers each (worker i runs game i mod {len(games)}), then "
           f"`fwrl evaluate` of each on the training levels and the three test splits, "
           f"{summary['eval_episodes']} greedy episodes per game and split; the random policy played "
           f"{summary['random_episodes']} episodes of each game on the training levels:\n\n")
    md += "".join(f"- `{command}`\n" for command in summary["commands"].values())
    md += "\n" + table(summary["goals"], ("goal", "target", "measured", "met"))
    rows = []
    for game in games:
        row: dict[str, Any] = {"game": game, "random": summary["random_returns"].get(game)}
        for name, a in summary["agents"].items():
            g = a["games"][game]
            row[f"{name} train return"] = g["train_return"]
            for split in ("test_1000", "test_1200", "test_1400"):
                row[f"{name} {split} norm. x100"] = x100(g.get(f"eval_{split}_normalised"))
        rows.append(row)
    md += "\n## Per game\n\n" + table(rows, list(rows[0]))
    agg = []
    for name, a in summary["agents"].items():
        splits = a["eval_normalised"]
        agg.append({"agent": name + ("" if a.get("trained") else " (run failed: procgen.log)"),
                    "agent steps": f"{a['agent_steps']:,}", "steps/s": a["steps_per_second"],
                    "train return, normalised x100": x100(a["normalised_train_return"]),
                    "eval train levels, norm. x100": x100(splits.get("train")),
                    # fwrl evaluate's "test" split: the mean of the test splits (None where one lacks a score)
                    "eval test splits (mean of 3), norm. x100": x100(splits.get("test"))})
    md += "\n## Both agents\n\n" + table(agg, list(agg[0]))
    md += ("\nNormalised: min-max with ProcGen's easy constants (Cobbe et al. 2020), the mean over the games. "
           "For scale only, the SRWM paper's figures after 300 M steps (Table 3, normalised x100): srwm 34.6 "
           "train / 20.0 test, lstm 28.3 / 15.7. Curves per game: `procgen.png`; every row: "
           "`metrics-<agent>.csv`; the runs' output: `procgen.log`.\n")
    return md


def _plot_procgen(path: Path, histories: dict[str, list[dict[str, str]]], games: Sequence[str],
                  random_returns: dict[str, float | None], meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fwrl.launch.plot import series

    columns = 3
    fig, axes = plt.subplots((len(games) + columns - 1) // columns, columns, figsize=(15, 4 * ((len(games) + 2) // 3)),
                             squeeze=False)
    for ax, game in zip(axes.flat, games):
        for name, rows in histories.items():
            xs, ys = series(rows, f"return/{game}")
            ax.plot(xs, ys, label=name)
        if random_returns.get(game) is not None:
            ax.axhline(random_returns[game], color="grey", linestyle="--", label="random policy")
        ax.set_title(game, fontsize=10)
        ax.set_xlabel("agent steps")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(games):]:
        ax.set_visible(False)
    axes.flat[0].legend()
    fig.suptitle(f"ProcGen multi-task (easy, levels 0-199), training return (last 100 episodes), "
                 f"{meta['gpu']} ({meta['commit'][:7]})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main

def rebuild_report(part: str, folder: Path) -> int:
    """``--rebuild``: the kernels report of ``folder`` from its ``kernels.json``."""
    source = folder / "kernels.json"
    if part != "kernels":
        print(f"benchmarks/gpu/run.sh: --rebuild takes the kernels part (its rows hold every figure), "
              f"not {part!r}", file=sys.stderr)
        return 2
    if not source.is_file():
        print(f"benchmarks/gpu/run.sh: --rebuild needs {source} (a kernels part's JSON)", file=sys.stderr)
        return 2
    data = json.loads(source.read_text())
    tests = data.get("test_command") or " ".join(
        sorted(glob.glob("tests/*/test_kernels_*.py", root_dir=ROOT)) + ["tests/unit/test_gpu_data_path.py",
                                                                        "-k", GPU_TEST_SELECTION])
    write_kernel_report(folder, data["meta"], data["tests"], tests, data["rows"])
    print(f"rebuilt {folder}/kernels.{{md,csv,json,png}} from {len(data['rows'])} rows")
    return 0


PART_FUNCTIONS: dict[str, Callable[[Part, dict[str, Any]], None]] = {
    "kernels": part_kernels, "learner": part_learner, "pong": part_pong, "procgen": part_procgen}


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu/run.sh", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU (what CI runs)")
    parser.add_argument("--budget", type=float, default=570.0,
                        help="seconds this part may take in all (default 570: inside a 10-minute command)")
    parser.add_argument("--skip-tests", action="store_true",
                        help="kernels: time only (the CUDA tests ran in an earlier command; keep that log)")
    parser.add_argument("--resume", metavar="JSON", type=Path,
                        help="kernels: keep the timed rows of an earlier run's kernels.json and time only the "
                             "passes it lacks (only while fwrl/kernels is unchanged since its commit)")
    parser.add_argument("--retime", metavar="CORE", action="append", default=[], choices=KERNEL_CORES,
                        help="with --resume: time this core again (its kernel changed since that run); repeatable")
    parser.add_argument("--rebuild", metavar="FOLDER",
                        help="kernels: write the report again from FOLDER/kernels.json (its timed rows; "
                             "the goals are re-derived), on any machine")
    parser.add_argument("--rows", metavar="LABEL,...", type=lambda text: [r.strip() for r in text.split(",") if r.strip()],
                        default=[], help="learner: only these rows of LEARNER_RUNS (by label, comma-separated; they "
                                         "run in the suite's order): for a box with less time than the whole part")
    parser.add_argument("part", choices=PARTS)
    parser.add_argument("out", nargs="?", help="output folder (default: $OUT, else benchmarks/results/gpu; a dry run: "
                                               "a new temporary folder, never under benchmarks/results)")
    args = parser.parse_intermixed_args(argv)  # PART may come before the options, OUT after them
    if args.rebuild:
        return rebuild_report(args.part, Path(args.rebuild))
    unknown = [row for row in args.rows if row not in {label for label, *_ in LEARNER_RUNS}]
    if args.rows and (args.part != "learner" or unknown):
        print("benchmarks/gpu/run.sh: --rows picks rows of the learner part; "
              + (f"unknown: {', '.join(map(repr, unknown))}; the rows: "
                 f"{', '.join(label for label, *_ in LEARNER_RUNS)}" if unknown else f"got part {args.part}"),
              file=sys.stderr)
        return 2
    if args.retime and args.resume is None:
        print("benchmarks/gpu/run.sh: --retime drops cores from the rows of --resume; give --resume JSON too",
              file=sys.stderr)
        return 2
    if args.resume is not None and (args.part != "kernels" or not args.resume.is_file()):
        print(f"benchmarks/gpu/run.sh: --resume takes an earlier kernels part's kernels.json; got {args.part} "
              f"with {args.resume}{'' if args.resume.is_file() else ' (no such file)'}", file=sys.stderr)
        return 2
    # a dry run's figures mean nothing: never into the committed results (it would replace them)
    default = Path(tempfile.mkdtemp(prefix="fwrl-gpu-dry-run-")) if args.dry_run else ROOT / "benchmarks" / "results" / "gpu"
    out = Path(args.out or os.environ.get("OUT") or default)
    if args.dry_run and _inside(out, ROOT / "benchmarks" / "results"):
        print(f"benchmarks/gpu/run.sh: a dry run writes no figures into {out} (the committed results); give another "
              "OUT_DIR, or none for a temporary folder", file=sys.stderr)
        return 2
    meta = metadata(args.dry_run)
    if not args.dry_run and meta["gpu"] == "none (CPU)":
        print("benchmarks/gpu/run.sh: torch sees no CUDA GPU here; use --dry-run on a CPU.", file=sys.stderr)
        return 2
    part = Part(args.part, out, args.dry_run, args.budget, args.skip_tests, args.resume, args.retime, args.rows)
    part.log(f"GPU suite part {args.part}: {json.dumps(meta)}")
    PART_FUNCTIONS[args.part](part, meta)
    part.log(f"done in {time.monotonic() - part.started:.0f} s: {sorted(p.name for p in part.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
