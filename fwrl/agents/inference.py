"""Central batched inference for every env slot (ARCHITECTURE.md, Processes and machines).

One ``InferenceLoop.step`` takes the results of whichever workers are ready,
runs one batched forward (T = 1) over their slots, sends the actions back,
and writes the step into the rollout store. Everything the model touches
stays on the learner's device:

- the per-slot core state lives there (``state``: ``[slots, ...]``); a step
  gathers the ready slots' rows (eager, a run of consecutive slots: reads them
  in place), and only slots that start a rollout have their state copied
  (device to device) into the store;
- observations and the other env arrays go host -> device once per step, on
  CUDA from pinned memory without blocking, and the same device tensors feed
  the forward and the store;
- only the actions come back to the host (the workers need them);
- where a time limit cut an episode, its final observation rides the same
  forward as an extra row (the slot's state, not reset; ``done`` false): its
  value is the ``bootstrap_value`` the learner bootstraps the cut from, and
  its action and state are dropped (no second forward).

The acting weights are a :class:`~fwrl.agents.policy_weights.PolicyWeights`
the learner publishes into; each stored row carries their version.

A loop may step a slice of a pool (:class:`~fwrl.envs.worker_pool.PoolSlice`):
its state holds only the slice's slots, while the store and the pool name
workers by their number in the whole pool (``fwrl.runner.acting`` runs one
loop per acting thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn

from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights
from fwrl.agents.rollouts import AGENT_KEYS, BOOTSTRAP_KEY, TORCH_DTYPES, Rollout, RolloutStore
from fwrl.agents.shared_staging import SharedRows
from fwrl.agents.stage_timer import ACTING_CALL, StageTimer
from fwrl.envs.step_record import DONE, FINAL_OF, OBS, OBS_EXTRA, REWARD, TRUNCATED, ColumnGroup, StepRecord
from fwrl.envs.worker_pool import EpisodeRecord, StepResult, StepSource
from fwrl.errors import unknown_choice

# Stages of the inference thread (fwrl.agents.stage_timer): waiting for env
# workers and sending them actions, the forward (and the actions' trip back
# to the host), store and staging work.
INFERENCE_STAGES = ("env_wait", "inference_forward", "rollout_bookkeeping")
INDEX = "index"  # the step's indices (StepIndex), one int64 upload
STAGINGS = ("pack", "shared")  # how an acting call stages the workers' observations (InferenceLoop)
RIDER = "rider/"  # + OBS / OBS_EXTRA: the cut episodes' final observations, one row per cut slot


class StepIndex(NamedTuple):
    """The indices of one acting step over n slots, uploaded as one int64 tensor (``INDEX``) and
    read back on the device as named views of it.

    - ``slots`` [n]: each slot's row in the loop's core state;
    - ``pool_slots`` [n]: each slot's row in the pool's shared arrays (``worker * K + env``), where
      staging reads observations from them (``staging="shared"``; else empty);
    - ``env_entries``, ``agent_entries`` [n]: the store's entries of obs t and of the agent's output
      (``RolloutStore.plan``; empty without a store);
    - ``cut`` [c]: the batch positions of the slots whose episode a time limit cut, whose final
      observations ride the forward (``InferenceLoop._riders``; empty without a store).
    """

    slots: Any
    pool_slots: Any
    env_entries: Any
    agent_entries: Any
    cut: Any

    @staticmethod
    def pack(slots: np.ndarray, plan: Any = None, cut: np.ndarray | None = None,
             pool_slots: np.ndarray | None = None) -> np.ndarray:
        """The host array to upload: ``slots``, with a store's ``plan`` its entries and ``cut``, then
        ``pool_slots`` where given."""
        parts = [slots]
        if plan is not None:
            parts += [plan.env_entries, plan.agent_entries, cut]
        if pool_slots is not None:
            parts.append(pool_slots)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @classmethod
    def unpack(cls, index: torch.Tensor, n: int, stored: bool, shared: bool = False) -> "StepIndex":
        """The views of an uploaded ``index`` of ``n`` slots (``stored``: packed with a store's plan;
        ``shared``: with the pool slots, its last n entries)."""
        none = index[n:n]
        end = len(index) - n if shared else len(index)
        pool_slots = index[end:] if shared else none
        if not stored:
            return cls(index[:n], pool_slots, none, none, none)
        return cls(index[:n], pool_slots, index[n:2 * n], index[2 * n:3 * n], index[3 * n:end])


class _Staging:
    """The stored columns of the ready workers' step records, packed in their groups
    (``fwrl.envs.step_record.ColumnGroup``: the observations, the scalars of each dtype) as
    ``[N*K, ...]`` tensors on the device, and the step's other host arrays (its indices, the
    riders' observations): one host buffer and one upload each.

    On CUDA they are packed into pinned host buffers (allocated on first use) and copied without
    blocking on the current stream; the buffers are not written again before that copy has finished.

    With the pool's ``shared`` arrays (``staging="shared"``) the observation groups are not packed:
    they come whole from :class:`~fwrl.agents.shared_staging.SharedRows`, ``[slots, ...]`` with the
    ready workers' rows current, and the step gathers its rows (:meth:`gather`).
    """

    def __init__(self, device: torch.device, num_slots: int, record: StepRecord | None = None,
                 shared: dict[str, np.ndarray] | None = None, k: int = 1):
        self.device = device
        self.num_slots = num_slots
        self.record = record
        self.groups: tuple[ColumnGroup, ...] = record.groups() if record is not None else ()
        self.shared = SharedRows(shared, self.groups, device, k) if shared is not None and record is not None else None
        self.packed = tuple(g for g in self.groups if self.shared is None or g.name not in self.shared.names)
        self.pinned: dict[str, torch.Tensor] = {}
        self.copied: torch.cuda.Event | None = None

    def upload(self, results: list[StepResult], extras: dict[str, np.ndarray],
               out: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """The groups of ``results`` (by group name) and the host arrays ``extras`` (by their names)
        on the device: into the tensors of ``out`` (a graph's static inputs) where given."""
        if self.record is None:  # a source without a described record (evaluation): its arrays say it
            self.record = StepRecord.of_arrays(results[0].arrays)
            self.groups = self.packed = self.record.groups()
        parts = [r.arrays for r in results]
        shared = self.shared.upload(results) if self.shared is not None else {}
        if self.device.type != "cuda":
            packed = {g.name: torch.from_numpy(g.pack(parts)) for g in self.packed}
            packed.update((name, torch.from_numpy(array)) for name, array in extras.items())
            if out is not None:
                packed = {name: out[name].copy_(value) for name, value in packed.items()}
            return {**packed, **shared}
        if self.copied is not None:
            self.copied.synchronize()
        n = sum(len(p[REWARD]) for p in parts)
        hosts = {}
        for g in self.packed:
            hosts[g.name] = self._pinned(g.name, (n, *g.shape), TORCH_DTYPES[g.dtype])
            g.pack(parts, out=hosts[g.name].numpy())
        for name, array in extras.items():
            hosts[name] = self._pinned(name, array.shape, torch.from_numpy(array).dtype)
            hosts[name].numpy()[...] = array
        if out is None:
            uploaded = {name: host.to(self.device, non_blocking=True) for name, host in hosts.items()}
        else:
            uploaded = {name: out[name].copy_(host, non_blocking=True) for name, host in hosts.items()}
        self.copied = torch.cuda.Event()
        self.copied.record()
        return {**uploaded, **shared}

    def _pinned(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The first ``shape[0]`` rows of the pinned host buffer ``name`` (made, or made larger, here)."""
        buffer = self.pinned.get(name)
        if buffer is None or len(buffer) < shape[0] or buffer.shape[1:] != shape[1:] or buffer.dtype != dtype:
            rows = max(shape[0], self.num_slots * (5 if name == INDEX else 1))
            buffer = self.pinned[name] = torch.empty((rows, *shape[1:]), dtype=dtype, pin_memory=True)
        return buffer[:shape[0]]

    def shapes(self, n: int, extras: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shape and dtype of every tensor :meth:`upload` gives for ``n`` slots and ``extras``."""
        out = {g.name: ((n, *g.shape), TORCH_DTYPES[g.dtype]) for g in self.packed}
        out.update((name, (tuple(value.shape), value.dtype)) for name, value in self.fixed().items())
        out.update((name, (array.shape, torch.from_numpy(array).dtype)) for name, array in extras.items())
        return out

    def fixed(self) -> dict[str, torch.Tensor]:
        """The tensors :meth:`upload` gives at every call, whatever the batch (the shared groups'
        buffers): a graph's static inputs for them."""
        return self.shared.buffers if self.shared is not None else {}

    def gather(self, tensors: dict[str, torch.Tensor], pool_slots: torch.Tensor) -> dict[str, torch.Tensor]:
        """The step's ``tensors`` with the shared groups cut to the rows of ``pool_slots`` (device work)."""
        return tensors if self.shared is None else self.shared.gather(tensors, pool_slots)

    def column(self, values: dict[str, Any], name: str) -> Any:
        """Column ``name`` of the packed groups ``values`` (device tensors or the host arrays): a view."""
        for g in self.groups:
            if name in g.columns:
                index = g.index(name)
                return values[g.name] if index is None else values[g.name][:, index]
        raise KeyError(name)


STATE_IN = "state_in/"  # an acting step's output: the core state of its slots before it


class _Untimed:
    """The stage timer of a captured step: no stages (the replay is timed as a whole)."""

    @staticmethod
    def stage(name: str, device_work: bool = False) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


_UNTIMED = _Untimed()


class InferenceLoop:
    def __init__(
        self,
        model: nn.Module,
        pool: StepSource,
        store: RolloutStore | None,
        device: torch.device,
        lock: threading.Lock | None = None,
        greedy: bool = False,
        min_batch: int | None = None,
        batch_wait: float = 0.004,
        weights: PolicyWeights | None = None,
        timer: StageTimer | None = None,
        streams: DeviceStreams | None = None,
        graph: bool = False,
        trace: bool = False,
        staging: str = "pack",
    ):
        """``model`` acts; pass ``weights`` (whose ``model`` it is) when a learner publishes into it,
        else ``lock`` guards it. ``streams.inference`` is made current by the caller's thread
        (see ``fwrl.runner.train``); the loop itself only uses the current stream. ``graph``:
        replay the forward as CUDA graphs (``fwrl.agents.inference_graph``). ``trace``: the core's
        step from a TorchScript trace on the CPU (``fwrl.agents.traced_core``). ``staging``: "pack"
        the ready workers' observations into one upload, or read them from the pool's "shared"
        arrays (``fwrl.agents.shared_staging``; a pool without them, or a loop without a store, packs)."""
        if staging not in STAGINGS:
            raise unknown_choice("acting staging", staging, STAGINGS)
        self.weights = weights if weights is not None else PolicyWeights(model, streams, lock)
        self.model = self.weights.model
        self.pool = pool
        self.store = store
        self.device = torch.device(device)
        self.greedy = greedy
        self.state = self.model.initial_state(pool.num_slots, self.device)
        self.k = pool.envs_per_worker
        # a worker's number in the pool -> its place in this loop's slots (a slice holds some of them)
        workers = np.asarray(getattr(pool, "workers", range(pool.num_workers)))
        self._place = np.full(workers.max() + 1, -1, np.int64)
        self._place[workers] = np.arange(len(workers))
        self.timer = timer if timer is not None else StageTimer(self.device)
        shared = getattr(pool, "shared_arrays", lambda: None)() if staging == "shared" and store is not None else None
        self._staging = _Staging(self.device, pool.num_slots, store.spec.record if store is not None else None,
                                 shared, pool.envs_per_worker)
        self._no_values = torch.zeros(pool.num_slots, device=self.device)
        self._action_host: tuple[torch.Tensor, np.ndarray] | None = None  # (tensor, its numpy view)
        self._graphed = None
        if graph:
            from fwrl.agents.inference_graph import GraphedStep, own_generator

            self._graphed = GraphedStep(self._graphed_act, self.device, own_generator(self.device),
                                        protect=lambda: self.state)
        self._core_step = None
        if trace:
            from fwrl.agents.traced_core import TracedCoreStep

            self._core_step = TracedCoreStep(self.model.core)
        self._offsets = np.arange(self.k)
        # Dynamic batching: act on whichever workers are ready, but give the
        # others up to ``batch_wait`` seconds to join until ``min_batch``
        # workers are ready: a forward over 4 slots costs little more than over 1.
        self.min_batch = min_batch if min_batch is not None else max(1, pool.num_workers // 2)
        self.batch_wait = batch_wait
        self.agent_steps = 0
        self.restarts_seen = 0

    def _wait(self, timeout: float) -> list[StepResult]:
        results: list[StepResult] = self.pool.wait(timeout)
        if results and len(results) < self.min_batch and self.batch_wait > 0:
            deadline = time.monotonic() + self.batch_wait
            while len(results) < self.min_batch and (left := deadline - time.monotonic()) > 0:
                results += self.pool.wait(left)
        return results

    def _riders(self, tensors: dict[str, torch.Tensor], cut: torch.Tensor, inputs: dict[str, torch.Tensor],
                state_in: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The inputs and states of the forward: the step's slots (``inputs``, ``state_in``), then one
        row per slot at the batch positions ``cut`` (a time limit cut its episode) with that
        episode's final observation (``tensors[RIDER + key]``), the step's reward, ``done`` false
        and the slot's state (the cut episode's, not reset)."""
        extra = {key: tensors[RIDER + key] for key in (OBS, OBS_EXTRA) if key in inputs}
        extra[REWARD] = inputs[REWARD].index_select(0, cut)
        extra[DONE] = torch.zeros(len(cut), dtype=torch.bool, device=self.device)
        inputs = {key: torch.cat([value, extra[key]]) for key, value in inputs.items()}
        state = {name: torch.cat([value, value.index_select(0, cut)]) for name, value in state_in.items()}
        return inputs, state

    def _bootstrap_values(self, baseline: torch.Tensor, n: int, cut: torch.Tensor) -> torch.Tensor:
        """Per slot: the value of the rider of its cut episode (rows ``n:`` of the forward; ``cut``:
        the cut slots' batch positions), 0 where no time limit cut one."""
        if len(cut) == 0:
            return self._no_values[:n]  # never written: the store copies it
        values = torch.zeros(n, device=self.device)
        values.index_copy_(0, cut, baseline[n:].float())
        return values

    def _actions_to_host(self, action: torch.Tensor) -> np.ndarray:
        """``action`` [n, ...] copied into this loop's host buffer (pinned on a GPU; allocated once):
        its numpy view, valid until the next step (the pools copy actions when they send them)."""
        if self._action_host is None:
            host = torch.empty((self.pool.num_slots, *action.shape[1:]), dtype=action.dtype,
                               pin_memory=self.device.type == "cuda")
            self._action_host = (host, host.numpy())
        host, view = self._action_host
        host[:len(action)].copy_(action)
        return view[:len(action)]

    def step(
        self,
        timeout: float,
        on_rollout: Callable[[Rollout], None] | None = None,
        on_episode: Callable[[EpisodeRecord], None] | None = None,
    ) -> int:
        """Serve the ready workers once; returns the number of slots stepped. Under ``torch.profiler``
        the call is the range ``ACTING_CALL`` (``fwrl.agents.stage_profile`` counts them)."""
        if not torch.autograd._profiler_enabled():  # a range costs a dispatcher call: only when profiled
            return self._step(timeout, on_rollout, on_episode)
        with torch.profiler.record_function(ACTING_CALL):
            return self._step(timeout, on_rollout, on_episode)

    @torch.inference_mode()
    def _step(self, timeout: float, on_rollout: Callable[[Rollout], None] | None,
              on_episode: Callable[[EpisodeRecord], None] | None) -> int:
        timer = self.timer
        with timer.stage("env_wait"):
            results = self._wait(timeout)
        if not results:
            return 0
        k = self.k
        if self._graphed is None:  # consecutive workers in order: their slots are one run of the state
            results.sort(key=lambda r: self._place[r.worker])
        workers = [r.worker for r in results]
        n = len(workers) * k
        with timer.stage("rollout_bookkeeping", device_work=True):
            slots = (self._place[workers][:, None] * k + self._offsets).ravel()
            extras = {}
            plan = cut = None
            if self.store is not None:  # evaluation (no store) bootstraps nothing: no riders
                plan = self.store.plan(workers, [r.life for r in results])
                truncated = [r.arrays[TRUNCATED] for r in results]
                cut = np.flatnonzero(np.concatenate(truncated))
                for key in (OBS, OBS_EXTRA):  # the cut slots' final observations alone, in batch order
                    if len(cut) and key in self._staging.record.names:
                        extras[RIDER + key] = np.concatenate([r.arrays[FINAL_OF[key]][flags]
                                                              for r, flags in zip(results, truncated)])
            pool_slots = None if self._staging.shared is None else (np.asarray(workers)[:, None] * k + self._offsets).ravel()
            extras[INDEX] = StepIndex.pack(slots, plan, cut, pool_slots)
            # one graph per batch size and number of riders
            key = (n, len(extras[INDEX]))
            static = (self._graphed.buffers(key, self._staging.shapes(n, extras), self._staging.fixed())
                      if self._graphed is not None else None)
            tensors = self._staging.upload(results, extras, out=static)
        if self._graphed is not None:
            with timer.stage("inference_forward", device_work=True), self.weights.acting() as version:
                out = self._graphed.step(key, tensors)
        else:
            run = int(slots[0]) if slots[-1] - slots[0] == n - 1 else None
            keep = plan is not None and len(plan.starting) > 0
            out, version = self._act(tensors, timer, run=run, keep_state_in=keep)
        with timer.stage("inference_forward", device_work=True):
            actions = self._actions_to_host(out["action"])
        with timer.stage("env_wait"):  # the workers step while the store completes the step
            for i, r in enumerate(results):
                self.pool.act(r.worker, actions[i * k:(i + 1) * k])
        if plan is not None:
            with timer.stage("rollout_bookkeeping", device_work=True):
                self.store.complete(plan, {name[len(STATE_IN):]: value for name, value in out.items()
                                           if name.startswith(STATE_IN)}, version, on_rollout)
        if on_episode is not None:
            for r in results:
                for record in r.episodes:
                    on_episode(record)
        self.restarts_seen += sum(r.restarted for r in results)
        self.agent_steps += n
        return n

    def _act(self, tensors: dict[str, torch.Tensor], timer: StageTimer | _Untimed = _UNTIMED,
             sampling: dict[str, Any] | None = None, hold: bool = True, run: int | None = None,
             keep_state_in: bool = True) -> tuple[dict[str, torch.Tensor], int | None]:
        """The device work of one inference step over the n slots of ``tensors`` (as staging uploads
        them: the env groups, ``INDEX``, the riders' observations): the slots' core state gathered,
        the forward (T = 1; the riders of cut episodes ride it as extra rows), the state scattered
        back, the step written into the store. Returns the actions and the gathered state
        (``STATE_IN + name``), and the version of the weights that acted (held for the forward; with
        ``hold`` false the caller holds them: None).

        Everything here is device work with no host sync and shapes fixed by the batch size and the
        number of riders, so :class:`~fwrl.agents.inference_graph.GraphedStep` captures it.

        An eager caller whose slots are one run of the state, ``run`` to ``run + n - 1`` in order,
        passes ``run``: the forward then reads the state's rows in place and its new state is one
        plain copy back, where gathering and scattering rows by index cost several passes over the
        state (a fast-weight core's or RTRL's state is MBs a step). The returned ``STATE_IN`` is
        then a copy only with ``keep_state_in`` (a rollout starts at this step: the store copies
        its initial state); else it is those rows, already overwritten, and must not be read."""
        n = len(self._staging.column(tensors, REWARD))
        index = StepIndex.unpack(tensors[INDEX], n, stored=self.store is not None,
                                 shared=self._staging.shared is not None)
        slots, cut = index.slots, index.cut
        tensors = self._staging.gather(tensors, index.pool_slots)
        with timer.stage("rollout_bookkeeping", device_work=True):
            if run is None:
                state_in = {name: value.index_select(0, slots) for name, value in self.state.items()}
            else:  # the rows in place; a copy where the store reads them after the step
                state_in = {name: value.narrow(0, run, n).clone() if keep_state_in else value.narrow(0, run, n)
                            for name, value in self.state.items()}
            inputs = {key: self._staging.column(tensors, key) for key in (OBS, REWARD, DONE, OBS_EXTRA)
                      if key in self._staging.record.names}
            state = state_in
            if len(cut):
                inputs, state = self._riders(tensors, cut, inputs, state_in)
        with timer.stage("inference_forward", device_work=True):
            inputs = {key: value.unsqueeze(0) for key, value in inputs.items()}
            with self.weights.acting() if hold else contextlib.nullcontext() as version:
                extra = {} if self._core_step is None else {"core_step": self._core_step}
                out, state_out = self.model(inputs, state, greedy=self.greedy, **(sampling or {}), **extra)
            for name, value in state_out.items():
                value = value if len(value) == n else value[:n]
                if run is None:
                    self.state[name].index_copy_(0, slots, value)
                else:
                    self.state[name].narrow(0, run, n).copy_(value)
            # the step's rows (T = 1) of the outputs, the riders' left out
            agent = {key: out[key][0] if not len(cut) else out[key][0, :n] for key in AGENT_KEYS}
        if self.store is not None:
            with timer.stage("rollout_bookkeeping", device_work=True):
                env = {g.name: tensors[g.name] for g in self._staging.groups}
                env[BOOTSTRAP_KEY] = self._bootstrap_values(out["baseline"][0], n, cut)
                self.store.write(index.env_entries, index.agent_entries, env, agent)
        return {"action": agent["action"], **{STATE_IN + name: value for name, value in state_in.items()}}, version

    def _graphed_act(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """:meth:`_act` as :class:`~fwrl.agents.inference_graph.GraphedStep` captures it: untimed
        (the replay is timed), Gumbel sampling from the graphs' own generator."""
        return self._act(tensors, sampling={"sampler": "gumbel", "generator": self._graphed.generator}, hold=False)[0]
