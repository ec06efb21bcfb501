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

One step reads top to bottom in named stages (``InferenceLoop._step``): wait for ready workers;
plan it on the host (its slots, the store's entries, the cut slots: a
:class:`~fwrl.agents.acting_batch.StepIndex`); upload it
(:class:`~fwrl.agents.acting_staging.Staging`: an
:class:`~fwrl.agents.acting_batch.ActingBatch`); its device work (``_act``: gather the slots'
state, the forward's inputs with the riders, the forward, scatter the new state, write the store;
an :class:`~fwrl.agents.acting_batch.ActingOutput`), eager or replayed as a CUDA graph per
:class:`~fwrl.agents.acting_batch.StepLayout`; send the actions; complete the store's step.

A loop may step a slice of a pool (:class:`~fwrl.envs.worker_pool.PoolSlice`):
its state holds only the slice's slots, while the store and the pool name
workers by their number in the whole pool (``fwrl.runner.acting`` runs one
loop per acting thread).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from fwrl.agents.acting_batch import ActingBatch, ActingOutput, StepIndex
from fwrl.agents.acting_staging import Staging
from fwrl.agents.policy_weights import DeviceStreams, PolicyWeights
from fwrl.agents.rollouts import AGENT_KEYS, BOOTSTRAP_KEY, Rollout, RolloutStore, StoreStep
from fwrl.agents.stage_timer import ACTING_CALL, StageTimer
from fwrl.envs.step_record import DONE, REWARD, TRUNCATED
from fwrl.envs.worker_pool import EpisodeRecord, StepResult, StepSource
from fwrl.errors import unknown_choice
from fwrl.memory_modules.base import State

