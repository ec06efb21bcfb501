"""The step record: what an env worker hands over for each of its env slots after a step.

One table of columns (:class:`StepRecord`) is the only description of it. Every layout is made
from the table: the workers' output arrays (shared memory in the local backend, numpy arrays in a
Ray actor: :meth:`StepRecord.allocate`), the Ray payload (:meth:`StepRecord.pack` /
:meth:`StepRecord.unpack`), the acting thread's staging buffers and the env columns of the device
rollout store (:attr:`StepRecord.stored`, ``fwrl.agents.rollouts``).

The columns, per slot, after a step (or a worker's first reset):

- ``obs`` (and ``obs_extra`` where the env has extras, ``fwrl.envs.layout``): the observation
  the agent acts on next; where an episode ended, the first one of the next episode;
- ``reward``: of the transition into ``obs``;
- ``done``: ``obs`` starts a new episode, for both kinds of end (the core resets there);
- ``truncated``: the episode that ended was cut by a time limit, not terminated;
- ``episode_return``, ``episode_step``: of the current game so far; ``task``: the slot's task;
- ``final_obs`` (and ``final_obs_extra``): where ``truncated``, the cut episode's last
  observation, as gymnasium's ``step`` returned it before the worker reset the env (the value
  of the cut episode is bootstrapped from it); zeros in every other row. These *cut-only*
  columns ride the acting forward for their rows only and are never stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

OBS, OBS_EXTRA = "obs", "obs_extra"
REWARD, DONE, TRUNCATED = "reward", "done", "truncated"
EPISODE_RETURN, EPISODE_STEP, TASK = "episode_return", "episode_step", "task"
FINAL_OBS, FINAL_OBS_EXTRA = "final_obs", "final_obs_extra"
FINAL_OF = {OBS: FINAL_OBS, OBS_EXTRA: FINAL_OBS_EXTRA}  # an observation column -> its cut-only copy
CUT_ROWS = "cut_rows"  # the Ray payload's row indices of the cut-only columns


@dataclass(frozen=True)
class Column:
    """One field of the step record: its per-slot shape and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    cut_only: bool = False  # holds a value only in truncated rows (zeros elsewhere)


@dataclass(frozen=True)
class ColumnGroup:
    """Stored columns kept side by side in one array: an observation column alone (``shape``: its
    own), or every scalar column of one dtype (``shape``: ``(len(columns),)``, in table order).
    One group is one staging buffer, one upload and one store tensor: fewer, larger copies than a
    column each."""

    name: str  # the observation column's name, or the scalars' dtype
    dtype: str
    shape: tuple[int, ...]
    columns: tuple[str, ...]

    @property
    def scalars(self) -> bool:
        return self.name not in (OBS, OBS_EXTRA)

    def index(self, column: str) -> int | None:
        """Where ``column`` sits in the group's last axis (None: an observation group is its column)."""
        return self.columns.index(column) if self.scalars else None

    def pack(self, parts: Sequence[dict[str, np.ndarray]], out: np.ndarray | None = None) -> np.ndarray:
        """The group's ``[n, *shape]`` array of several workers' arrays (in order), into ``out``."""
        n = sum(len(p[self.columns[0]]) for p in parts)
        if out is None:
            out = np.empty((n, *self.shape), np.dtype(self.dtype))
        if not self.scalars:
            return np.concatenate([p[self.name] for p in parts], out=out)
        for j, column in enumerate(self.columns):
            np.concatenate([p[column] for p in parts], out=out[:, j])
        return out


