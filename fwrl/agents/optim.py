"""The IMPALA optimiser settings (PAPERS.md §4; Espeholt et al. 2018).

RMSProp (lr 6e-4, alpha 0.99, eps 0.01, momentum 0), the learning rate
decayed linearly to 0 over the total number of agent steps, and global-norm
gradient clipping at 40. torch's RMSprop adds eps outside the square root,
as the torchbeast runs of the papers' authors did.

torch's RMSprop starts its square average ``v`` at 0, so its first steps are up
to 1/sqrt(1 - alpha^n) larger than later ones (10x at update 1, 1.6x at 50;
the fast-weight audit, ``benchmarks/learning/fast_weight_audit/README.md``
Sec. 2). ``bias_correction`` divides ``v`` by ``1 - alpha^n`` before the root,
as Adam does its second moment (Kingma & Ba 2015, Alg. 1):
``lr g / (sqrt(v / c) + eps) = (lr sqrt(c)) g / (sqrt(v) + eps sqrt(c))`` with
``c = 1 - alpha^n``, so :class:`BiasCorrectedRMSprop` runs torch's own RMSprop
with that step's ``lr`` and ``eps`` scaled by ``sqrt(c)``: exact with momentum
0 (IMPALA's), and with momentum the buffer's earlier terms keep their own scale.

The schedule is a pure function of the agent-step count
(:func:`linear_decay_lr`), so a resumed run that restores the step count from
its checkpoint gets exactly the learning rate it would have had.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
from torch import Tensor

from fwrl.errors import FwrlError


def _unguarded(method):
    """torch's own implementation of an ``Optimizer`` method without the guard that keeps
    ``torch.compile`` out of it (where a torch release has one; else the method itself). That guard
    imports ``torch._dynamo`` on its first call: 1.2 s of CPU on the 2-core machine, as long as
    importing the rest of torch, in every process that builds, steps or saves an optimiser (the
    learner and its update process). fwrl never compiles its optimiser. Unwrapped to the innermost
    function: a ``step`` that an earlier torch optimiser of the class has wrapped in its profiler
    hook (``Optimizer._patch_step_function``) unwraps through that hook too (ours gets its own)."""
    return inspect.unwrap(method)


class RMSprop(torch.optim.RMSprop):
    """torch's RMSprop, its maths and state unchanged, with the methods a run calls taken without
    their ``torch.compile`` guards (:func:`_unguarded`). ``step`` sets grad mode as torch's does
    (off unless the optimiser is ``differentiable``); the profiler's record and the step hooks that
    torch adds around ``step`` stay."""

    _step = staticmethod(_unguarded(torch.optim.RMSprop.step))
    _add_param_group = staticmethod(_unguarded(torch.optim.Optimizer.add_param_group))
    _zero_grad = staticmethod(_unguarded(torch.optim.Optimizer.zero_grad))
    _state_dict = staticmethod(_unguarded(torch.optim.Optimizer.state_dict))
    _load_state_dict = staticmethod(_unguarded(torch.optim.Optimizer.load_state_dict))

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return self._step(self, closure)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._add_param_group(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero_grad(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._load_state_dict(self, state_dict)


class BiasCorrectedRMSprop(RMSprop):
    """torch's RMSprop with the square average divided by ``1 - alpha^n`` at update ``n`` (module
    docstring). Each param group counts its updates in ``corrected_updates`` (saved with the
    optimiser's state, so a resumed run goes on with the same correction)."""

    def step(self, closure=None):
        saved = []
        for group in self.param_groups:
            n = group.setdefault("corrected_updates", 0) + 1
            group["corrected_updates"] = n
            scale = (1.0 - group["alpha"] ** n) ** 0.5
            saved.append((group["lr"], group["eps"]))
            group["lr"], group["eps"] = group["lr"] * scale, group["eps"] * scale
        try:
            return super().step(closure)
        finally:
            for group, (lr, eps) in zip(self.param_groups, saved):
                group["lr"], group["eps"] = lr, eps


def make_optimizer(
    params: Iterable[Tensor] | Iterable[dict[str, Any]],
    lr: float = 6e-4,
    alpha: float = 0.99,
    eps: float = 0.01,
    momentum: float = 0.0,
    bias_correction: bool = False,
) -> torch.optim.RMSprop:
    """torch's RMSprop (:class:`RMSprop`) with the IMPALA defaults; ``bias_correction``:
    :class:`BiasCorrectedRMSprop`."""
    cls = BiasCorrectedRMSprop if bias_correction else RMSprop
    return cls(params, lr=lr, alpha=alpha, eps=eps, momentum=momentum)


def linear_decay_lr(base_lr: float, agent_steps: int, total_steps: int) -> float:
    """base_lr * (1 - min(agent_steps, total_steps) / total_steps): 0 from total_steps on."""
    return base_lr * (1.0 - min(max(agent_steps, 0), total_steps) / total_steps)


class LinearDecayScheduler:
    """Sets each param group's lr to ``linear_decay_lr(initial_lr, agent_steps, total_steps)``.

    ``step()`` after each optimiser update advances the count by
    ``steps_per_update`` (T x B agent steps) or sets it to the count given.
    ``state_dict`` / ``load_state_dict`` carry the count, so a restored
    scheduler continues the same schedule.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int,
                 steps_per_update: int, agent_steps: int = 0) -> None:
        if total_steps <= 0:
            raise FwrlError(f"total steps must be a positive number of agent steps, got {total_steps}.")
        if steps_per_update <= 0:
            raise FwrlError(
                f"steps per update (unroll length x batch size) must be positive, got {steps_per_update}."
            )
        self.optimizer = optimizer
        self.total_steps = int(total_steps)
        self.steps_per_update = int(steps_per_update)
        self.base_lrs = [group.setdefault("initial_lr", group["lr"]) for group in optimizer.param_groups]
        self.agent_steps = int(agent_steps)
        self._apply()

    def lr_at(self, agent_steps: int) -> list[float]:
        """The learning rate of each param group at ``agent_steps``."""
        return [linear_decay_lr(base, agent_steps, self.total_steps) for base in self.base_lrs]

    def _apply(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.lr_at(self.agent_steps)):
            group["lr"] = lr

    def step(self, agent_steps: int | None = None) -> None:
        """Advance by one update's worth of agent steps, or jump to ``agent_steps``."""
        if agent_steps is None:
            self.agent_steps += self.steps_per_update
        else:
            self.agent_steps = int(agent_steps)
        self._apply()

    def rebudget(self, total_steps: int) -> None:
        """Decay over ``total_steps`` from now on (a resumed run with another budget); the
        learning rate of the current step is set at once."""
        if total_steps <= 0:
            raise FwrlError(f"total steps must be a positive number of agent steps, got {total_steps}.")
        self.total_steps = int(total_steps)
        self._apply()

    def get_last_lr(self) -> list[float]:
        """The learning rates currently set, one per param group."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "agent_steps": self.agent_steps,
            "total_steps": self.total_steps,
            "steps_per_update": self.steps_per_update,
            "base_lrs": list(self.base_lrs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agent_steps = int(state["agent_steps"])
        self.total_steps = int(state["total_steps"])
        self.steps_per_update = int(state["steps_per_update"])
        self.base_lrs = list(state["base_lrs"])
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base
        self._apply()


def linear_decay_scheduler(optimizer: torch.optim.Optimizer, total_steps: int,
                           steps_per_update: int, agent_steps: int = 0) -> LinearDecayScheduler:
    """Linear decay of the learning rate to 0 over ``total_steps`` agent steps."""
    return LinearDecayScheduler(optimizer, total_steps, steps_per_update, agent_steps)


def clip_grad_norm(params: Iterable[Tensor], max_norm: float = 40.0) -> Tensor:
    """Scale the gradients so their global L2 norm is at most ``max_norm``; returns the norm before clipping."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
