"""The acting path's cost per agent step, measured on the CPU with envs that cost nothing.

A GPU box is rare; the acting thread's host work is not. This runs the acting path of
``fwrl train`` (``fwrl.agents.inference.InferenceLoop``: staging, the batched forward, the
store's writes, the actions back) over a stand-in pool whose workers answer at once with
prepared step records (every 40th row of a slot cut by a time limit, so the bootstrap path runs
too), and the rollouts released as soon as they are handed over. Per agent step it reports

- ``cpu_us``: the acting thread's CPU time (``time.thread_time``), in microseconds;
- ``ops``: the torch operators it calls (``aten::`` events of ``torch.profiler`` that no other
  operator called).

Two settings: ``overhead`` (a tiny MLP agent on 4-float observations: nearly all of the cost
is per-call overhead, what a GPU's acting thread pays) and ``pong`` (the nature stem on 4x84x84
frames and an LSTM 256: on a CPU the convolutions dominate).

Side by side with an earlier commit (``--baseline REV``, checked out from this repository's
history into a temporary folder), each in its own process::

    python benchmarks/acting_proxy.py --baseline 971d846 --out benchmarks/results/acting_proxy.md

``--graph`` measures the graphed acting path instead (``--inference-graph``, the default on a GPU),
with its CUDA graph replaced by plain calls of what it captures (a CUDA graph cannot run on the CPU):
``outside_ops``, the torch operators per acting call that launch work (views and allocations left
out) and that the acting thread issues *outside* the graph, each a kernel launch or a copy on a GPU
beside the one replay; ``host_us``, the acting thread's CPU microseconds per call outside the
replays (Python, the store's host side, staging's packing, the ops outside the graph): with the
step in the graph, what bounds a GPU's acting thread besides the envs. Staging's uploads are left out too (one host-to-device copy per env group on
a GPU, in both checkouts; the small index uploads of the store, which the CPU uses in place, are
not counted either). Side by side with ``--baseline``, it shows what a change moves into
the graph before a GPU is lent::

    python benchmarks/acting_proxy.py --graph --baseline 7acc213 --out benchmarks/results/acting_graph_proxy.md

``--beside-learner`` measures the graphed acting path's host side (as ``--graph``, its replays made
no-ops) in wall microseconds per call, alone and beside a thread that makes learner updates of the
same agent on a small batch (B 4, T 20: dispatch-bound, as a GPU's learner thread is), alternated
three times in each run: on a GPU box the acting and learner threads share one interpreter, and every
Python line the learner runs between its torch calls holds the GIL the acting thread waits for. Side
by side with ``--baseline``, it shows what a change to either thread's Python does to the other::

    python benchmarks/acting_proxy.py --beside-learner --baseline 3626ab1 --settings overhead --out benchmarks/results/acting_beside_learner_proxy.md

``--threads 1 2`` measures this checkout's acting with that many acting threads instead (each its
own loop over a slice of the workers, as ``fwrl train --acting-threads N`` runs them, one torch
thread each): the wall microseconds per agent step of all threads together, the figure several
threads can lower where one thread's host work is the bottleneck; the CPU figures add up the threads::

    python benchmarks/acting_proxy.py --threads 1 2 --out benchmarks/results/acting_threads_proxy.md

``--processes 2`` (beside ``--threads``) measures that many acting processes too, each one thread
over its share of the workers, as the ranks of ``fwrl train --learners N`` act: started together,
the wall microseconds run from the first one's start to the last one's end::

    python benchmarks/acting_proxy.py --threads 1 2 --processes 2 --out benchmarks/results/acting_threads_proxy.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> (obs shape, obs dtype, actions, stem, core, core options, workers, envs per worker)
    "overhead": ((4,), "float32", 3, "mlp", "lstm", {"hidden_size": 32}, 16, 8),
    "pong": ((4, 84, 84), "uint8", 6, "nature", "lstm", {"hidden_size": 256}, 16, 8),
}
UNROLL = 20
CUT_EVERY = 40  # a slot's episode is cut by a time limit once every this many steps


# ----------------------------------------------------------------------------- one checkout, in its process

class ZeroCostPool:
    """Workers that answer at once: every call to ``wait`` returns all of them with prepared arrays,
    each worker's the rows of ``[slots, ...]`` arrays (``shared_arrays``), as the local backend's
    shared memory hands them over."""

    def __init__(self, make_result, workers: int, k: int, obs_shape, obs_dtype, extra_steps: int = 0):
        import numpy as np

        self.num_workers, self.envs_per_worker, self.num_slots = workers, k, workers * k
        rng = np.random.default_rng(0)
        self.make_result = make_result
        n = workers * k
        obs = (rng.integers(0, 255, (n, *obs_shape)).astype(obs_dtype) if obs_dtype == "uint8"
               else rng.standard_normal((n, *obs_shape)).astype(obs_dtype))
        self.shared = {"obs": obs, "reward": np.zeros(n, np.float32), "done": np.zeros(n, bool),
                       "truncated": np.zeros(n, bool), "episode_return": np.zeros(n, np.float32),
                       "episode_step": np.zeros(n, np.int32), "task": np.zeros(n, np.int32),
                       "final_obs": np.zeros_like(obs)}
        self.arrays = [{name: value[w * k:(w + 1) * k] for name, value in self.shared.items()} for w in range(workers)]
        self.step = 0

    def shared_arrays(self):
        return self.shared

    def wait(self, timeout=None, workers=None):
        self.step += 1
        out = []
        for w in range(self.num_workers) if workers is None else workers:
            arrays = self.arrays[w]
            cut = (self.step + w) % CUT_EVERY == 0
            arrays["truncated"][:] = cut
            arrays["done"][:] = cut
            out.append(self.make_result(w, arrays))
        return out

    def act(self, worker, actions):
        pass


def _api():
    """(make_result, make_spec) for the checkout on ``sys.path``: its StepResult and RolloutSpec."""
    import torch

    from fwrl.agents.rollouts import RolloutSpec
    from fwrl.envs.worker_pool import StepResult

    try:
        from fwrl.envs.step_record import StepRecord
    except ImportError:  # before the step record (971d846): the fields as keywords, torch dtypes
        def make_result(w, arrays):
            return StepResult(w, 0, episodes=[], **arrays)

        def make_spec(T, k, shape, dtype, actions):
            return RolloutSpec(T, k, shape, {"uint8": torch.uint8, "float32": torch.float32}[dtype], actions)
        return make_result, make_spec

    def make_result(w, arrays):
        return StepResult(w, 0, arrays, [])

    def make_spec(T, k, shape, dtype, actions):
        return RolloutSpec(T, k, StepRecord.of(shape, dtype), actions)
    return make_result, make_spec


def _parts(setting: str):
    """(pool, model, store) of ``setting``, one torch thread."""
    import torch

    from fwrl.agents.model import AgentNet
    from fwrl.agents.rollouts import RolloutStore

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape, dtype, actions, stem, core, options, workers, k = SETTINGS[setting]
    make_result, make_spec = _api()
    pool = ZeroCostPool(make_result, workers, k, shape, dtype)
    model = AgentNet(shape, actions, core, options, stem=stem).eval()
    store = RolloutStore(make_spec(UNROLL, k, shape, dtype, actions), workers, torch.device("cpu"),
                         model.initial_state(1))
    return pool, model, store


REPLAY = "proxy/graph_replay"  # the profiler range of an emulated replay
UPLOAD = "proxy/upload"  # the profiler range of staging's upload (host to device copies on a GPU)
# operators that launch nothing on a GPU: views, metadata, allocations
NO_LAUNCH = {"aten::" + name for name in (
    "slice", "view", "unsqueeze", "squeeze", "select", "as_strided", "reshape", "_reshape_alias", "expand", "alias",
    "t", "permute", "transpose", "detach", "lift_fresh", "empty", "empty_strided", "empty_like", "resize_",
    "_unsafe_view", "split", "chunk", "unbind", "narrow", "numpy_T", "result_type", "is_nonzero", "item",
    "_local_scalar_dense", "set_", "to", "view_as")}


def _ranged(name: str):
    """The profiler range ``name`` while a profiler runs (a range costs a dispatcher call: not in the
    timed calls, as ``fwrl.agents.stage_timer`` does)."""
    import contextlib

    import torch

    return torch.profiler.record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


def _emulate_graph(loop) -> None:
    """Give ``loop`` the graphed path of its checkout with the CUDA graph replaced by plain calls of
    what it captures (each replay a call under the profiler range ``REPLAY``)."""
    import torch

    from fwrl.agents import inference_graph as ig

    loop.proxy_replay_cpu = 0.0  # the acting thread's CPU seconds inside the emulated replays

    def replaying(call):
        class Replay:
            @staticmethod
            def replay():
                if getattr(loop, "proxy_no_replay", False):  # --beside-learner: the host side alone
                    return
                began = time.thread_time()
                with _ranged(REPLAY):
                    call()
                loop.proxy_replay_cpu += time.thread_time() - began
        return Replay()

    if hasattr(ig, "GraphedStep"):  # the whole acting step is graphed (6064409 on)
        graphed = ig.GraphedStep.__new__(ig.GraphedStep)
        graphed.fn, graphed.device, graphed.generator = loop._graphed_act, torch.device("cpu"), None
        graphed.protect, graphed.graphs, graphed._buffers = None, {}, {}

        def capture(static):
            # the capture's call, as its warm-ups run (no protect needed: replay restores nothing)
            outputs = graphed.fn(static)
            if not hasattr(ig, "fill"):  # a checkout whose step gives a dict of tensors
                outputs = dict(outputs)
                return ig._Captured(replaying(lambda: outputs.update(graphed.fn(static))), outputs)
            return ig._Captured(replaying(lambda: ig.fill(outputs, graphed.fn(static))), outputs)
    else:  # the forward alone is graphed (GraphedActing)
        graphed = ig.GraphedActing.__new__(ig.GraphedActing)
        graphed.model, graphed.device, graphed.greedy = loop.model, torch.device("cpu"), loop.greedy
        graphed.graphs, graphed.generator = {}, None

        def capture(inputs, state):
            static_inputs = {key: value.clone() for key, value in inputs.items()}
            static_state = {key: value.clone() for key, value in state.items()}
            outputs, state_out = (dict(part) for part in graphed._forward(static_inputs, static_state))

            def call():
                out, new_state = graphed._forward(static_inputs, static_state)
                outputs.update(out)
                state_out.update(new_state)
            return ig._Captured(replaying(call), static_inputs, static_state, outputs, state_out)
    graphed._capture = capture
    loop._graphed = graphed
    upload = loop._staging.upload

    def ranged_upload(*args, **kwargs):
        with _ranged(UPLOAD):
            return upload(*args, **kwargs)
    loop._staging.upload = ranged_upload


def _outside_ops(prof) -> tuple[int, int]:
    """(operators that launch work issued outside the emulated replays and the uploads, replays) of a
    profile."""
    def inside(event) -> bool:
        while event is not None:
            if event.name in (REPLAY, UPLOAD):
                return True
            event = event.cpu_parent
        return False

    events = prof.events()
    outside = sum(1 for e in events if e.name.startswith("aten::") and e.name not in NO_LAUNCH
                  and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")) and not inside(e))
    return outside, sum(1 for e in events if e.name == REPLAY)


def measure(setting: str, steps: int, graph: bool = False, staging: str = "pack") -> dict:
    import threading

    import torch

    from fwrl.agents.inference import InferenceLoop

    pool, model, store = _parts(setting)
    options = {} if staging == "pack" else {"staging": staging}  # older checkouts have no option: they pack
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), threading.Lock(), batch_wait=0.0, **options)
    if graph:
        _emulate_graph(loop)
    for _ in range(30):  # warm-up: first pages, allocator
        loop.step(0.0, on_rollout=store.release)
    replay_cpu = getattr(loop, "proxy_replay_cpu", 0.0)
    began_cpu, began = time.thread_time(), time.perf_counter()
    for _ in range(steps):
        loop.step(0.0, on_rollout=store.release)
    cpu, wall = time.thread_time() - began_cpu, time.perf_counter() - began
    replay_cpu = getattr(loop, "proxy_replay_cpu", 0.0) - replay_cpu
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            loop.step(0.0, on_rollout=store.release)
    ops = sum(1 for e in prof.events() if e.name.startswith("aten::")  # those not called by another op
              and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    agent_steps = steps * pool.num_slots
    out = {"setting": setting, "slots": pool.num_slots, "cpu_us": round(1e6 * cpu / agent_steps, 2),
           "wall_us": round(1e6 * wall / agent_steps, 2), "ops": round(ops / (20 * pool.num_slots), 3),
           "ops_per_call": round(ops / 20, 1)}
    if graph:  # over a whole cycle of time-limit cuts (their riders ride the forward)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(CUT_EVERY):
                loop.step(0.0, on_rollout=store.release)
        outside, replays = _outside_ops(prof)
        out.update(outside_ops=round(outside / CUT_EVERY, 1), replays=round(replays / CUT_EVERY, 2),
                   host_us=round(1e6 * (cpu - replay_cpu) / steps, 1))
    return out


LEARNER_B, LEARNER_T = 4, 20  # the beside-learner thread's batch: small, so its updates are dispatch-bound


def _learner_thread(setting: str):
    """(start, stop, updates) of a thread that makes IMPALA updates of this checkout's learner on a
    fixed small batch of the setting's agent, as fast as it can, until stopped."""
    import threading

    import torch

    from fwrl.agents.learner import Learner
    from fwrl.agents.model import AgentNet
    from fwrl.agents.optim import linear_decay_scheduler, make_optimizer
    from fwrl.agents.policy_weights import PolicyWeights
    from fwrl.agents.rollouts import Batch
    from fwrl.settings.config import TrainConfig

    shape, dtype, actions, stem, core, options, _, _ = SETTINGS[setting]
    B, T = LEARNER_B, LEARNER_T
    model = AgentNet(shape, actions, core, options, stem=stem)
    optimizer = make_optimizer(model.parameters(), lr=6e-4)
    learner = Learner(model, PolicyWeights(AgentNet(shape, actions, core, options, stem=stem)), optimizer,
                      linear_decay_scheduler(optimizer, 10**12, B * T), TrainConfig().learner_settings(), None)
    g = torch.Generator().manual_seed(0)
    obs = (torch.randint(0, 256, (T + 1, B, *shape), generator=g, dtype=torch.uint8) if dtype == "uint8"
           else torch.randn(T + 1, B, *shape, generator=g))
    tensors = {"obs": obs, "reward": torch.randn(T + 1, B, generator=g), "done": torch.rand(T + 1, B, generator=g) < 0.05,
               "truncated": torch.zeros(T + 1, B, dtype=torch.bool), "bootstrap_value": torch.zeros(T + 1, B),
               "action": torch.randint(actions, (T + 1, B), generator=g),
               "policy_logits": torch.randn(T + 1, B, actions, generator=g), "baseline": torch.zeros(T + 1, B)}
    state = {name: value.expand(B, *value.shape[1:]).clone() for name, value in model.initial_state(1).items()}
    batch = Batch(tensors, state, [[0] * (T + 1)], [B])
    learner.update_batch(batch)  # warm-up
    stop, updates = threading.Event(), [0]

    def run() -> None:
        while not stop.is_set():
            learner.update_batch(batch)
            updates[0] += 1
    thread = threading.Thread(target=run, daemon=True)
    return thread.start, lambda: (stop.set(), thread.join()), updates


