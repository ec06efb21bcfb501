"""The policy's action distribution: one categorical per action dimension.

A ``Discrete(n)`` action space has ``action_dims = (n,)``; a
``MultiDiscrete(nvec)`` one has ``action_dims = nvec``, and the policy is
the product of independent categoricals, one head per dimension, whose
logits are consecutive slices of the policy layer's output
(``sum(action_dims)`` logits). So, for actions ``a = (a_1, ..., a_D)``,

    log pi(a|x) = sum_d log softmax(logits_d)[a_d],
    H(pi(.|x))  = sum_d H(softmax(logits_d)),

which is what V-trace's importance weights (IMPALA Eq. 1), the policy
gradient and the entropy bonus (IMPALA Sec. 4.2) use. Actions are int64
``[...]`` for one dimension and ``[..., D]`` for several.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def _split(logits: Tensor, action_dims: Sequence[int]) -> tuple[Tensor, ...]:
    if logits.shape[-1] != sum(action_dims):
        raise ValueError(f"policy logits have {logits.shape[-1]} entries, action_dims {tuple(action_dims)} "
                         f"need {sum(action_dims)}")
    return torch.split(logits, list(action_dims), dim=-1)


def log_prob(logits: Tensor, actions: Tensor, action_dims: Sequence[int] | None = None) -> Tensor:
    """log pi(a|x): ``logits [..., sum(dims)]``, ``actions [...]`` or ``[..., D]`` -> ``[...]``."""
    if action_dims is None or len(action_dims) == 1:
        return F.log_softmax(logits, dim=-1).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    parts = _split(logits, action_dims)
    return sum(F.log_softmax(part, dim=-1).gather(-1, actions[..., d].long().unsqueeze(-1)).squeeze(-1)
               for d, part in enumerate(parts))


def entropy(logits: Tensor, action_dims: Sequence[int] | None = None) -> Tensor:
    """H(pi(.|x)) summed over the action dimensions: ``[..., sum(dims)]`` -> ``[...]``."""
    parts = (logits,) if action_dims is None or len(action_dims) == 1 else _split(logits, action_dims)
    total = 0
    for part in parts:
        log_p = F.log_softmax(part, dim=-1)
        total = total - (log_p.exp() * log_p).sum(-1)
    return total


def sample(logits: Tensor, action_dims: Sequence[int] | None = None, greedy: bool = False,
           sampler: str = "multinomial", generator: torch.Generator | None = None) -> Tensor:
    """Actions from ``logits [T, B, sum(dims)]``: ``[T, B]`` for one dimension, else ``[T, B, D]``.

    ``greedy``: the argmax per dimension. Else a sample: ``multinomial`` draws from
    softmax(logits); ``gumbel`` takes the argmax of logits plus Gumbel noise (the same
    distribution from ``torch.rand`` alone, which a CUDA graph can capture). ``generator``:
    the random numbers' source (default: torch's global one for the logits' device).
    """
    parts = (logits,) if action_dims is None or len(action_dims) == 1 else _split(logits, action_dims)
    actions = [_sample_one(part, greedy, sampler, generator) for part in parts]
    return actions[0] if len(actions) == 1 else torch.stack(actions, dim=-1)


def _sample_one(logits: Tensor, greedy: bool, sampler: str, generator: torch.Generator | None) -> Tensor:
    if greedy:
        return logits.argmax(dim=-1)
    if sampler == "gumbel":
        uniform = torch.rand(logits.shape, dtype=logits.dtype, device=logits.device, generator=generator)
        noise = -torch.log(-torch.log(uniform.clamp_(min=1e-20)))
        return (logits + noise).argmax(dim=-1)
    lead = logits.shape[:-1]
    flat = F.softmax(logits.reshape(-1, logits.shape[-1]), dim=-1)
    return torch.multinomial(flat, 1, generator=generator).view(lead)
