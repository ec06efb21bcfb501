"""The GPU data path: rollout store on a CUDA device, acting and learner streams, CUDA-graph acting,
several acting threads.

The sampler tests and the graphed acting path with its graph replaced by plain calls run
everywhere; the rest needs a CUDA GPU (the GPU suite,
``benchmarks/gpu/run.sh``, runs them) and skips without one.
"""

import contextlib
import threading
import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fwrl.agents.inference_graph import WARMUP_CALLS, GraphedStep, _Captured, fill
from fwrl.agents.model import AgentNet
from fwrl.envs.worker_pool import StepResult
from fwrl.errors import FwrlError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CORES = {
    "lstm": {"hidden_size": 16},
    "gru": {"hidden_size": 16},
    "delta_net": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "rdn": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "gated_delta_net": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "srwm": {"num_layers": 1, "hidden_size": 16, "num_heads": 2, "head_dim": 8, "ff_dim": 16},
    "elstm": {"hidden_size": 8, "grad": "rtrl"},
}


def test_gumbel_sampler_draws_from_the_softmax():
    """argmax(logits + Gumbel noise) is a sample of softmax(logits): frequencies over 60k draws
    within 5 standard errors of the probabilities."""
    torch.manual_seed(0)
    model = AgentNet((4,), 3, "feedforward", {}, stem="mlp")
    n = 60_000
    inputs = {"obs": torch.randn(1, 1, 4).expand(1, n, 4).contiguous(), "reward": torch.zeros(1, n),
              "done": torch.zeros(1, n, dtype=torch.bool)}
    with torch.no_grad():
        out, _ = model(inputs, model.initial_state(n), sampler="gumbel")
    probs = torch.softmax(out["policy_logits"][0, 0].double(), -1)
    freq = torch.bincount(out["action"][0], minlength=3).double() / n
    stderr = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * stderr).all(), (freq, probs)
    assert (probs > 0.05).all()  # a real mixture, not a near-deterministic policy


@pytest.mark.parametrize("sampler", ["gumbel", "multinomial"])
def test_a_sampler_given_a_generator_draws_from_it_alone(sampler):
    """Graphed acting gives each loop its own generator: the samples follow that generator's seed and
    leave torch's global generator where it was."""
    from fwrl.agents.policy import sample

    logits = torch.zeros(1, 512, 6)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    first = sample(logits, sampler=sampler, generator=torch.Generator().manual_seed(3))
    again = sample(logits, sampler=sampler, generator=torch.Generator().manual_seed(3))
    other = sample(logits, sampler=sampler, generator=torch.Generator().manual_seed(4))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(first, again) and not torch.equal(first, other)


@needs_cuda
@pytest.mark.parametrize("core", sorted(CORES))
def test_a_graphed_forward_equals_the_eager_forward(core):
    from fwrl.agents.inference_graph import GraphedStep, own_generator
    from fwrl.agents.policy_weights import PolicyWeights

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device).eval()
    weights = PolicyWeights(model)

    def forward(t):
        state = {k[6:]: v for k, v in t.items() if k.startswith("state/")}
        out, state_out = model({k: t[k] for k in ("obs", "reward", "done")}, state, greedy=True, sampler="gumbel",
                               generator=graphed.generator)
        return {**out, **{f"state/{k}": v for k, v in state_out.items()}}

    graphed = GraphedStep(forward, device, own_generator(device))
    n = 6
    state = model.initial_state(n, device)
    for step in range(8):
        inputs = {"obs": torch.randn(1, n, 4, device=device), "reward": torch.randn(1, n, device=device),
                  "done": (torch.rand(1, n, device=device) < 0.2)}
        with torch.no_grad():
            eager, eager_state = model(inputs, state, greedy=True)
        out = graphed.step(n, {**inputs, **{f"state/{k}": v for k, v in state.items()}})
        torch.testing.assert_close(out["policy_logits"], eager["policy_logits"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out["action"], eager["action"])
        for name in eager_state:
            torch.testing.assert_close(out[f"state/{name}"], eager_state[name], rtol=1e-4, atol=1e-5)
        state = {k: v.clone() for k, v in eager_state.items()}
        if step == 3:  # a publish changes the weights in place: the graph must see them
            other = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device)
            weights.publish(other)
    assert list(graphed.graphs) == [n]


