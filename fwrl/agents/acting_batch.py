"""What one acting step carries (``fwrl.agents.inference``): its indices, its inputs on the device
and what its device work hands back, as named types.

- :class:`StepIndex`: the step's indices, host arrays before the upload and views of the one
  uploaded int64 tensor after it;
- :class:`StepLayout`: how many entries each part of a :class:`StepIndex` holds; the packed index
  is laid out by it, read back by it, and a CUDA-graphed step is captured once per layout (the
  layout fixes every shape the step's device work sees);
- :class:`ActingBatch`: the step's inputs on the device, as staging uploads them
  (``fwrl.agents.acting_staging``);
- :class:`ActingOutput`: what the device work gives back to the host side (the actions) and to the
  rollout store (the slots' core state before the step).

n is the number of slots the step serves (``StepLayout.slots``), c the number of them whose episode a
time limit cut (``StepLayout.cut``: their final observations ride the forward as extra rows).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from torch import Tensor

from fwrl.memory_modules.base import State


class StepLayout(NamedTuple):
    """The entries of each part of one step's :class:`StepIndex` (its fields, in the same order): the
    layout of the packed index, and the key of the step's CUDA graph.

    A part the step has no use for holds none: ``pool_slots`` holds n entries only where staging
    reads observations from the pool's shared arrays; ``env_entries``, ``agent_entries`` (n each)
    and ``cut`` (c) only where the loop writes a rollout store."""

    slots: int
    pool_slots: int
    env_entries: int
    agent_entries: int
    cut: int

    @property
    def size(self) -> int:
        """Entries of the packed index."""
        return sum(self)

    @classmethod
    def most_entries(cls, slots: int) -> int:
        """The most entries a packed index over ``slots`` slots can hold: one per slot in each part."""
        return len(cls._fields) * slots

    def unpack(self, index: Tensor) -> StepIndex:
        """The parts of ``index`` (``[size]``, a :meth:`StepIndex.pack` of this layout) as named views:
        device work with no copy and no host sync."""
        return StepIndex(*index.split(self))


class StepIndex(NamedTuple):
    """The indices of one acting step over n slots, in batch order (host ``np.ndarray`` of int64
    before the upload; device views of the uploaded tensor after it, :meth:`StepLayout.unpack`):

    - ``slots`` [n]: each slot's row in the loop's core state;
    - ``pool_slots`` [n or 0]: each slot's row in the pool's shared arrays (``worker * K + env``), where
      staging reads observations from them (``staging="shared"``);
    - ``env_entries``, ``agent_entries`` [n or 0]: the store's flat entries of obs t and of the agent's
      output (``RolloutStore.plan``; none without a store);
    - ``cut`` [c]: the batch positions of the slots whose episode a time limit cut, whose final
      observations ride the forward (none without a store: evaluation bootstraps nothing).
    """

    slots: np.ndarray | Tensor
    pool_slots: np.ndarray | Tensor
    env_entries: np.ndarray | Tensor
    agent_entries: np.ndarray | Tensor
    cut: np.ndarray | Tensor

    @property
    def layout(self) -> StepLayout:
        """How many entries each part holds."""
        return StepLayout(*map(len, self))

    def pack(self, out: np.ndarray | None = None) -> np.ndarray:
        """The host array to upload (into ``out`` where given): the parts one after the other, as
        :attr:`layout` counts them."""
        return np.concatenate(self, out=out)


class ActingBatch(NamedTuple):
    """One acting step's inputs on the device, n slots in batch order:

    - ``layout``: the counts of ``index``;
    - ``index`` [``layout.size``] int64: the step's :class:`StepIndex`, packed (one upload);
      ``layout.unpack(index)`` names its parts;
    - ``groups``: the step record's stored column groups (``StepRecord.groups()``, in its order),
      each ``[n, *group.shape]``; a group staged from the pool's shared arrays is instead that whole
      ``[pool slots, *group.shape]`` buffer, from which the step takes its rows by ``pool_slots``;
    - ``final_obs``: the riders' observations, per observation column (``StepRecord.observations``,
      in its order) ``[c, *shape]``: the final observation of each cut episode, in batch order.
    """

    layout: StepLayout
    index: Tensor
    groups: tuple[Tensor, ...]
    final_obs: tuple[Tensor, ...]


class ActingOutput(NamedTuple):
    """What the device work of one acting step over n slots gives back:

    - ``action`` ``[n, ...]``: the actions, for the workers;
    - ``state_in``: the core state of the slots before the step (the model's state, by its names,
      ``[n, ...]`` each), which the rollout store copies for the rollouts that start at this step.
    """

    action: Tensor
    state_in: State