# Stages of the inference thread (fwrl.agents.stage_timer): waiting for env
# workers and sending them actions, the forward (and the actions' trip back
# to the host), store and staging work.
INFERENCE_STAGES = ("env_wait", "inference_forward", "rollout_bookkeeping")
STAGINGS = ("pack", "shared")  # how an acting call stages the workers' observations (InferenceLoop)


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
        if graph and store is None:
            raise ValueError("a graphed inference loop needs a rollout store: its step record fixes the graph's inputs")
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
        self._staging = Staging(self.device, pool.num_slots, store.spec.record if store is not None else None,
                                shared, pool.envs_per_worker)
        self._unused = np.empty(0, np.int64)  # a part of the step's index the loop has no use for
        self._no_values = torch.zeros(pool.num_slots, device=self.device)
        self._action_host: tuple[torch.Tensor, np.ndarray] | None = None  # (tensor, its numpy view)
        self._graphed = None
        if graph:
            from fwrl.agents.inference_graph import GraphedStep, own_generator

            self._graphed = GraphedStep(self._graphed_act, self.device, own_generator(self.device),
                                        protect=lambda: tuple(self.state.values()))
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

    # ------------------------------------------------------------------ one step, stage by stage
    @torch.inference_mode()
    def _step(self, timeout: float, on_rollout: Callable[[Rollout], None] | None,
              on_episode: Callable[[EpisodeRecord], None] | None) -> int:
        timer = self.timer
        with timer.stage("env_wait"):
            results = self._wait(timeout)
        if not results:
            return 0
        with timer.stage("rollout_bookkeeping", device_work=True):
            plan, index = self._plan(results)
            batch = self._upload(results, index)
        out, version = self._device_step(batch, index, plan)
        with timer.stage("inference_forward", device_work=True):
            actions = self._actions_to_host(out.action)
        with timer.stage("env_wait"):  # the workers step while the store completes the step
            self._send(results, actions)
        if plan is not None:
            with timer.stage("rollout_bookkeeping", device_work=True):
                self.store.complete(plan, out.state_in, version, on_rollout)
        self._account(results, on_episode)
        return batch.layout.slots

    def _wait(self, timeout: float) -> list[StepResult]:
        """The ready workers' results: whichever are ready within ``timeout``, and those that join
        within ``batch_wait`` until ``min_batch`` are."""
        results: list[StepResult] = self.pool.wait(timeout)
        if results and len(results) < self.min_batch and self.batch_wait > 0:
            deadline = time.monotonic() + self.batch_wait
            while len(results) < self.min_batch and (left := deadline - time.monotonic()) > 0:
                results += self.pool.wait(left)
        return results

    def _plan(self, results: list[StepResult]) -> tuple[StoreStep | None, StepIndex]:
        """The step's host side: ``results`` put in batch order (eager: by state row, so consecutive
        workers' slots are one run of the state), the store's plan of it (None without a store) and
        its indices."""
        k = self.k
        if self._graphed is None:
            results.sort(key=lambda r: self._place[r.worker])
        workers = [r.worker for r in results]
        slots = (self._place[workers][:, None] * k + self._offsets).ravel()
        pool_slots = (self._unused if self._staging.shared is None
                      else (np.asarray(workers)[:, None] * k + self._offsets).ravel())
        if self.store is None:  # evaluation bootstraps nothing: no store entries, no riders
            return None, StepIndex(slots, pool_slots, self._unused, self._unused, self._unused)
        plan = self.store.plan(workers, [r.life for r in results])
        cut = np.flatnonzero(np.concatenate([r.arrays[TRUNCATED] for r in results]))
        return plan, StepIndex(slots, pool_slots, plan.env_entries, plan.agent_entries, cut)

    def _upload(self, results: list[StepResult], index: StepIndex) -> ActingBatch:
        """The step on the device; graphed, straight into the static inputs of its layout's graph."""
        if self._graphed is None:
            return self._staging.upload(results, index)
        return self._staging.upload(results, index, out=self._graphed.buffers(index.layout, self._staging.empty))

    def _device_step(self, batch: ActingBatch, index: StepIndex,
                     plan: StoreStep | None) -> tuple[ActingOutput, int | None]:
        """The step's device work (:meth:`_act`), replayed as its layout's CUDA graph or run eagerly;
        with the version of the weights that acted."""
        if self._graphed is not None:
            with self.timer.stage("inference_forward", device_work=True), self.weights.acting() as version:
                return self._graphed.step(batch.layout, batch), version
        slots, n = index.slots, batch.layout.slots
        run = int(slots[0]) if slots[-1] - slots[0] == n - 1 else None
        return self._act(batch, self.timer, run=run, keep_state_in=plan is not None and len(plan.starting) > 0)

    def _actions_to_host(self, action: Tensor) -> np.ndarray:
        """``action`` [n, ...] copied into this loop's host buffer (pinned on a GPU; allocated once):
        its numpy view, valid until the next step (the pools copy actions when they send them)."""
        if self._action_host is None:
            host = torch.empty((self.pool.num_slots, *action.shape[1:]), dtype=action.dtype,
                               pin_memory=self.device.type == "cuda")
            self._action_host = (host, host.numpy())
        host, view = self._action_host
        host[:len(action)].copy_(action)
        return view[:len(action)]

    def _send(self, results: list[StepResult], actions: np.ndarray) -> None:
        """Each ready worker its K actions (rows of ``actions``, in batch order)."""
        k = self.k
        for i, r in enumerate(results):
            self.pool.act(r.worker, actions[i * k:(i + 1) * k])

    def _account(self, results: list[StepResult], on_episode: Callable[[EpisodeRecord], None] | None) -> None:
        """The episodes the step's results finished (to ``on_episode``), the restarts and agent steps."""
        if on_episode is not None:
            for r in results:
                for record in r.episodes:
                    on_episode(record)
        self.restarts_seen += sum(r.restarted for r in results)
        self.agent_steps += len(results) * self.k

    # ------------------------------------------------------------------ the step's device work
    def _act(self, batch: ActingBatch, timer: StageTimer | _Untimed = _UNTIMED,
             sampling: dict[str, Any] | None = None, hold: bool = True, run: int | None = None,
             keep_state_in: bool = True) -> tuple[ActingOutput, int | None]:
        """The device work of one inference step over the n slots of ``batch``: the slots' core state
        gathered, the forward (T = 1; the riders of cut episodes ride it as extra rows), the state
        scattered back, the step written into the store. Returns the actions and the gathered state,
        and the version of the weights that acted (held for the forward; with ``hold`` false the
        caller holds them: None).

        Everything here is device work with no host sync and shapes fixed by the batch's layout, so
        :class:`~fwrl.agents.inference_graph.GraphedStep` captures it.

        An eager caller whose slots are one run of the state, ``run`` to ``run + n - 1`` in order,
        passes ``run``: the forward then reads the state's rows in place and its new state is one
        plain copy back, where gathering and scattering rows by index cost several passes over the
        state (a fast-weight core's or RTRL's state is MBs a step). The returned ``state_in`` is
        then a copy only with ``keep_state_in`` (a rollout starts at this step: the store copies
        its initial state); else it is those rows, already overwritten, and must not be read."""
        n = batch.layout.slots
        index = batch.layout.unpack(batch.index)
        groups = self._staging.step_rows(batch.groups, index.pool_slots)
        with timer.stage("rollout_bookkeeping", device_work=True):
            state_in = self._gather_state(index.slots, n, run, keep_state_in)
            inputs, state = self._forward_inputs(groups, batch.final_obs, index.cut, state_in)
        with timer.stage("inference_forward", device_work=True):
            with self.weights.acting() if hold else contextlib.nullcontext() as version:
                out, state_out = self._forward(inputs, state, sampling)
            self._scatter_state(state_out, index.slots, n, run)
            # the step's rows (T = 1) of the outputs, the riders' left out
            agent = {key: out[key][0] if not len(index.cut) else out[key][0, :n] for key in AGENT_KEYS}
        if self.store is not None:
            with timer.stage("rollout_bookkeeping", device_work=True):
                self._write_store(index, groups, agent, out["baseline"][0])
        return ActingOutput(agent["action"], state_in), version

    def _gather_state(self, slots: Tensor, n: int, run: int | None, keep_state_in: bool) -> State:
        """The core state of the step's ``slots`` before it (:meth:`_act` says when ``run`` reads it in place)."""
        if run is None:
            return {name: value.index_select(0, slots) for name, value in self.state.items()}
        # the rows in place; a copy where the store reads them after the step
        return {name: value.narrow(0, run, n).clone() if keep_state_in else value.narrow(0, run, n)
                for name, value in self.state.items()}

    def _forward_inputs(self, groups: tuple[Tensor, ...], final_obs: tuple[Tensor, ...], cut: Tensor,
                        state_in: State) -> tuple[dict[str, Tensor], State]:
        """The forward's inputs and states: the step's slots (their columns of ``groups``, ``state_in``),
        then the riders of the slots at the batch positions ``cut``."""
        inputs = {key: self._staging.column(groups, key) for key in self._staging.model_inputs}
        if not len(cut):
            return inputs, state_in
        return self._riders(inputs, final_obs, cut, state_in)

    def _riders(self, inputs: dict[str, Tensor], final_obs: tuple[Tensor, ...], cut: Tensor,
                state_in: State) -> tuple[dict[str, Tensor], State]:
        """``inputs`` and ``state_in`` with one row more per slot at the batch positions ``cut`` (a
        time limit cut its episode): that episode's final observation (``final_obs``), the step's
        reward, ``done`` false and the slot's state (the cut episode's, not reset)."""
        extra = dict(zip(self._staging.observations, final_obs))
        extra[REWARD] = inputs[REWARD].index_select(0, cut)
        extra[DONE] = torch.zeros(len(cut), dtype=torch.bool, device=self.device)
        inputs = {key: torch.cat([value, extra[key]]) for key, value in inputs.items()}
        state = {name: torch.cat([value, value.index_select(0, cut)]) for name, value in state_in.items()}
        return inputs, state

    def _forward(self, inputs: dict[str, Tensor], state: State,
                 sampling: dict[str, Any] | None) -> tuple[dict[str, Tensor], State]:
        """The model over ``inputs`` as one step (T = 1): its outputs ``[1, rows, ...]`` and new state."""
        inputs = {key: value.unsqueeze(0) for key, value in inputs.items()}
        extra = {} if self._core_step is None else {"core_step": self._core_step}
        return self.model(inputs, state, greedy=self.greedy, **(sampling or {}), **extra)

    def _scatter_state(self, state_out: State, slots: Tensor, n: int, run: int | None) -> None:
        """The new state of the step's slots (the first ``n`` rows of ``state_out``) into theirs."""
        for name, value in state_out.items():
            value = value if len(value) == n else value[:n]
            if run is None:
                self.state[name].index_copy_(0, slots, value)
            else:
                self.state[name].narrow(0, run, n).copy_(value)

    def _write_store(self, index: StepIndex, groups: tuple[Tensor, ...], agent: dict[str, Tensor],
                     baseline: Tensor) -> None:
        """The step into the store: obs t of each slot with the bootstrap values of its cut episodes
        (``baseline`` ``[rows]``: the riders' are rows n on), and the agent's output at its entries."""
        env = {g.name: value for g, value in zip(self._staging.groups, groups)}
        env[BOOTSTRAP_KEY] = self._bootstrap_values(baseline, len(index.slots), index.cut)
        self.store.write(index.env_entries, index.agent_entries, env, agent)

    def _bootstrap_values(self, baseline: Tensor, n: int, cut: Tensor) -> Tensor:
        """Per slot: the value of the rider of its cut episode (rows ``n:`` of the forward; ``cut``:
        the cut slots' batch positions), 0 where no time limit cut one."""
        if len(cut) == 0:
            return self._no_values[:n]  # never written: the store copies it
        values = torch.zeros(n, device=self.device)
        values.index_copy_(0, cut, baseline[n:].float())
        return values

    def _graphed_act(self, batch: ActingBatch) -> ActingOutput:
        """:meth:`_act` as :class:`~fwrl.agents.inference_graph.GraphedStep` captures it: untimed
        (the replay is timed), Gumbel sampling from the graphs' own generator."""
        return self._act(batch, sampling={"sampler": "gumbel", "generator": self._graphed.generator}, hold=False)[0]
