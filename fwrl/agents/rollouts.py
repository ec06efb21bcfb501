"""The rollout store: rollouts are born on the learner's device and never leave it
(ARCHITECTURE.md, The path of one env step).

Row layout (torchbeast's, unchanged): a rollout holds ``[T+1, K, ...]`` columns
for the K slots of one worker plus the core state before row 0;

- row t holds the env output of obs t (the stored columns of the env's step
  record, ``fwrl.envs.step_record``: ``obs`` and ``obs_extra`` where the env
  has extras, ``reward``, ``done`` and ``truncated`` of the transition into obs
  t, ``episode_return``, ``episode_step``, ``task``; and ``bootstrap_value``:
  the acting weights' value of the cut episode's final obs where ``truncated``) and
  the agent output computed from obs t-1 (``action``, ``policy_logits``,
  ``baseline``), i.e. the action that led to obs t, and on the host the version
  of the weights that acted (one per page row: the learner's policy lag reads
  it there, :meth:`RolloutStore.export` gives it as the ``policy_version`` column);
- row 0 repeats the previous rollout's row T, and the initial core state is
  the state before obs T was processed.

Storage: ``P`` *pages* of ``K`` columns, one page per rollout of one worker.
Columns are kept in groups (:meth:`RolloutSpec.groups`): each observation
alone, the env's scalars of one dtype side by side (``fwrl.envs.step_record``
``ColumnGroup``), the bootstrap value, the agent's floats (logits, then the
baseline) and its action. Every group is one
preallocated tensor ``[T+1, P*K, ...]`` on the device (page p's slot j is
column ``p*K + j``), written in place at each inference step by index: one
write per group, not per column; a batch of B columns is one ``index_select``
per group along dim 1 that is already ``[T+1, B, ...]``, read as columns
through views. The core state before row 0 is copied device to
device into ``[P*K, ...]`` tensors only when a slot starts a rollout. A
finished rollout is a :class:`Rollout` handle (its page); the learner gathers
its columns and hands the page back.

A worker restart (new ``life``) drops the partial rollout of its slots: no
rollout ever mixes steps from two worker lives.

On CUDA the inference loop writes on its stream and the learner reads on
its own: a handed-off rollout carries an event recorded after its last write
(the learner's stream waits on it before gathering), and a page handed back
carries an event recorded after the gather (the inference stream waits on it
before writing the page again).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from fwrl.envs.step_record import StepRecord

BOOTSTRAP_KEY = "bootstrap_value"  # the acting weights' value of a cut episode's final obs (truncated rows)
AGENT_KEYS = ("action", "policy_logits", "baseline")
VERSION_KEY = "policy_version"
AGENT_FLOATS = "agent_float32"  # the store group of the policy logits and the baseline
TORCH_DTYPES = {"uint8": torch.uint8, "float32": torch.float32, "bool": torch.bool, "int32": torch.int32,
                "int64": torch.int64}


@dataclass(frozen=True)
class StoreGroup:
    """Columns kept in one store tensor ``[T+1, width, *shape]``: ``columns`` maps each column to
    its place in the last axis (an index, a slice, or None: the column is the whole group)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    columns: tuple[tuple[str, int | slice | None], ...]

    def view(self, value: Tensor, column: str) -> Tensor:
        """Column ``column`` of this group's tensor ``value`` (a view)."""
        where = dict(self.columns)[column]
        return value if where is None else value[..., where]