class _ScriptedPool:
    """Workers whose step records are drawn from a seeded generator (the same for every pool made
    with the same seed): random observations, an episode end now and then, and every 7th call a
    time-limit cut in each ready worker (its final observation rides the forward as an extra row).
    ``shared``: as the local backend hands them over, each result's arrays are the rows of its
    worker in ``[slots, ...]`` arrays (``shared_arrays``), which hold every worker's last result."""

    def __init__(self, workers: int, k: int, seed: int = 0, shared: bool = False):
        import numpy as np

        self.num_workers, self.envs_per_worker, self.num_slots = workers, k, workers * k
        self.rng = np.random.default_rng(seed)
        self.calls = 0
        self.arrays = None
        if shared:
            from fwrl.envs.step_record import StepRecord

            self.arrays = StepRecord.of((4,), "float32").allocate(self.num_slots)

    def shared_arrays(self):
        return self.arrays

    def wait(self, timeout=None, workers=None):
        import numpy as np

        from fwrl.envs.worker_pool import StepResult

        self.calls += 1
        k, rng = self.envs_per_worker, self.rng
        among = np.arange(self.num_workers) if workers is None else np.asarray(workers)
        ready = sorted(rng.choice(among, size=int(rng.integers(1, len(among) + 1)), replace=False))
        out = []
        for w in ready:
            cut = np.zeros(k, bool)
            if self.calls % 7 == 0:
                cut[0] = True
            done = (rng.random(k) < 0.1) | cut
            arrays = {"obs": rng.standard_normal((k, 4)).astype(np.float32),
                      "reward": rng.standard_normal(k).astype(np.float32), "done": done, "truncated": cut,
                      "episode_return": np.zeros(k, np.float32), "episode_step": np.zeros(k, np.int32),
                      "task": np.zeros(k, np.int32), "final_obs": rng.standard_normal((k, 4)).astype(np.float32)}
            if self.arrays is not None:  # written into the worker's shared rows, handed over as views of them
                rows = slice(w * k, (w + 1) * k)
                for name, value in arrays.items():
                    self.arrays[name][rows] = value
                arrays = {name: value[rows] for name, value in self.arrays.items()}
            out.append(StepResult(int(w), 0, arrays, []))
        return out

    def act(self, worker, actions):
        pass


def _scripted_loop(model: AgentNet, device: torch.device, **options):
    """(inference loop, its rollout store) of ``model`` over a scripted pool of 4 workers x 2 envs
    (seed 3), rollouts of T 5; ``options`` go to ``InferenceLoop`` (with ``staging="shared"`` the
    pool's results are views of its shared arrays)."""
    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.policy_weights import PolicyWeights
    from fwrl.agents.rollouts import RolloutSpec, RolloutStore
    from fwrl.envs.step_record import StepRecord

    store = RolloutStore(RolloutSpec(5, 2, StepRecord.of((4,), "float32"), 3), 4, device, model.initial_state(1, device))
    pool = _ScriptedPool(4, 2, seed=3, shared=options.get("staging") == "shared")
    loop = InferenceLoop(model, pool, store, device, weights=PolicyWeights(model),
                         batch_wait=0.0, **options)
    return loop, store


def test_the_profile_report_counts_acting_calls_and_their_stages():
    """``fwrl bench throughput --profile-path``'s report: one ``fwrl/acting_call`` range per
    ``InferenceLoop.step``, each stage counted on the CPU only (not the device-side copy of a range
    on CUDA) and divided by the calls."""
    from fwrl.agents.stage_profile import profile_report

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").to(device).eval()
    loop, store = _scripted_loop(model, device)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        loop.step(0.0, on_rollout=store.release)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(12):
            loop.step(0.0, on_rollout=store.release)
    report = profile_report(prof, "t", 1.0)
    assert "Profiled window: 12 acting calls" in report, report[:400]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in report.splitlines() if line.startswith("| fwrl/")}
    assert int(rows["fwrl/env_wait"][1]) == 24  # its two ranges per call: the wait and the actions' send
    assert "fwrl/acting_call" not in rows