def measure_beside(setting: str, steps: int, rounds: int = 3) -> dict:
    """The graphed acting path's host side (its replays made no-ops), wall microseconds per call,
    alone and beside a thread of learner updates, alternated ``rounds`` times (medians): what the
    learner's Python holding the GIL adds to each acting call."""
    import statistics
    import threading

    import torch

    from fwrl.agents.inference import InferenceLoop

    sys.setswitchinterval(0.001)  # as fwrl train sets it (fwrl.runner.stopping.switch_interval)
    pool, model, store = _parts(setting)
    loop = InferenceLoop(model, pool, store, torch.device("cpu"), threading.Lock(), batch_wait=0.0)
    _emulate_graph(loop)
    for _ in range(CUT_EVERY):  # warm-up: first pages, allocator, the graphs of a whole cycle of cuts
        loop.step(0.0, on_rollout=store.release)
    loop.proxy_no_replay = True

    def per_call() -> float:
        began = time.perf_counter()
        for _ in range(steps):
            loop.step(0.0, on_rollout=store.release)
        return 1e6 * (time.perf_counter() - began) / steps

    alone, beside, rates, rates_alone = [], [], [], []
    for _ in range(rounds):
        alone.append(per_call())
        start, stop, updates = _learner_thread(setting)
        start()
        time.sleep(1.0)  # the learner alone (this thread sleeps)
        rates_alone.append(updates[0] / 1.0)
        began, first = time.perf_counter(), updates[0]
        beside.append(per_call())
        rates.append((updates[0] - first) / (time.perf_counter() - began))
        stop()
    return {"setting": setting, "slots": pool.num_slots, "alone_us": round(statistics.median(alone), 1),
            "beside_us": round(statistics.median(beside), 1), "learner_updates_per_s": round(statistics.median(rates), 1),
            "learner_alone_updates_per_s": round(statistics.median(rates_alone), 1)}