@dataclass(frozen=True)
class StepRecord:
    """The columns of an env's step record (module docstring), in a fixed order."""

    columns: tuple[Column, ...]

    @classmethod
    def of(cls, obs_shape: Sequence[int], obs_dtype: str, extra_size: int = 0) -> "StepRecord":
        """The record of an env whose ``obs`` is ``obs_shape`` of ``obs_dtype`` (``obs_extra``,
        and its cut-only copy, only where ``extra_size > 0``)."""
        obs = (tuple(int(d) for d in obs_shape), str(obs_dtype))
        observations = [(OBS, *obs)] + ([(OBS_EXTRA, (int(extra_size),), "float32")] if extra_size > 0 else [])
        columns = [Column(*o) for o in observations]
        columns += [Column(REWARD, (), "float32"), Column(DONE, (), "bool"), Column(TRUNCATED, (), "bool"),
                    Column(EPISODE_RETURN, (), "float32"), Column(EPISODE_STEP, (), "int32"),
                    Column(TASK, (), "int32")]
        columns += [Column(FINAL_OF[name], shape, dtype, cut_only=True) for name, shape, dtype in observations]
        return cls(tuple(columns))

    def __iter__(self) -> Iterator[Column]:
        return iter(self.columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def observations(self) -> tuple[str, ...]:
        """The observation columns the model reads (``obs``, and ``obs_extra`` where present)."""
        return tuple(name for name in (OBS, OBS_EXTRA) if name in self.names)

    @property
    def stored(self) -> tuple[Column, ...]:
        """The columns the acting thread uploads and the rollout store keeps (all but cut-only)."""
        return tuple(c for c in self.columns if not c.cut_only)

    @property
    def cut_only(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.cut_only)

    def groups(self) -> tuple[ColumnGroup, ...]:
        """The stored columns in groups (:class:`ColumnGroup`): each observation column alone, then
        the scalar columns of each dtype together, in table order."""
        groups = [ColumnGroup(c.name, c.dtype, c.shape, (c.name,)) for c in self.stored if c.name in (OBS, OBS_EXTRA)]
        for dtype in dict.fromkeys(c.dtype for c in self.stored if c.name not in (OBS, OBS_EXTRA)):
            names = tuple(c.name for c in self.stored if c.dtype == dtype and c.name not in (OBS, OBS_EXTRA))
            groups.append(ColumnGroup(dtype, dtype, (len(names),), names))
        return tuple(groups)

    @classmethod
    def of_arrays(cls, arrays: dict[str, np.ndarray]) -> "StepRecord":
        """The record whose ``[K, ...]`` arrays these are."""
        extra = arrays[OBS_EXTRA].shape[1] if OBS_EXTRA in arrays else 0
        return cls.of(arrays[OBS].shape[1:], arrays[OBS].dtype.name, extra)

    def specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``name -> (per-slot shape, dtype)`` of every column."""
        return {c.name: (c.shape, c.dtype) for c in self.columns}

    def allocate(self, slots: int) -> dict[str, np.ndarray]:
        """Zeroed ``[slots, ...]`` arrays of every column."""
        return {c.name: np.zeros((slots, *c.shape), np.dtype(c.dtype)) for c in self.columns}

    def pack(self, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``out`` for the trip to the learner process (Ray): the cut-only columns of the truncated
        rows only (an observation per slot per step would double the traffic) and those rows."""
        rows = np.flatnonzero(out[TRUNCATED])
        payload = {c.name: (out[c.name][rows] if c.cut_only else out[c.name]) for c in self.columns}
        payload[CUT_ROWS] = rows
        return payload

    def unpack(self, payload: dict[str, np.ndarray], slots: int) -> dict[str, np.ndarray]:
        """The full arrays of a :meth:`pack` payload (zeros outside the truncated rows)."""
        arrays = {name: value for name, value in payload.items() if name != CUT_ROWS}
        for c in self.cut_only:
            full = np.zeros((slots, *c.shape), np.dtype(c.dtype))
            full[payload[CUT_ROWS]] = payload[c.name]
            arrays[c.name] = full
        return arrays


def write_start(out: dict[str, np.ndarray], task: int) -> None:
    """The columns beside the observations of a worker's first result, in its arrays ``out``: every
    slot starts an episode (``done``), nothing was cut, no reward or return yet, cut-only zero."""
    clear_cut(out, slice(None))
    out[REWARD][:] = 0.0
    out[DONE][:] = True
    out[TRUNCATED][:] = False
    out[EPISODE_RETURN][:] = 0.0
    out[EPISODE_STEP][:] = 0
    out[TASK][:] = task


def clear_cut(out: dict[str, np.ndarray], rows: np.ndarray | slice | int) -> None:
    """Zero the cut-only columns of ``rows`` in a worker's arrays ``out`` (a later step replaced
    the truncation they held)."""
    for name in FINAL_OF.values():
        if name in out:
            out[name][rows] = 0