def test_the_profile_report_divides_cuda_runtime_calls_by_the_acting_calls():
    """The runtime-call table (CUDA only, so built here from recorded events): each call's count per
    acting call, on the acting thread alone."""
    from types import SimpleNamespace

    from fwrl.agents.stage_profile import profile_report
    from fwrl.agents.stage_timer import ACTING_CALL

    def event(name, thread=1, us=10.0):
        return SimpleNamespace(name=name, thread=thread, cpu_time_total=us, device_type=torch.autograd.DeviceType.CPU)

    events = ([event(ACTING_CALL)] * 4 + [event("cudaLaunchKernel", us=6.0)] * 10
              + [event("cudaStreamSynchronize", us=1500.0)] * 2 + [event("cudaLaunchKernel", thread=2)] * 7)
    profiler = SimpleNamespace(events=lambda: events, key_averages=_NoAverages)
    report = profile_report(profiler, "t", 1.0)
    assert "| cudaLaunchKernel | 10 | 2.5 | 6.0 |" in report, report
    assert "| cudaStreamSynchronize | 2 | 0.5 | 1,500.0 |" in report, report


class _NoAverages(list):
    def table(self, **_):
        return ""


def _eager_and_graphed_loops(core: str, device: torch.device, make_graphed=None, staging: str = "pack"):
    """An eager and a graphed inference loop (greedy, same model) over two scripted pools of the
    same seed, 40 steps each; ``make_graphed(loop)`` replaces the graphed loop's GraphedStep;
    ``staging``: the graphed loop's (the eager one packs)."""
    torch.manual_seed(0)
    model = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device).eval()
    runs = []
    for graph in (False, True):
        loop, store = _scripted_loop(model, device, greedy=True, graph=graph and make_graphed is None,
                                     staging=staging if graph else "pack")
        if graph and make_graphed is not None:
            loop._graphed = make_graphed(loop)
        finished = []
        for _ in range(40):
            loop.step(0.0, on_rollout=lambda r, store=store, finished=finished: (finished.append(store.export(r)),
                                                                                store.release(r)))
        runs.append((loop, store, finished))
    return runs