def measure_threads(setting: str, steps: int, threads: int) -> dict:
    """Acting with ``threads`` threads (this checkout): each steps its slice ``steps`` times."""
    import threading

    import torch

    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.policy_weights import PolicyWeights
    from fwrl.envs.worker_pool import PoolSlice, split_workers

    pool, model, store = _parts(setting)
    weights = PolicyWeights(model)
    loops = [InferenceLoop(model, PoolSlice(pool, part), store, torch.device("cpu"), weights=weights, batch_wait=0.0)
             for part in split_workers(pool.num_workers, threads)]
    cpu = [0.0] * threads
    start = threading.Barrier(threads + 1)

    def serve(i: int) -> None:
        torch.set_num_threads(1)
        for _ in range(30):  # warm-up
            loops[i].step(0.0, on_rollout=store.release)
        start.wait()
        began = time.thread_time()
        for _ in range(steps):
            loops[i].step(0.0, on_rollout=store.release)
        cpu[i] = time.thread_time() - began

    running = [threading.Thread(target=serve, args=(i,)) for i in range(threads)]
    for thread in running:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in running:
        thread.join()
    wall = time.perf_counter() - began
    agent_steps = steps * pool.num_slots
    return {"setting": setting, "threads": threads, "slots": pool.num_slots, "cpu_us": round(1e6 * sum(cpu) / agent_steps, 2),
            "wall_us": round(1e6 * wall / agent_steps, 2)}


