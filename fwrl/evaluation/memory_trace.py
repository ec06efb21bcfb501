"""What a trained agent's memory does, step by step: the arrays behind ``fwrl inspect``.

:class:`MemoryTracer` hooks the core of an agent that acts one step at a time (T = 1,
:mod:`fwrl.evaluation.playback`) and, at every step, re-derives from the layer's own input and
weights what its recurrence used (the same equations as the kernels' references; nothing in the
forward changes):

- the delta-rule family (``linear_transformer``, ``delta_net``, ``rdn``, ``gated_delta_net``; the
  SR-DeltaNet's fast matrix): per layer and head, the write strength ``beta`` (sigmoid of the slow
  net's rate, ``kernels/delta_rule/naive.py``; the sum rule writes with 1), the decay ``alpha`` of
  the gated rule, the change of the fast weights ``write`` = ||W_t - W_{t-1}||_F and their norm,
  and the feature-mapped ``query`` and ``key`` phi(q_t), phi(k_t) that the rule reads and writes
  with;
- the SRWM (``srwm``; ``sr_delta_net``'s with the prefix ``srwm_``, beside its Delta Net's): per
  head its four self-invented learning rates ``beta`` (y, q, k, b), its generated ``query`` and
  ``key`` (Eq. 6-8, softmax), and its self-modification ``self_modification``: the change of each
  sub-matrix, ||W^M_t - W^M_{t-1}||_F;
- ``lstm``: per layer the input, forget and output gates (and the cell input), ``h`` and ``c`` norms;
- ``gru``: per layer the reset and update gates, the ``h`` norm;
- every core: for each entry of its state, its norm and its change per step (``state/...``).

From the queries and keys of an episode, :func:`read_match` gives how strongly the read at step t
matches each earlier step's key, phi(q_t) . phi(k_s) for s <= t (NaN for s > t): the share of the
write at s that the delta rule's read at t retrieves, up to the writes that overwrote it.

Arrays per episode (:meth:`MemoryTracer.episode`): the names above as ``l<layer>/<name>``, with T
(the steps the agent acted) first: ``beta`` [T, H] (SRWM: [T, H, 4]), ``write`` and ``norm``
[T, H], ``query`` / ``key`` [T, H, F], ``match`` [T, T, H]; gates [T, units]; norms [T].
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fwrl.kernels.feature_maps import apply_feature_map
from fwrl.kernels.srwm.naive import NUM_RATES
from fwrl.memory_modules.base import Core
from fwrl.memory_modules.fwp_block import FWPTransformerCore
from fwrl.memory_modules.gated_delta_net import GatedDeltaLayer
from fwrl.memory_modules.gru import GRUCore
from fwrl.memory_modules.linear_transformer import SlowNetFastWeightLayer
from fwrl.memory_modules.lstm import LSTMCore
from fwrl.memory_modules.rdn import RDNLayer
from fwrl.memory_modules.srwm import OFFSET_KEYS, SRDeltaNetLayer, SRWMLayer

SRWM_PARTS = ("y", "q", "k", "b")  # the sub-matrices of OFFSET_KEYS, each with its own learning rate


def _np(x: Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


def _reset(state: dict[str, Tensor], done: Tensor) -> dict[str, Tensor]:
    """The state a step starts from: zero where ``done`` (every core here starts episodes from 0)."""
    keep = (~done.reshape(-1)).to(next(iter(state.values())).dtype) if state else None
    return {k: v * keep.view(-1, *([1] * (v.dim() - 1))) for k, v in state.items()}


def _norms(x: Tensor, dims: int) -> Tensor:
    """The Frobenius norm over the last ``dims`` axes."""
    return x.flatten(-dims).norm(dim=-1) if dims else x.abs()


def kind_of(core: nn.Module) -> str:
    """``delta``, ``srwm``, ``lstm``, ``gru`` (the cores traced in detail) or ``state`` (state norms only)."""
    if isinstance(core, LSTMCore):
        return "lstm"
    if isinstance(core, GRUCore):
        return "gru"
    if isinstance(core, FWPTransformerCore):
        layers = [block.fwp for block in core.blocks]
        if all(isinstance(x, (SRWMLayer, SRDeltaNetLayer)) for x in layers):
            return "srwm"
        if all(isinstance(x, (SlowNetFastWeightLayer, RDNLayer, GatedDeltaLayer)) for x in layers):
            if not any(isinstance(x, GatedDeltaLayer) and x.writes > 1 for x in layers):
                return "delta"
    return "state"


class MemoryTracer:
    """Hooks on ``core`` (an agent's, acting with T = 1 and B = 1) recording, at each step, the
    arrays of the module docstring; :meth:`episode` hands one episode's over and starts the next,
    :meth:`close` removes the hooks."""

    def __init__(self, core: Core):
        self.core = core
        self.kind = kind_of(core)
        self.steps: dict[str, list[np.ndarray]] = {}
        self.handles = [core.register_forward_hook(self._core_hook)]
        if isinstance(core, FWPTransformerCore):
            for i, block in enumerate(core.blocks):
                self.handles.append(block.fwp.register_forward_hook(self._layer_hook(i)))

    def _add(self, name: str, value: Tensor | np.ndarray | float) -> None:
        array = _np(value) if isinstance(value, Tensor) else np.asarray(value, np.float32)
        self.steps.setdefault(name, []).append(array.astype(np.float32))

    # ------------------------------------------------------------------ every core: its state

    def _core_hook(self, module: nn.Module, args: tuple, output: tuple) -> None:
        x, state, done = args
        _, new_state = output
        before = _reset(state, done[0])
        for key, value in new_state.items():
            dims = value.dim() - 1
            self._add(f"state/{key}/norm", _norms(value[0], dims))
            self._add(f"state/{key}/change", _norms(value[0] - before[key][0], dims))
        if self.kind == "lstm":
            self._lstm(module, x, before, new_state)
        elif self.kind == "gru":
            self._gru(module, x, before, new_state)

    def _lstm(self, core: LSTMCore, x: Tensor, before: dict, after: dict) -> None:
        inputs = core.input_norm(x) if core.input_norm is not None else x
        inputs = inputs[0, 0]
        for layer in range(core.num_layers):
            w = {name: getattr(core.lstm, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            pre = F.linear(inputs, w["weight_ih"], w["bias_ih"]) + F.linear(before["h"][0, layer], w["weight_hh"], w["bias_hh"])
            i, f, g, o = pre.chunk(4)  # torch's order
            self._add(f"l{layer}/input_gate", torch.sigmoid(i))
            self._add(f"l{layer}/forget_gate", torch.sigmoid(f))
            self._add(f"l{layer}/output_gate", torch.sigmoid(o))
            self._add(f"l{layer}/cell_input", torch.tanh(g))
            self._add(f"l{layer}/h_norm", after["h"][0, layer].norm())
            self._add(f"l{layer}/c_norm", after["c"][0, layer].norm())
            inputs = after["h"][0, layer]

    def _gru(self, core: GRUCore, x: Tensor, before: dict, after: dict) -> None:
        inputs = core.input_norm(x) if core.input_norm is not None else x
        inputs = inputs[0, 0]
        for layer in range(core.num_layers):
            w = {name: getattr(core.gru, f"{name}_l{layer}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
            gi = F.linear(inputs, w["weight_ih"], w["bias_ih"]).chunk(3)
            gh = F.linear(before["h"][0, layer], w["weight_hh"], w["bias_hh"]).chunk(3)
            self._add(f"l{layer}/reset_gate", torch.sigmoid(gi[0] + gh[0]))
            self._add(f"l{layer}/update_gate", torch.sigmoid(gi[1] + gh[1]))  # torch's z: h = (1 - z) n + z h
            self._add(f"l{layer}/h_norm", after["h"][0, layer].norm())
            inputs = after["h"][0, layer]

    # ------------------------------------------------------------------ fast-weight layers

    def _layer_hook(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, output: tuple) -> None:
            x, state, done = args
            before = _reset(state, done[0])
            after = output[1]
            prefix = f"l{index}/"
            if isinstance(module, (SRWMLayer, SRDeltaNetLayer)):
                self._srwm(module, x, before, after, prefix)
            if isinstance(module, SlowNetFastWeightLayer):
                self._slow_net(module, x, prefix)
            elif isinstance(module, RDNLayer):
                self._rdn(module, x, before, prefix)
            elif isinstance(module, GatedDeltaLayer) and module.writes == 1:
                self._gated(module, x, prefix)
            if "W" in after and "W" in before:  # the delta rule's fast matrix
                self._add(prefix + "write", _norms(after["W"][0] - before["W"][0], 2))
                self._add(prefix + "norm", _norms(after["W"][0], 2))
        return hook

    def _read_write(self, prefix: str, feature_map: str, q: Tensor, k: Tensor, beta: Tensor | None) -> None:
        self._add(prefix + "query", apply_feature_map(feature_map, q))
        self._add(prefix + "key", apply_feature_map(feature_map, k))
        self._add(prefix + "beta", torch.sigmoid(beta) if beta is not None else torch.ones(q.shape[0]))

    def _slow_net(self, layer: SlowNetFastWeightLayer, x: Tensor, prefix: str) -> None:
        d = layer.head_dim
        p = layer.slow_net(x[0, 0]).view(layer.num_heads, layer.per_head)
        q, k, _, *rest = p.split([d, d, d] + ([1] if layer.rule == "delta" else []), dim=-1)
        self._read_write(prefix, layer.feature_map, q, k, rest[0].squeeze(-1) if rest else None)

    def _rdn(self, layer: RDNLayer, x: Tensor, before: dict, prefix: str) -> None:
        d = layer.head_dim
        q, k, _, b = layer.slow_net(x[0, 0]).view(layer.num_heads, layer.per_head).split([d, d, d, 1], dim=-1)
        s = torch.tanh(before["h"][0])  # kernels/rdn/naive.py: s_t = tanh(h_{t-1})
        q = q + torch.einsum("hij,hj->hi", layer.R_q, s)
        k = k + torch.einsum("hij,hj->hi", layer.R_k, s)
        beta = b.squeeze(-1) + torch.einsum("hj,hj->h", layer.r_b, s)
        self._read_write(prefix, layer.feature_map, q, k, beta)

    def _gated(self, layer: GatedDeltaLayer, x: Tensor, prefix: str) -> None:
        H, d = layer.num_heads, layer.head_dim
        qkv, beta, a, *_ = layer.slow_net(x[0, 0]).split(layer.sizes, dim=-1)
        if layer.qkv_silu:
            qkv = F.silu(qkv)
        q, k, _ = qkv.view(H, layer.per_head).split([d, d, d], dim=-1)
        self._read_write(prefix, layer.feature_map, q, k, beta)
        self._add(prefix + "alpha", torch.exp(F.softplus(a + layer.dt_bias) * -torch.exp(layer.A_log)))

    def _srwm(self, layer: SRWMLayer | SRDeltaNetLayer, x: Tensor, before: dict, after: dict, prefix: str) -> None:
        H, d = layer.num_heads, layer.head_dim
        phi = apply_feature_map(layer.input_map, x[0, 0].reshape(H, d))
        slow = (layer.W_y, layer.W_q, layer.W_k, layer.w_b)
        W = torch.cat([p + before[key][0] for p, key in zip(slow, OFFSET_KEYS)], dim=1)  # [H, R, d]
        rows = tuple(p.shape[1] for p in slow)
        _, q, k, b = (W @ phi.unsqueeze(-1)).squeeze(-1).split(rows, dim=-1)  # kernels/srwm/naive.py, Eq. 5
        q, k = torch.softmax(q, dim=-1), torch.softmax(k, dim=-1)
        own = prefix + ("" if isinstance(layer, SRWMLayer) else "srwm_")  # SR-DeltaNet: its Delta Net's are plain
        self._add(own + "query", q)
        self._add(own + "key", k)
        self._add(own + "beta", torch.sigmoid(b))  # [H, 4]
        self._add(prefix + "self_modification", torch.stack(
            [_norms(after[key][0] - before[key][0], 2) for key in OFFSET_KEYS], dim=-1))  # [H, 4]
        if isinstance(layer, SRDeltaNetLayer):  # the Delta Net the SRWM programs
            y = (W[:, : rows[0]] @ phi.unsqueeze(-1)).squeeze(-1)
            dq, dk, _, beta = y.split([d, d, d, 1], dim=-1)
            self._read_write(prefix, layer.feature_map, dq, dk, beta.squeeze(-1))

    # ------------------------------------------------------------------ episodes

    def episode(self) -> dict[str, np.ndarray]:
        """The arrays of the steps since the last call (module docstring), ``match`` included."""
        arrays = {name: np.stack(values) for name, values in self.steps.items()}
        self.steps = {}
        for name in list(arrays):
            for query, key, match in (("query", "key", "match"), ("srwm_query", "srwm_key", "srwm_match")):
                if name.endswith("/" + query):
                    prefix = name[: -len(query)]
                    arrays[prefix + match] = read_match(arrays[name], arrays[prefix + key])
        return arrays

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def read_match(query: np.ndarray, key: np.ndarray) -> np.ndarray:
    """``match[t, s, h] = query[t, h] . key[s, h]`` for s <= t, NaN for s > t (``query``,
    ``key``: [T, H, F]): how strongly the read at step t matches the key written at step s."""
    match = np.einsum("thf,shf->tsh", query.astype(np.float64), key.astype(np.float64))
    T = match.shape[0]
    match[np.triu_indices(T, k=1)] = np.nan
    return match.astype(np.float32)


def trace_episodes(model: nn.Module, env, *, episodes: int = 1, greedy: bool = True, seed: int = 0,
                   device: torch.device | str = "cpu", progress: Callable[[str], None] | None = None
                   ) -> list[dict[str, Any]]:
    """Play ``episodes`` episodes of ``env`` (a made env) with ``model`` and trace its core: per
    episode a dict of the arrays (module docstring) with, beside them, the episode's ``actions``
    [T], ``rewards`` [T] (what came with each observation), ``values`` [T] (the baseline),
    ``observations`` [T, ...] (vector observations and ``obs_extra`` only, frames are left out),
    and ``episode_return`` / ``length`` scalars."""
    from fwrl.evaluation.playback import play

    tracer = MemoryTracer(model.core)
    values: list[float] = []
    handle = model.baseline.register_forward_hook(lambda m, a, out: values.append(float(out.reshape(-1)[0])))
    log: dict[str, list] = {"actions": [], "rewards": [], "observations": []}
    out: list[dict[str, Any]] = []

    def on_step(step) -> None:
        if step.action is None:
            return
        log["actions"].append(np.asarray(step.action))
        log["rewards"].append(step.reward)
        obs = step.obs if isinstance(step.obs, dict) else {"obs": step.obs}
        vector = [np.asarray(v, np.float32).reshape(-1) for v in obs.values() if np.asarray(v).ndim <= 1]
        if vector and len(vector) == len(obs):
            log["observations"].append(np.concatenate(vector))

    def on_episode(played) -> None:
        arrays = tracer.episode()
        arrays["actions"] = np.stack(log["actions"])
        arrays["rewards"] = np.asarray(log["rewards"], np.float32)
        arrays["values"] = np.asarray(values, np.float32)
        if log["observations"]:
            arrays["observations"] = np.stack(log["observations"])
        arrays["episode_return"] = np.float32(played.episode_return)
        arrays["length"] = np.int64(played.length)
        out.append(arrays)
        values.clear()
        for v in log.values():
            v.clear()
        if progress is not None:
            progress(f"episode {played.index}: {played.length} steps, return {played.episode_return:.4g}")

    try:
        play(model, env, episodes=episodes, greedy=greedy, seed=seed, device=device, on_step=on_step,
             on_episode=on_episode)
    finally:
        handle.remove()
        tracer.close()
    return out


__all__ = ["MemoryTracer", "NUM_RATES", "SRWM_PARTS", "kind_of", "read_match", "trace_episodes"]