def _assert_same_steps(eager_run, graphed_run):
    (eager, eager_store, eager_done), (graphed, graphed_store, graphed_done) = eager_run, graphed_run
    graphs = graphed._graphed.graphs  # by step layout: several batch sizes, with and without riders
    assert len({layout.slots for layout in graphs}) >= 2 and any(layout.cut for layout in graphs)
    assert any(not layout.cut for layout in graphs)
    for name in eager.state:
        torch.testing.assert_close(graphed.state[name], eager.state[name], rtol=1e-4, atol=1e-5)
    for name in eager_store.tensors:
        torch.testing.assert_close(graphed_store.tensors[name], eager_store.tensors[name], rtol=1e-4, atol=1e-5)
    for name in eager_store.initial_state:
        torch.testing.assert_close(graphed_store.initial_state[name], eager_store.initial_state[name],
                                   rtol=1e-4, atol=1e-5)
    assert len(graphed_done) == len(eager_done) > 4
    for a, b in zip(eager_done, graphed_done):
        assert (a.worker, a.life) == (b.worker, b.life)
        torch.testing.assert_close(b.tensors, a.tensors, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(b.initial_state, a.initial_state, rtol=1e-4, atol=1e-5)


class _EagerReplay(GraphedStep):
    """A loop's ``GraphedStep`` with each CUDA graph replaced by calls of the step it would capture
    (so it runs on the CPU): the same static buffers, warm-ups and protected state. ``mode`` (a
    dispatch mode), where given, is active in every call of the step."""

    def __init__(self, loop, generator: torch.Generator | None = None, mode=None):  # no CUDA check, no pool
        self.loop, self.mode = loop, mode
        self.device, self.generator = torch.device("cpu"), generator
        self.protect, self.graphs, self._buffers = (lambda: tuple(loop.state.values())), {}, {}
        self.warmups = 0

    def fn(self, static):
        with self.mode if self.mode is not None else contextlib.nullcontext():
            return self.loop._graphed_act(static)

    def _capture(self, static):
        kept = [value.clone() for value in self.protect()]
        for _ in range(WARMUP_CALLS + 1):  # the warm-ups, and the capture's call (which runs here)
            outputs = self.fn(static)
            self.warmups += 1
        for value, before in zip(self.protect(), kept):
            value.copy_(before)
        fn = self.fn

        class Replay:
            @staticmethod
            def replay():
                fill(outputs, fn(static))
        return _Captured(Replay(), outputs)


@pytest.mark.parametrize("staging", ["pack", "shared"])
@pytest.mark.parametrize("core", ["lstm", "rdn"])
def test_the_graphed_acting_path_writes_what_the_eager_path_writes_on_the_cpu(core, staging):
    """The inference loop's graphed path with the CUDA graph replaced by calls of the step it
    captures (so it runs on the CPU): its static buffers, the step's index layout, the warm-up
    calls (which must leave the core state as it was) and the replays leave the state and the
    store as the eager path (packed staging) does; with ``staging="shared"`` the observations come
    from the pool's shared arrays (one buffer for every graph), gathered inside the step."""
    eager, graphed = _eager_and_graphed_loops(core, torch.device("cpu"), _EagerReplay, staging)
    assert graphed[0]._graphed.warmups == (WARMUP_CALLS + 1) * len(graphed[0]._graphed.graphs)
    if staging == "shared":
        buffers = graphed[0]._graphed._buffers.values()  # ActingBatch per layout
        obs = [g.name for g in graphed[0]._staging.groups].index("obs")
        assert len({id(b.groups[obs]) for b in buffers}) == 1 and len(buffers) >= 2  # one [slots, 4] buffer for all
        assert next(iter(buffers)).groups[obs].shape == (8, 4)
    _assert_same_steps(eager, graphed)


def test_shared_staging_over_a_slice_of_the_pool_reads_its_workers_rows():
    """An acting thread's loop over a slice of the pool (its workers 2 and 3: its state rows 0-3,
    the pool's shared rows 4-7) stores what a packing loop over the same slice stores."""
    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.rollouts import RolloutSpec, RolloutStore
    from fwrl.envs.step_record import StepRecord
    from fwrl.envs.worker_pool import PoolSlice

    torch.manual_seed(0)
    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").eval()
    runs = []
    for staging in ("pack", "shared"):
        store = RolloutStore(RolloutSpec(5, 2, StepRecord.of((4,), "float32"), 3), 4, torch.device("cpu"),
                             model.initial_state(1))
        pool = _ScriptedPool(4, 2, seed=3, shared=staging == "shared")
        loop = InferenceLoop(model, PoolSlice(pool, [2, 3]), store, torch.device("cpu"), threading.Lock(),
                             greedy=True, batch_wait=0.0, staging=staging)
        for _ in range(20):
            loop.step(0.0, on_rollout=store.release)
        runs.append((loop, store))
    (pack, pack_store), (shared, shared_store) = runs
    assert shared._staging.shared is not None and pack._staging.shared is None
    for name in pack_store.tensors:
        torch.testing.assert_close(shared_store.tensors[name], pack_store.tensors[name], rtol=0, atol=0)
    assert pack_store.tensors["obs"].abs().sum() > 0


def test_shared_staging_refuses_results_that_are_not_the_pools_rows():
    """Shared staging reads the pool's shared arrays, not the results: a result whose arrays are
    copies (a pool breaking that contract) is refused at its call, never read stale."""
    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").eval()
    loop, store = _scripted_loop(model, torch.device("cpu"), staging="shared")
    assert loop._staging.shared is not None
    wait = loop.pool.wait
    loop.pool.wait = lambda timeout=None: [StepResult(r.worker, r.life, {n: v.copy() for n, v in r.arrays.items()}, [])
                                           for r in wait(timeout)]
    with pytest.raises(ValueError, match="not the pool's shared rows"):
        loop.step(0.0, on_rollout=store.release)


def test_shared_staging_packs_where_the_pool_shares_nothing():
    """A pool without shared arrays (the Ray backend's results are copies) is staged by packing."""
    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").eval()
    loop, store = _scripted_loop(model, torch.device("cpu"), staging="pack")
    from fwrl.agents.inference import InferenceLoop

    shared_loop = InferenceLoop(model, loop.pool, store, torch.device("cpu"), staging="shared")
    assert shared_loop._staging.shared is None  # _ScriptedPool(shared=False) shares nothing
    with pytest.raises(FwrlError, match="acting staging.*'copy'.*pack, shared"):
        InferenceLoop(model, loop.pool, store, torch.device("cpu"), staging="copy")


class _HostSyncs(TorchDispatchMode):
    """Records every op that, on a CUDA device, makes the host wait for the device: a tensor's
    value read on the host (``item()``, ``bool()``, ``equal``), or an output whose size depends on
    values (``nonzero``, boolean masks, ``unique``, ``repeat_interleave`` without its size), and
    every tensor made from host data (``torch.tensor``: on a GPU, an upload from pageable memory).
    A CUDA graph cannot capture them; this finds them on the CPU."""

    SYNCING = frozenset({"_local_scalar_dense", "lift_fresh", "nonzero", "masked_select", "unique", "_unique",
                         "_unique2", "unique_dim", "unique_consecutive", "equal", "is_nonzero", "allclose", "bincount",
                         "histc"})

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        masks = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ()) if i is not None)
        sized = name == "repeat_interleave" and kwargs.get("output_size") is None and func._overloadname != "self_int"
        if name in self.SYNCING or masks or sized:
            self.found.append(str(func))
        return func(*args, **kwargs)