@dataclass(frozen=True)
class RolloutSpec:
    """Shapes of one rollout: ``unroll_length`` T, ``envs_per_worker`` K columns, the env's step
    record (its stored columns are the env columns), and the agent's actions."""

    unroll_length: int
    envs_per_worker: int
    record: StepRecord
    num_actions: int
    action_dims: tuple[int, ...] = ()  # () -> one categorical of num_actions

    @property
    def env_keys(self) -> tuple[str, ...]:
        """The columns of obs t (the env groups :meth:`RolloutStore.write` takes, with the bootstrap value)."""
        return tuple(c.name for c in self.record.stored) + (BOOTSTRAP_KEY,)

    def groups(self) -> tuple[StoreGroup, ...]:
        """The store's groups: the env's (written at env time with the bootstrap value), then the
        agent's (written with the next row)."""
        env = [StoreGroup(g.name, TORCH_DTYPES[g.dtype], g.shape,
                          tuple((c, g.index(c) if g.scalars else None) for c in g.columns))
               for g in self.record.groups()]
        action = (len(self.action_dims),) if len(self.action_dims) > 1 else ()
        return (*env,
                StoreGroup(BOOTSTRAP_KEY, torch.float32, (), ((BOOTSTRAP_KEY, None),)),
                StoreGroup(AGENT_FLOATS, torch.float32, (self.num_actions + 1,),
                           (("policy_logits", slice(0, self.num_actions)), ("baseline", self.num_actions))),
                StoreGroup("action", torch.int64, action, (("action", None),)))

    def columns(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-slot (shape, dtype) of every column."""
        out = {}
        for group in self.groups():
            for name, where in group.columns:
                shape = (group.shape if where is None else
                         (where.stop - where.start,) if isinstance(where, slice) else group.shape[:-1])
                out[name] = (shape, group.dtype)
        return out


def column_views(groups: Sequence[StoreGroup], tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every column of the group tensors ``tensors`` (views)."""
    return {name: group.view(tensors[group.name], name) for group in groups for name, _ in group.columns}


@dataclass(frozen=True)
class Rollout:
    """A finished rollout: the K columns of ``page``, acted by one life of ``worker``."""

    page: int
    worker: int
    life: int
    columns: int
    ready: torch.cuda.Event | None = field(default=None, compare=False)  # its writes are done (CUDA)


@dataclass(frozen=True)
class RolloutPiece:
    """Columns ``[start, stop)`` of a rollout (a batch may split one rollout's K columns)."""

    rollout: Rollout
    start: int
    stop: int

    @property
    def width(self) -> int:
        return self.stop - self.start


@dataclass
class RolloutData:
    """A rollout copied out of the store (tests, debugging): ``[T+1, K, ...]`` tensors."""

    tensors: dict[str, Tensor]
    initial_state: dict[str, Tensor]
    worker: int
    life: int


@dataclass
class Batch:
    """B columns gathered on the learner's device."""

    tensors: dict[str, Tensor]  # [T+1, B, ...]
    initial_state: dict[str, Tensor]  # [B, ...]
    versions: list[list[int]]  # per piece: the policy version of rows 0..T (host copy)
    widths: list[int]  # per piece: its number of columns

    def policy_lag(self, version: int) -> tuple[float, int]:
        """Mean and max of ``version`` minus the version that acted, over rows 1..T of
        every column (the behaviour outputs the loss uses)."""
        total = count = 0
        worst = 0
        for rows, width in zip(self.versions, self.widths):
            lags = [version - v for v in rows[1:]]
            total += sum(lags) * width
            count += len(lags) * width
            worst = max(worst, max(lags))
        return (total / count if count else 0.0), worst


@dataclass(frozen=True)
class StoreStep:
    """Where one inference step of some workers goes in the store (:meth:`RolloutStore.plan`):
    per worker, the row of obs t (``rows``) and of the agent output (``next_rows``: the next row,
    row 1 of the new page where obs t is row T); per slot, the store columns of the agent output
    (``cols``: the new page's where one turns) and the flat entries (``row * width + column``) of
    obs t and of the agent output; the workers whose page turns, and their old pages; the positions
    in ``workers`` of those whose next rollout starts at this step (``starting``: obs t is its row 0,
    or row T of the page that turns), whose state :meth:`RolloutStore.complete` copies."""

    workers: np.ndarray
    rows: np.ndarray
    next_rows: np.ndarray
    cols: np.ndarray
    env_entries: np.ndarray
    agent_entries: np.ndarray
    turning: np.ndarray
    old_pages: np.ndarray
    starting: np.ndarray


class RolloutStore:
    """Preallocated rollout pages on ``device``, written in place by the inference loop.

    Several acting threads may write it at once, each for its own workers (whose pages and
    cursors only it touches); the free pages and the counters are shared under a lock.

    ``state_template`` holds one slot's core state (``model.initial_state(1)``):
    its shapes and dtypes size the initial-state buffers. ``capacity`` pages
    must cover every worker's page in progress, the finished rollouts waiting
    in the queue and those the learner holds; :func:`store_capacity` gives it.
    """

    def __init__(self, spec: RolloutSpec, num_workers: int, device: torch.device,
                 state_template: dict[str, Tensor], capacity: int | None = None):
        self.spec = spec
        self.device = torch.device(device)
        self.num_workers = num_workers
        self.k = spec.envs_per_worker
        self.capacity = capacity if capacity is not None else 2 * num_workers + 2
        if self.capacity < num_workers + 1:
            raise ValueError(f"a rollout store for {num_workers} workers needs at least {num_workers + 1} "
                             f"pages, got {self.capacity}")
        T1, width = spec.unroll_length + 1, self.capacity * self.k
        self.groups = spec.groups()
        self.tensors = {  # group name -> [T+1, P*K, ...]
            g.name: torch.zeros((T1, width, *g.shape), dtype=g.dtype, device=self.device) for g in self.groups
        }
        self.initial_state = {
            name: torch.zeros((width, *value.shape[1:]), dtype=value.dtype, device=self.device)
            for name, value in state_template.items()
        }
        # rows x columns flattened: entry (t, c) of a group tensor is row t * width + c of its view, one
        # row per entry (one value for a scalar group); byte groups (frames) are viewed as int32 words,
        # which index_copy_ moves about ten times faster than single bytes on the CPU
        self._flat = {name: _words(value.view(T1 * width, *([-1] if value.dim() > 2 else [])))
                      for name, value in self.tensors.items()}
        self._env_groups = self.groups[:len(spec.record.groups()) + 1]  # with the bootstrap value
        self._width = width
        self._offsets = np.arange(self.k)
        self._lock = threading.Lock()
        self._free: deque[tuple[int, torch.cuda.Event | None]] = deque(
            (p, None) for p in range(num_workers, self.capacity))
        self._page = np.arange(num_workers)  # each worker's page in progress
        self._cursor = np.zeros(num_workers, np.int64)  # its next row
        self._life = np.zeros(num_workers, np.int64)
        self._versions = [[0] * T1 for _ in range(self.capacity)]  # per page row: the acting weights' version
        self._unread = [0] * self.capacity  # columns of a handed-off page not yet gathered
        self.dropped_steps = 0  # slot steps of partial rollouts dropped on worker restarts
        self.state_copies = 0  # slot states copied into the store (rollout starts x K)

    # ------------------------------------------------------------------ inference side
    def columns_of(self, workers: Sequence[int]) -> np.ndarray:
        """Store columns ``[N*K]`` of the current pages of ``workers`` (in order, K each)."""
        return (self._page[np.asarray(workers)][:, None] * self.k + self._offsets).ravel()

    def _to_device(self, index: np.ndarray) -> Tensor:
        return host_to_device(index, self.device)

    @staticmethod
    def _group_value(group: StoreGroup, values: dict[str, Tensor]) -> Tensor:
        """``[n, ...]`` rows of ``group``: given whole (under its name: a column that is its group, or
        a group as staging packs it), or stacked from its columns."""
        if group.name in values:
            return values[group.name]
        return torch.stack([values[name] for name, _ in group.columns], -1)

    def plan(self, workers: Sequence[int], lives: Sequence[int]) -> StoreStep:
        """The store's host side of one inference step of ``workers`` (``lives``: each one's life):
        where obs t and the agent output go. A restarted worker's partial rollout is dropped; a
        worker whose obs t is row T gets its next page here (the stream waits for the learner's
        gather of it), so the agent output, which belongs to the next row, goes to that page's row 1.
        Write with :meth:`write` (device only), then :meth:`complete`."""
        k, T = self.k, self.spec.unroll_length
        workers = np.asarray(workers)
        lives = np.asarray(lives)
        restarted = lives != self._life[workers]
        if restarted.any():  # a restarted worker's partial rollout is dropped
            with self._lock:
                self.dropped_steps += int(self._cursor[workers[restarted]].sum()) * k
            self._life[workers[restarted]] = lives[restarted]
            self._cursor[workers[restarted]] = 0
        rows = self._cursor[workers]
        env_entries = np.repeat(rows, k) * self._width + self.columns_of(workers)
        turning = workers[rows == T]
        old = self._page[turning].copy()
        self._page[turning] = [self._take_page() for _ in turning]
        next_rows = np.where(rows == T, 1, rows + 1)
        cols = self.columns_of(workers)  # the pages the agent output and a starting rollout go to
        return StoreStep(workers, rows, next_rows, cols, env_entries, np.repeat(next_rows, k) * self._width + cols,
                         turning, old, np.flatnonzero((rows == 0) | (rows == T)))

    def write(self, env_entries: Tensor, agent_entries: Tensor, env: dict[str, Tensor],
              agent: dict[str, Tensor]) -> None:
        """The device writes of one step (a :meth:`plan`'s entries on the device): obs t of each
        slot (``env``: ``[n, ...]``, each env group whole, as staging packs it, or its columns; and
        the bootstrap value) and the agent output computed from it (``agent``: ``action``,
        ``policy_logits``, ``baseline``). No host work: a CUDA graph can capture it."""
        n = len(env_entries)
        for group in self._env_groups:
            self._flat[group.name].index_copy_(0, env_entries, _rows(self._group_value(group, env), n))
        baseline = agent["baseline"]
        baseline = baseline if baseline.dtype == torch.float32 else baseline.float()
        floats = torch.cat([_rows(agent["policy_logits"], n), baseline.view(n, 1)], 1)
        self._flat[AGENT_FLOATS].index_copy_(0, agent_entries, floats)
        self._flat["action"].index_copy_(0, agent_entries, _rows(agent["action"], n))

    def complete(self, step: StoreStep, state_in: dict[str, Tensor], version: int,
                 on_rollout: Callable[[Rollout], None] | None = None) -> None:
        """After :meth:`write`: start the next page of every worker whose row T was written (its
        row 0 is that row T), copy the initial state of every rollout that starts here
        (``state_in``: the slots' core state before obs t; row 0, or row T on the next page), stamp
        the ``version`` of the weights that acted, and hand every finished rollout to ``on_rollout``."""
        if len(step.turning):
            self._turn_pages(step)
        if len(step.starting):
            self._copy_state(step.starting, step.cols, state_in)
        for page, row in zip(self._page[step.workers].tolist(), step.next_rows.tolist()):
            self._versions[page][row] = version
        self._cursor[step.workers] = step.next_rows
        if len(step.turning):
            self._hand_off(step, on_rollout)

    def record(self, workers: Sequence[int], lives: Sequence[int], env: dict[str, Tensor],
               state_in: dict[str, Tensor], agent: dict[str, Tensor], version: int,
               on_rollout: Callable[[Rollout], None] | None = None) -> None:
        """One step of ``workers`` (obs t and the agent output computed from it) in one call:
        :meth:`plan`, :meth:`write` and :meth:`complete`."""
        step = self.plan(workers, lives)
        self.write(self._to_device(step.env_entries), self._to_device(step.agent_entries), env, agent)
        self.complete(step, state_in, version, on_rollout)

    def _copy_state(self, positions: np.ndarray, cols: np.ndarray, state_in: dict[str, Tensor]) -> None:
        """Initial state of the rollouts starting at batch positions ``positions`` (device to device)."""
        take = (positions[:, None] * self.k + self._offsets).ravel()
        dest, take_t = self._to_device(cols[take]), self._to_device(take)
        for name, value in state_in.items():
            self.initial_state[name].index_copy_(0, dest, value.index_select(0, take_t))
        with self._lock:
            self.state_copies += len(take)

    def _turn_pages(self, step: StoreStep) -> None:
        """Row T of the turning workers' old pages is written: it is row 0 of their new pages, in
        one copy per group for all of them (their initial state, the state before obs T, is
        copied by :meth:`complete`)."""
        k, T = self.k, self.spec.unroll_length
        new = self._page[step.turning]
        src = self._to_device((step.old_pages[:, None] * k + self._offsets).ravel() + T * self._width)
        dst = self._to_device((new[:, None] * k + self._offsets).ravel())
        for flat in self._flat.values():
            flat.index_copy_(0, dst, flat.index_select(0, src))
        for o, n in zip(step.old_pages.tolist(), new.tolist()):
            self._versions[n][0] = self._versions[o][T]

    def _hand_off(self, step: StoreStep, on_rollout: Callable[[Rollout], None] | None) -> None:
        """The turning workers' old pages, every write to them done, to ``on_rollout``."""
        ready = _record_event(self.device)
        with self._lock:
            for page in step.old_pages:
                self._unread[page] = self.k
        for worker, page in zip(step.turning, step.old_pages):
            rollout = Rollout(int(page), int(worker), int(self._life[worker]), self.k, ready)
            if on_rollout is None:
                self.release(rollout)
            else:
                on_rollout(rollout)

    def _take_page(self) -> int:
        with self._lock:
            if not self._free:
                raise RuntimeError(
                    f"the rollout store ran out of pages ({self.capacity}): finished rollouts were "
                    "neither gathered nor released; size it with store_capacity()")
            page, gathered = self._free.popleft()
        if gathered is not None:  # the learner's gather of this page must finish before we write it
            torch.cuda.current_stream(self.device).wait_event(gathered)
        return page

    # ------------------------------------------------------------------ learner side
    def gather(self, pieces: Sequence[RolloutPiece]) -> Batch:
        """The columns of ``pieces`` as one batch on the device (current stream), then the pages
        whose every column has been gathered are handed back."""
        for piece in pieces:
            if piece.rollout.ready is not None:
                torch.cuda.current_stream(self.device).wait_event(piece.rollout.ready)
        cols = torch.cat([torch.arange(p.rollout.page * self.k + p.start, p.rollout.page * self.k + p.stop)
                          for p in pieces]).to(self.device, non_blocking=True)
        tensors = column_views(self.groups, {name: value.index_select(1, cols) for name, value in self.tensors.items()})
        state = {name: value.index_select(0, cols) for name, value in self.initial_state.items()}
        versions = [list(self._versions[p.rollout.page]) for p in pieces]
        gathered = _record_event(self.device)
        self._mark_read(pieces, [gathered] * len(pieces))
        return Batch(tensors, state, versions, [p.width for p in pieces])

    def discard(self, pieces: Sequence[RolloutPiece]) -> None:
        """Hand back the columns of ``pieces`` unread (no device work): a page whose every column is
        gathered or discarded is free again once the writes its ``ready`` event marks are done
        (``fwrl bench throughput --acting-only``)."""
        self._mark_read(pieces, [piece.rollout.ready for piece in pieces])

    def _mark_read(self, pieces: Sequence[RolloutPiece], events: Sequence[torch.cuda.Event | None]) -> None:
        """The columns of ``pieces`` are read: a page with none left unread goes back to the free
        pages with its piece's event (the next writer's stream waits for it)."""
        for piece, event in zip(pieces, events):
            with self._lock:
                self._unread[piece.rollout.page] -= piece.width
                done = self._unread[piece.rollout.page] == 0
            if done:
                self._hand_back(piece.rollout.page, event)

    def release(self, rollout: Rollout) -> None:
        """Hand back a finished rollout's page without gathering it."""
        with self._lock:
            self._unread[rollout.page] = 0
        self._hand_back(rollout.page, _record_event(self.device))

    def _hand_back(self, page: int, event: torch.cuda.Event | None) -> None:
        with self._lock:
            self._free.append((page, event))

    def export(self, rollout: Rollout) -> RolloutData:
        """A CPU copy of a finished rollout (for tests and debugging); does not release it."""
        if rollout.ready is not None:
            rollout.ready.synchronize()
        cols = slice(rollout.page * self.k, (rollout.page + 1) * self.k)
        groups = {n: v[:, cols].cpu().clone() for n, v in self.tensors.items()}
        columns = {n: v.clone() for n, v in column_views(self.groups, groups).items()}
        columns[VERSION_KEY] = torch.tensor(self._versions[rollout.page]).view(-1, 1).repeat(1, self.k)
        return RolloutData(columns,
                           {n: v[cols].cpu().clone() for n, v in self.initial_state.items()},
                           rollout.worker, rollout.life)

    @property
    def free_pages(self) -> int:
        with self._lock:
            return len(self._free)


def host_to_device(array: np.ndarray, device: torch.device) -> Tensor:
    """A host array (an index, a column) as a tensor on ``device``: the array's memory itself on the
    CPU (no ``to`` call), an asynchronous copy on a GPU."""
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def _rows(value: Tensor, n: int) -> Tensor:
    """``[n, ...]`` values as the rows a flat store view takes: ``[n]`` for one value per slot,
    ``[n, m]`` (bytes as words) otherwise; no reshape where the shape is already that."""
    if value.dim() > 2:
        value = value.reshape(n, -1)
    return _words(value) if value.dim() == 2 else value


def _words(rows: Tensor) -> Tensor:
    """``[n, m]`` rows of bytes (uint8 / bool, m a multiple of 4, contiguous) as ``[n, m / 4]`` int32
    words (the same memory); other rows as they are."""
    if rows.dtype in (torch.uint8, torch.bool) and rows.shape[-1] % 4 == 0 and rows.is_contiguous():
        return rows.view(torch.int32)
    return rows


def queue_size(batch_size: int, envs_per_worker: int) -> int:
    """Finished rollouts the queue holds before acting blocks: two batches' worth of pages, at least 2."""
    return max(2, 2 * batch_size // envs_per_worker + 1)


def step_bytes(spec: RolloutSpec, state_template: dict[str, Tensor]) -> tuple[int, int]:
    """(bytes of one step of one column in the store, bytes of one column's initial core state)."""
    row = sum(math.prod(g.shape) * torch.empty((), dtype=g.dtype).element_size() for g in spec.groups())
    state = sum(math.prod(v.shape[1:]) * v.element_size() for v in state_template.values())
    return row, state


def store_bytes(spec: RolloutSpec, capacity: int, state_template: dict[str, Tensor]) -> int:
    """The bytes a :class:`RolloutStore` of ``capacity`` pages allocates: its groups over T + 1 rows and
    its initial states, for every column (``state_template``: the core's state for one column, any
    device: only shapes and dtypes are read)."""
    row, state = step_bytes(spec, state_template)
    return capacity * spec.envs_per_worker * ((spec.unroll_length + 1) * row + state)


def store_capacity(num_workers: int, envs_per_worker: int, batch_size: int, queue_size: int) -> int:
    """Pages a store needs so that a worker finishing a rollout always finds a free one:
    one in progress per worker, ``queue_size`` finished rollouts waiting, and the pages of
    one batch the learner is gathering (plus the one a split leaves behind)."""
    return num_workers + queue_size + -(-batch_size // envs_per_worker) + 2


def _record_event(device: torch.device) -> torch.cuda.Event | None:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