def measure_process(setting: str, steps: int, processes: int, index: int) -> dict:
    """One of ``processes`` acting processes (as ``fwrl train --learners N`` runs them, each rank
    its own acting thread over its share of the workers): acts on slice ``index``, after a warm-up
    says "ready" and waits for "go" on stdin so that every process measures at the same time."""
    import torch

    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.policy_weights import PolicyWeights
    from fwrl.envs.worker_pool import PoolSlice, split_workers

    pool, model, store = _parts(setting)
    part = PoolSlice(pool, split_workers(pool.num_workers, processes)[index])
    loop = InferenceLoop(model, part, store, torch.device("cpu"), weights=PolicyWeights(model), batch_wait=0.0)
    for _ in range(30):  # warm-up
        loop.step(0.0, on_rollout=store.release)
    print("ready", flush=True)
    sys.stdin.readline()
    began_cpu, began = time.thread_time(), time.time()
    for _ in range(steps):
        loop.step(0.0, on_rollout=store.release)
    cpu, ended = time.thread_time() - began_cpu, time.time()
    slots = len(part.workers) * pool.envs_per_worker
    return {"began": began, "ended": ended, "cpu": cpu, "agent_steps": steps * slots, "slots": slots}


# ----------------------------------------------------------------------------- side by side

def _checkout(rev: str, folder: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "fwrl"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def _run(path: Path, setting: str, steps: int, threads: int = 0, graph: bool = False, beside: bool = False,
         staging: str = "pack") -> dict:
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
    extra = ((["--measure-threads", str(threads)] if threads else []) + (["--measure-graph"] if graph else [])
             + (["--measure-beside"] if beside else []) + ["--measure-staging", staging])
    out = subprocess.run([sys.executable, __file__, "--measure", setting, "--steps", str(steps), *extra], env=env,
                         capture_output=True, text=True, check=True, cwd=path).stdout
    return json.loads(out.strip().splitlines()[-1])


def _run_processes(setting: str, steps: int, processes: int) -> dict:
    """``processes`` acting processes of this checkout, measuring together: wall from the first
    start to the last end over all their agent steps; CPU summed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--measure", setting, "--steps", str(steps),
                               "--measure-process", f"{i}/{processes}"], env=env, cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for i in range(processes)]
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"an acting process of {setting} failed before its warm-up ended")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        parts = [json.loads(proc.communicate()[0].strip().splitlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    agent_steps = sum(p["agent_steps"] for p in parts)
    wall = max(p["ended"] for p in parts) - min(p["began"] for p in parts)
    return {"setting": setting, "processes": processes, "slots": sum(p["slots"] for p in parts),
            "cpu_us": round(1e6 * sum(p["cpu"] for p in parts) / agent_steps, 2),
            "wall_us": round(1e6 * wall / agent_steps, 2)}


def _commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "working tree"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline",
                        help="an earlier commit to measure side by side (any git revision: a hash, a tag, HEAD~3)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=300, help="acting calls measured per setting")
    parser.add_argument("--repeats", type=int, default=3, help="runs per checkout and setting, alternated; medians")
    parser.add_argument("--out", help="markdown report to write")
    parser.add_argument("--threads", type=int, nargs="+", help="measure this checkout with these numbers of acting "
                        "threads instead (wall and CPU us per agent step)")
    parser.add_argument("--processes", type=int, nargs="+", help="with --threads: also these numbers of acting "
                        "processes (one thread each, as learner ranks act), side by side")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--graph", action="store_true", help="measure the graphed acting path, its graph replaced "
                        "by plain calls: the operators the acting thread issues outside the graph per call")
    parser.add_argument("--measure-process", help=argparse.SUPPRESS)
    parser.add_argument("--measure-graph", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--beside-learner", action="store_true", help="the graphed acting path's host side (replays "
                        "made no-ops), wall us per call alone and beside a thread of learner updates (GIL sharing)")
    parser.add_argument("--measure-beside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--staging", nargs="+", default=["pack"], choices=["pack", "shared"],
                        help="this checkout's acting staging (InferenceLoop staging=): several are measured side by side")
    parser.add_argument("--measure-staging", default="pack", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.processes and not args.threads:
        parser.error("--processes is measured beside --threads (e.g. --threads 1 2 --processes 2)")
    if args.measure and args.measure_process:
        index, processes = map(int, args.measure_process.split("/"))
        print(json.dumps(measure_process(args.measure, args.steps, processes, index)))
        return 0
    if args.measure:
        print(json.dumps(measure_threads(args.measure, args.steps, args.measure_threads) if args.measure_threads
                         else measure_beside(args.measure, args.steps) if args.measure_beside
                         else measure(args.measure, args.steps, args.measure_graph, args.measure_staging)))
        return 0
    if args.threads:
        return _threads_report(args)
    with tempfile.TemporaryDirectory(prefix="fwrl-proxy-") as tmp:
        # each staging of --staging in both checkouts (a baseline before 426cea7 has only "pack"), baseline
        # and this side by side
        base = _checkout(args.baseline, Path(tmp)) if args.baseline else None
        commit = _commit()
        checkouts = {}
        for staging in args.staging:
            if base is not None:
                checkouts[_label("baseline", args.baseline, staging, args)] = (base, staging)
            checkouts[_label("this", commit, staging, args)] = (ROOT, staging)
        results: dict[tuple[str, str], list[dict]] = {}
        for setting in args.settings:
            for _ in range(args.repeats):
                for name, (path, staging) in checkouts.items():  # alternated, so drift hits both alike
                    results.setdefault((name, setting), []).append(_run(path, setting, args.steps, graph=args.graph,
                                                                        beside=args.beside_learner, staging=staging))
                    print(name, setting, results[(name, setting)][-1], file=sys.stderr, flush=True)
    if args.beside_learner:
        return _beside_report(args, results)
    if args.graph:
        return _graph_report(args, results)
    rows = []
    for (name, setting), runs in results.items():
        rows.append((setting, name, runs[0]["slots"], _medians(runs, ("cpu_us", "wall_us", "ops", "ops_per_call"))))
    lines = ["| setting | checkout | slots per call | CPU us / agent step | wall us / agent step | torch ops / agent "
             "step | torch ops / call |", "|---|---|---|---|---|---|---|"]
    for setting, name, slots, med in sorted(rows):
        lines.append(f"| {setting} | {name} | {slots} | {med['cpu_us']} | {med['wall_us']} | {med['ops']} | "
                     f"{med['ops_per_call']} |")
    if args.baseline:
        lines += ["", "| setting | CPU us, this / baseline | ops, this / baseline |", "|---|---|---|"]
        for setting in args.settings:
            base = next(m for s, n, _, m in rows if s == setting and n.startswith("baseline"))
            this = next(m for s, n, _, m in rows if s == setting and n.startswith("this"))
            lines.append(f"| {setting} | {this['cpu_us'] / base['cpu_us']:.2f} | {this['ops'] / base['ops']:.2f} |")
    _publish(args, f"Acting path per agent step on the CPU ({time.strftime('%Y-%m-%d')})",
             "acting calls each, one torch thread", lines)
    return 0


def _label(checkout: str, rev: str, staging: str, args) -> str:
    """A checkout's row label: "this (rev)" or "baseline (rev)", with the staging where --staging asks
    for any but "pack"."""
    staged = args.staging != ["pack"]
    return f"{checkout} ({rev}{f', {staging} staging' if staged else ''})"


def _graph_report(args, results: dict[tuple[str, str], list[dict]]) -> int:
    """The graphed path's table: operators per call outside the graph (and the uploads), replays per call."""
    lines = ["| setting | checkout | slots per call | ops per call outside the graph | replays per call | "
             "host us per call outside the graph |", "|---|---|---|---|---|---|"]
    medians = {key: _medians(runs, ("outside_ops", "replays", "host_us")) for key, runs in results.items()}
    for (name, setting), med in sorted(medians.items(), key=lambda item: (item[0][1], item[0][0])):
        lines.append(f"| {setting} | {name} | {results[(name, setting)][0]['slots']} | {med['outside_ops']} | "
                     f"{med['replays']} | {med['host_us']} |")
    if args.baseline:
        lines += ["", "| setting | ops outside the graph per call, this / baseline | host us outside it, this / "
                  "baseline |", "|---|---|---|"]
        commit = _commit()
        for setting in args.settings:
            for staging in args.staging:
                base = medians[(_label("baseline", args.baseline, staging, args), setting)]
                this = medians[(_label("this", commit, staging, args), setting)]
                named = setting if args.staging == ["pack"] else f"{setting}, {staging} staging"
                lines.append(f"| {named} | {this['outside_ops'] / base['outside_ops']:.2f} | "
                             f"{this['host_us'] / base['host_us']:.2f} |")
    _publish(args, f"The graphed acting path's calls outside its graph, on the CPU ({time.strftime('%Y-%m-%d')})",
             "acting calls each, one torch thread, the CUDA graph replaced by plain calls", lines)
    return 0


def _beside_report(args, results: dict[tuple[str, str], list[dict]]) -> int:
    """The beside-learner table: host wall us per acting call alone, beside learner updates, their ratio."""
    lines = ["| setting | checkout | slots per call | host us per call, alone | beside a learner thread | beside / alone "
             "| learner updates/s, alone | beside the acting thread |", "|---|---|---|---|---|---|---|---|"]
    for (name, setting), runs in sorted(results.items(), key=lambda item: (item[0][1], item[0][0])):
        med = _medians(runs, ("alone_us", "beside_us", "learner_updates_per_s", "learner_alone_updates_per_s"))
        lines.append(f"| {setting} | {name} | {runs[0]['slots']} | {med['alone_us']} | {med['beside_us']} | "
                     f"{med['beside_us'] / med['alone_us']:.2f} | {med['learner_alone_updates_per_s']} | "
                     f"{med['learner_updates_per_s']} |")
    _publish(args, f"The acting path's host side beside a learner thread, on the CPU ({time.strftime('%Y-%m-%d')})",
             f"acting calls each (3 alternations of alone and beside a learner thread of B {LEARNER_B} x T "
             f"{LEARNER_T} updates per run), one torch thread, the CUDA graph's replays made no-ops", lines)
    return 0


def _threads_report(args) -> int:
    layouts = [(f"{t} thread{'s' if t > 1 else ''}", lambda s, t=t: _run(ROOT, s, args.steps, t)) for t in args.threads]
    layouts += [(f"{n} processes", lambda s, n=n: _run_processes(s, args.steps, n)) for n in args.processes or ()]
    results: dict[tuple[str, str], list[dict]] = {}
    for setting in args.settings:
        for _ in range(args.repeats):
            for name, run in layouts:  # alternated, so drift hits each layout alike
                results.setdefault((setting, name), []).append(run(setting))
                print(setting, name, results[(setting, name)][-1], file=sys.stderr, flush=True)
    first = layouts[0][0]
    lines = ["| setting | acting layout | slots | wall us / agent step | CPU us / agent step (all threads) | "
             f"steps/s vs {first} |", "|---|---|---|---|---|---|"]
    for setting in args.settings:
        med = {name: _medians(results[(setting, name)], ("wall_us", "cpu_us")) for name, _ in layouts}
        for name, _ in layouts:
            lines.append(f"| {setting} | {name} | {results[(setting, name)][0]['slots']} | {med[name]['wall_us']} | "
                         f"{med[name]['cpu_us']} | {med[first]['wall_us'] / med[name]['wall_us']:.2f}x |")
    _publish(args, f"Acting threads and processes on the CPU proxy ({time.strftime('%Y-%m-%d')}, {_commit()}, "
                   f"{os.cpu_count()} cores)", "acting calls per thread or process, one torch thread each", lines)
    return 0


def _medians(runs: list[dict], keys) -> dict:
    """The median of each of ``keys`` over ``runs``."""
    return {key: sorted(r[key] for r in runs)[len(runs) // 2] for key in keys}


def _publish(args, title: str, calls: str, lines: list[str]) -> None:
    """Print the table of ``lines``; with ``--out``, write it under ``title`` and the command that made it."""
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(f"# {title}\n\n`python benchmarks/acting_proxy.py {' '.join(sys.argv[1:])}`: "
                                  f"medians of {args.repeats} alternated runs of {args.steps} {calls} "
                                  f"(benchmarks/acting_proxy.py says what is measured).\n\n{table}\n")


if __name__ == "__main__":
    sys.exit(main())