@pytest.mark.parametrize("core,staging", [(core, "pack") for core in sorted(CORES)] + [("rdn", "shared")])
def test_the_graphed_acting_step_makes_no_host_sync(core, staging, monkeypatch):
    """The step a graphed loop captures (state gather, the forward sampling with Gumbel noise,
    the riders of time-limit cuts, the state scatter, the store writes), run on the CPU for 20
    steps of a scripted pool, issues no op that would make a GPU's host wait: a CUDA graph cannot
    capture one (the capture fails, or worse, the replay reuses a value read once). The rules run
    their references here, the stand-ins of the fused kernels a GPU runs (the rules' CPU paths read
    the reset steps on the host: they never run under a capture, ``fwrl.kernels.dispatch``)."""
    monkeypatch.setenv("FWRL_KERNELS", "reference")
    torch.manual_seed(0)
    device = torch.device("cpu")
    loop, store = _scripted_loop(AgentNet((4,), 3, core, CORES[core], stem="mlp").eval(), device, staging=staging)
    syncs = _HostSyncs()
    loop._graphed = _EagerReplay(loop, torch.Generator().manual_seed(1), syncs)
    for _ in range(20):
        loop.step(0.0, on_rollout=store.release)
    assert any(layout.cut for layout in loop._graphed.graphs), "no step with riders"
    assert syncs.found == []


@needs_cuda
@pytest.mark.parametrize("core,staging", [("lstm", "pack"), ("rdn", "pack"), ("rdn", "shared")])
def test_a_graphed_acting_step_writes_what_the_eager_step_writes(core, staging):
    """The whole acting step as CUDA graphs (the state's gather and scatter, the forward, the
    store's writes) leaves the core state and the store as the eager step does, greedy, over
    page turns, batch sizes that vary and time-limit cuts (their riders ride the graph); with
    ``staging="shared"``, the observations copied from the pool's shared arrays (registered as
    pinned memory) run by run, and gathered inside the graph."""
    _assert_same_steps(*_eager_and_graphed_loops(core, torch.device("cuda"), staging=staging))


@needs_cuda
@pytest.mark.parametrize("core", ["lstm", "elstm"])
@pytest.mark.parametrize("graph", [False, True])
def test_replay_on_cuda_with_streams(core, graph):
    """The replay test of tests/e2e/test_acting_into_the_store.py with the store, the state and the forward on a
    CUDA device, acting on its own stream while another stream publishes weights (the graphed
    acting step on a high-priority stream: ``--acting-priority high``)."""
    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights
    from fwrl.agents.rollouts import RolloutSpec, RolloutStore
    from fwrl.envs.local_workers import LocalWorkerPool
    from fwrl.envs.step_record import StepRecord
    from fwrl.envs.worker_pool import PoolSettings

    torch.manual_seed(0)
    device = torch.device("cuda")
    T = 6
    pool = LocalWorkerPool(PoolSettings("memory:cue_delay?delay=2&num_cues=3", 2, 2, seed=5))
    model = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device).eval()
    learner_model = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device)
    streams = DeviceStreams(device, acting_priority="high" if graph else "normal")
    weights = PolicyWeights(model, streams)
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of((4,), "float32"), 3), 2, device, model.initial_state(1, device))
    rollouts = []

    def keep(r):
        data = store.export(r)
        rollouts.append((data, weights.version))
        store.release(r)

    previous = streams.make_current(streams.inference)
    pool.start()
    try:
        loop = InferenceLoop(model, pool, store, device, weights=weights, graph=graph)
        snapshots = {}
        while len(rollouts) < 8:
            loop.step(5.0, on_rollout=keep)
            if loop.agent_steps % 24 == 0:  # publish from the learner stream, as the learner thread does
                with torch.cuda.stream(streams.learner):
                    weights.publish(learner_model)
                with torch.no_grad():
                    learner_model.policy.weight.add_(0.1)
            snapshots[weights.version] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        pool.close()
        streams.make_current(previous)
    assert _replay_single_version_rollouts([data for data, _ in rollouts], core, snapshots, device) >= 2


def _replay_single_version_rollouts(rollouts, core, snapshots, device) -> int:
    """Replays each rollout whose rows one weights version acted (``snapshots[version]``: those weights)
    from its initial state and checks the stored logits; returns how many it replayed."""
    replayed = 0
    for data in rollouts:
        versions = data.tensors["policy_version"][:, 0].tolist()
        if len(set(versions[1:])) != 1:
            continue  # the weights changed inside this rollout: a single replay cannot match it
        acting = AgentNet((4,), 3, core, CORES[core], stem="mlp").to(device)
        acting.load_state_dict(snapshots[versions[1]])
        with torch.no_grad():
            out, _ = acting({k: data.tensors[k].to(device) for k in ("obs", "reward", "done")},
                            {k: v.to(device) for k, v in data.initial_state.items()})
        torch.testing.assert_close(out["policy_logits"][:-1].cpu(), data.tensors["policy_logits"][1:],
                                   rtol=1e-4, atol=1e-4)
        replayed += 1
    return replayed


@needs_cuda
@pytest.mark.parametrize("graph", [False, True])
def test_replay_on_cuda_with_two_acting_threads(graph):
    """Two acting threads, each on its own stream with its own loop (and graphs) over half of the
    workers, write one store on the device while this thread publishes weights from the learner
    stream: every rollout that one weights version acted replays to the outputs stored for it."""
    import threading

    from fwrl.agents.inference import InferenceLoop
    from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights
    from fwrl.agents.rollouts import RolloutSpec, RolloutStore
    from fwrl.envs.local_workers import LocalWorkerPool
    from fwrl.envs.step_record import StepRecord
    from fwrl.envs.worker_pool import PoolSettings, PoolSlice, split_workers

    torch.manual_seed(0)
    device, T, workers = torch.device("cuda"), 6, 4
    pool = LocalWorkerPool(PoolSettings("memory:cue_delay?delay=2&num_cues=3", workers, 2, seed=5))
    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").to(device).eval()
    learner_model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").to(device)
    streams = DeviceStreams(device, acting_threads=2)
    weights = PolicyWeights(model, streams)
    store = RolloutStore(RolloutSpec(T, 2, StepRecord.of((4,), "float32"), 3), workers, device,
                         model.initial_state(1, device))
    loops = [InferenceLoop(model, PoolSlice(pool, part), store, device, weights=weights, graph=graph)
             for part in split_workers(workers, 2)]
    snapshots = {0: {k: v.detach().clone() for k, v in model.state_dict().items()}}
    rollouts, kept, enough, errors = [], threading.Lock(), threading.Event(), []

    def keep(r):
        data = store.export(r)
        store.release(r)
        with kept:
            rollouts.append(data)
            # both threads' workers must have delivered: a thread's first forward (its cuBLAS handle,
            # its graphs) can take longer than the other thread's first 16 rollouts
            if len(rollouts) >= 16 and {d.worker for d in rollouts} == set(range(workers)):
                enough.set()

    def serve(index):
        try:
            with torch.cuda.stream(streams.acting[index]):
                while not enough.is_set():
                    loops[index].step(5.0, on_rollout=keep)
        except BaseException as exc:  # noqa: BLE001 - failed below
            errors.append(exc)
            enough.set()

    pool.start()
    threads = [threading.Thread(target=serve, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        with torch.cuda.stream(streams.learner):
            while not enough.wait(0.05):  # publish as the learner thread does, and keep what was published
                if time.monotonic() > deadline:
                    enough.set()
                    break
                version = weights.publish(learner_model)
                snapshots[version] = {k: v.detach().clone() for k, v in model.state_dict().items()}
                with torch.no_grad():
                    learner_model.policy.weight.add_(0.1)
        for thread in threads:
            thread.join(60)
    finally:
        pool.close()
    assert not errors, errors
    torch.cuda.synchronize()
    served = {r.worker for r in rollouts}
    assert served == set(range(workers)), f"in 60 s only workers {sorted(served)} delivered a rollout"
    replayed = _replay_single_version_rollouts(rollouts, "lstm", snapshots, device)
    assert replayed >= 2
    assert len(snapshots) > 2, "the weights were published while the threads acted"


@needs_cuda
@pytest.mark.parametrize("acting_threads", [1, 2])
def test_train_on_cuda_logs_where_the_time_goes(tmp_path, acting_threads):
    import csv

    from fwrl.settings.config import TrainConfig
    from fwrl.runner.train import train

    config = TrainConfig(env="memory:cue_delay?delay=3", core="lstm", core_options={"hidden_size": 32},
                         num_workers=2, envs_per_worker=4, batch_size=8, unroll_length=10, total_steps=6000,
                         device="cuda", log_interval=1.0, inference_graph=True, num_threads=1,
                         acting_threads=acting_threads)
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "budget"
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    last = rows[-1]
    for key in ("share/env_wait", "share/inference_forward", "share/learner_backward", "policy_lag_mean",
                "rollout_queue", "peak_memory_mb"):
        assert key in last, key
    assert float(last["peak_memory_mb"]) > 0
    assert 0 <= float(last["share/learner_backward"]) <= 1


@needs_cuda
@pytest.mark.parametrize("core", ["rdn", "lstm"])
def test_the_update_process_on_cuda_trains_like_the_learner_thread(core):
    """``--learner-process on`` on a GPU: the process trains the parent's device tensors through CUDA
    IPC, in order with the parent's stream (the same updates as the learner thread's, to float
    tolerance: two processes' kernels need not sum alike), and its optimiser's state comes back.

    The tolerances: fp32 sums in another order differ by about 1e-6 relative, the statistics'
    ``rel=1e-4`` leaves 100x that. A weight's step is lr * g / (sqrt(v / c) + eps) (the bias-corrected
    RMSProp of ``fwrl.agents.optim``; here lr 1e-3, eps 0.01), whose change with g is at most
    lr / eps = 0.1, so a gradient that differs by 1e-6 moves it by at most 1e-7 a step: ``atol=1e-5``
    over three steps leaves 30x that. A race between the two streams (the bug this test is for) moves
    weights by up to a whole step, lr = 1e-3."""
    from tests.e2e.test_learner_process import _batch, _learner

    here, info = _learner(core, process=False, device="cuda")
    there, _ = _learner(core, process=True, device="cuda")
    assert there.start()
    try:
        for seed in range(3):  # the optimiser's state and the schedule carry across updates
            expected = here.update_batch(_batch(info, seed, here))
            got = there.update_batch(_batch(info, seed, there))
            assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)
            for (name, a), b in zip(here.model.state_dict().items(), there.model.state_dict().values()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
            for a, b in zip(here.weights.model.parameters(), there.weights.model.parameters()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)  # published to the acting copy
        assert there.timer.collect()[0]["learner_forward"] > 0  # the process's stage times came back
        there.sync()
        mine, theirs = here.optimizer.state_dict()["state"], there.optimizer.state_dict()["state"]
        assert mine.keys() == theirs.keys()
        for index, state in mine.items():
            for key, value in state.items():
                torch.testing.assert_close(torch.as_tensor(theirs[index][key]).cpu(), torch.as_tensor(value).cpu(),
                                           rtol=1e-4, atol=1e-5, msg=f"{index} {key}")
                if torch.is_tensor(value) and value.dim() > 0:
                    assert theirs[index][key].device == value.device  # back beside the weights it steps
    finally:
        there.close()
    assert not there.process.running


@needs_cuda
def test_a_cuda_run_with_the_update_process_checkpoints_what_it_trained_and_resumes(tmp_path):
    import csv

    from fwrl.runner.train import train
    from fwrl.settings.config import TrainConfig

    config = TrainConfig(env="memory:cue_delay?delay=3", core="rdn", core_options=CORES["rdn"], num_workers=2,
                         envs_per_worker=4, batch_size=8, unroll_length=10, total_steps=4000, device="cuda",
                         log_interval=1.0, num_threads=1, learner_process="on")
    result = train(config, tmp_path / "run")
    assert result.stopped_by == "budget"
    saved = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert saved["updates"] == 50
    steps = {int(s["step"]) for s in saved["optimizer"]["state"].values()}
    assert steps == {50}, steps  # the optimiser's state as the process left it
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert max(float(row.get("share/learner_forward") or 0) for row in rows) > 0  # the process's times came back
    # resumed: the optimiser's state goes from the checkpoint to the device, and from there to a new process
    result = train(config.model_copy(update={"total_steps": 8000}), tmp_path / "run", resume=True)
    assert result.stopped_by == "budget"
    again = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert again["updates"] == 100 and {int(s["step"]) for s in again["optimizer"]["state"].values()} == {100}
    assert any(not torch.equal(saved["model"][k], again["model"][k]) for k in saved["model"])


@needs_cuda
def test_high_acting_priority_puts_the_acting_streams_above_the_learners():
    from fwrl.agents.policy_weights import DeviceStreams

    high, normal = DeviceStreams("cuda", 2, "high"), DeviceStreams("cuda", 2)
    assert all(stream.priority < high.learner.priority for stream in high.acting)
    assert all(stream.priority == normal.learner.priority for stream in normal.acting)


def test_acting_priority_is_checked_and_means_nothing_on_the_cpu():
    from fwrl.agents.policy_weights import DeviceStreams

    assert DeviceStreams("cpu", 1, "high").acting == ()
    with pytest.raises(FwrlError, match="'urgent'; valid choices: high, normal"):
        DeviceStreams("cpu", 1, "urgent")


def test_acting_copy_is_a_frozen_eval_copy_with_the_same_weights():
    from fwrl.agents.policy_weights import acting_copy

    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").train()
    acting = acting_copy(model)
    assert not acting.training and model.training
    assert all(not p.requires_grad for p in acting.parameters())
    assert all(p.requires_grad for p in model.parameters())
    for (name, a), b in zip(acting.state_dict().items(), model.state_dict().values()):
        assert a.data_ptr() != b.data_ptr(), name
        torch.testing.assert_close(a, b)


@needs_cuda
def test_acting_copy_keeps_cudnn_lstm_weights_in_one_buffer():
    """A plain deepcopy of a CUDA nn.LSTM makes cuDNN compact its weights at every call (and warn);
    the acting copy acts without that warning."""
    import warnings

    from fwrl.agents.policy_weights import acting_copy

    model = AgentNet((4,), 3, "lstm", CORES["lstm"], stem="mlp").cuda()
    acting = acting_copy(model)
    n = 4
    inputs = {"obs": torch.randn(1, n, 4, device="cuda"), "reward": torch.zeros(1, n, device="cuda"),
              "done": torch.zeros(1, n, dtype=torch.bool, device="cuda")}
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        acting(inputs, acting.initial_state(n, "cuda"))
    assert not [w for w in caught if "contiguous chunk of memory" in str(w.message)]
