"""``fwrl inspect``: what a trained agent's memory does in an episode, as a PNG and its arrays (NPZ).

The agent plays ``--episodes`` test episodes of its env in this process
(:mod:`fwrl.evaluation.playback`) while :class:`fwrl.evaluation.memory_trace.MemoryTracer` records
its core's insides at every step; each episode becomes ``episode-<k>.png`` and ``episode-<k>.npz``
(the arrays, named as :mod:`fwrl.evaluation.memory_trace` says) in the output folder.

The picture, one column per layer of the core, under a row of what the agent saw (vector
observations), did (its actions), got (rewards) and expected (its value):

- delta-rule cores: the write strength beta per step (each head thin, their mean thick), the
  change of the fast weights ||W_t - W_{t-1}|| per step, the read match phi(q_t) . phi(k_s) of every
  step t (rows) with every earlier step's key s (columns), averaged over heads, and its last row:
  what the last step's read matches;
- the SRWM: its four learning rates (the heads' mean), its self-modification per sub-matrix, the
  read match of its own queries and keys, its last row;
- LSTM and GRU: each gate's mean over units per step (with the middle 80 % of units shaded), the
  forget (LSTM) or update (GRU) gate of every unit over the steps, and the state norms;
- other cores: the norm and the change of every entry of their state per step.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from fwrl.utils.files import atomic_write

MATCH_STEPS = 500  # the read match of longer episodes covers their last MATCH_STEPS steps


def _layers(arrays: dict[str, Any]) -> list[str]:
    found = {name.split("/", 1)[0] for name in arrays if name.startswith("l") and "/" in name}
    return sorted(found, key=lambda x: int(x[1:]) if x[1:].isdigit() else 0)


def _heads(ax, values: np.ndarray, label: str, colour: str = "C0") -> None:
    """Per-step values [T, H]: each head thin, the mean thick."""
    steps = np.arange(len(values))
    if values.ndim == 2 and values.shape[1] > 1:
        ax.plot(steps, values, color=colour, alpha=0.25, linewidth=0.8)
        values = values.mean(axis=1)
    ax.plot(steps, values.reshape(len(values), -1)[:, 0], color=colour, linewidth=2, label=label)


def _head_mean(x: np.ndarray) -> np.ndarray:
    """The mean over heads (the last axis) where values are set (NaN: a key after the read)."""
    if x.ndim < 3:
        return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # rows of NaN above the diagonal
        return np.nanmean(x, axis=-1)


def _match(ax, fig, match: np.ndarray, start: int) -> None:
    shown = _head_mean(match)
    T = shown.shape[0]
    image = ax.imshow(np.ma.masked_invalid(shown), origin="upper", aspect="auto", cmap="viridis",
                      extent=(start - 0.5, start + T - 0.5, start + T - 0.5, start - 0.5), interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    ax.set_xlabel("key of step s")
    ax.set_ylabel("read at step t")


def _last_read(ax, match: np.ndarray, start: int, beta: np.ndarray | None) -> None:
    """The last read's match with every key (bars) and, where the rule writes with a strength beta,
    the match times the strength of that step's write (a line: the share of each write in the read,
    before later writes overwrote it)."""
    last = _head_mean(match[-1:])[0]
    steps = np.arange(start, start + len(last))
    ax.bar(steps, last, color="C3", width=1.0, label="phi(q_T) . phi(k_s)")
    low, high = float(np.nanmin(last)), float(np.nanmax(last))
    if high > low:  # from just under the least match: the differences show, not the common floor
        ax.set_ylim(low - 0.1 * (high - low), high + 0.05 * (high - low))
    ax.set_xlabel("key of step s")
    ax.set_ylabel("match with the last read")
    if beta is not None and beta.ndim == 2:
        weighted = (match[-1] * beta[start:start + len(last)]).mean(axis=-1)
        twin = ax.twinx()
        twin.plot(steps, weighted, color="k", linewidth=1.2, label="x beta_s")
        twin.set_ylabel("x beta_s (the write's share)")
        lines = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
        ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=7, loc="upper right")


def _context(ax, arrays: dict[str, Any]) -> None:
    """What the agent saw (vector observations, as an image), did and got, along the steps."""
    T = int(len(arrays["actions"]))
    if "observations" in arrays and arrays["observations"].size:
        obs = np.asarray(arrays["observations"], np.float64)
        scale = max(1e-6, float(np.abs(obs).max()))
        ax.imshow(obs.T, aspect="auto", cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest",
                  extent=(-0.5, T - 0.5, obs.shape[1] - 0.5, -0.5))
        ax.set_ylabel("observation")
    else:
        ax.set_yticks([])
    actions = np.asarray(arrays["actions"]).reshape(T, -1)[:, 0]
    twin = ax.twinx()
    twin.plot(np.arange(T), actions, "k.", markersize=4, label="action")
    twin.plot(np.arange(T), arrays["values"], color="C2", linewidth=1.5, label="value")
    rewarded = np.flatnonzero(np.asarray(arrays["rewards"]) != 0)
    if len(rewarded):
        twin.plot(rewarded, np.asarray(arrays["rewards"])[rewarded], "r|", markersize=8, label="reward")
    twin.legend(loc="upper right", fontsize=7, ncols=3)
    twin.set_ylabel("action / value / reward")
    ax.set_xlim(-0.5, T - 0.5)


def _panels(kind: str, arrays: dict[str, Any], layer: str) -> list[tuple[str, Callable]]:
    """(title, draw(ax, fig)) for one layer's column."""
    get = lambda name: arrays.get(f"{layer}/{name}")  # noqa: E731
    panels: list[tuple[str, Callable]] = []
    if kind in ("delta", "srwm") and get("beta") is not None:
        beta = get("beta")
        if beta.ndim == 3:  # the SRWM's four rates: the heads' mean of each
            def draw_rates(ax, fig, beta=beta):
                for i, part in enumerate(("y", "q", "k", "b")):
                    ax.plot(beta[:, :, i].mean(axis=1), label=f"beta_{part}", linewidth=1.5)
                ax.legend(fontsize=7, ncols=4)
            panels.append((f"{layer}: learning rates (sigmoid, heads' mean)", draw_rates))
        else:
            panels.append((f"{layer}: write strength beta", lambda ax, fig, beta=beta: _heads(ax, beta, "beta")))
    if get("self_modification") is not None:
        mod = get("self_modification")

        def draw_mod(ax, fig, mod=mod):
            for i, part in enumerate(("y", "q", "k", "b")):
                ax.plot(mod[:, :, i].sum(axis=1), label=f"W_{part}", linewidth=1.5)
            ax.legend(fontsize=7, ncols=4)
        panels.append((f"{layer}: self-modification ||W_t - W_t-1|| (heads summed)", draw_mod))
    if get("write") is not None:
        panels.append((f"{layer}: fast-weight change ||W_t - W_t-1||",
                       lambda ax, fig, w=get("write"): _heads(ax, w, "change", "C1")))
    if get("match") is not None:
        match, start = get("match"), int(arrays.get(f"{layer}/match_from", 0))
        panels.append((f"{layer}: read match phi(q_t) . phi(k_s), heads' mean",
                       lambda ax, fig, m=match, s=start: _match(ax, fig, m, s)))
        beta = get("beta") if kind == "delta" else None
        panels.append((f"{layer}: what the last step's read matches",
                       lambda ax, fig, m=match, s=start, b=beta: _last_read(ax, m, s, b)))
    if kind in ("lstm", "gru"):
        gates = [g for g in ("input_gate", "forget_gate", "output_gate", "reset_gate", "update_gate")
                 if get(g) is not None]

        def draw_gates(ax, fig, gates=gates):
            for i, gate in enumerate(gates):
                values = get(gate)
                steps = np.arange(len(values))
                ax.plot(steps, values.mean(axis=1), color=f"C{i}", linewidth=1.5, label=gate.replace("_", " "))
                ax.fill_between(steps, np.percentile(values, 10, axis=1), np.percentile(values, 90, axis=1),
                                color=f"C{i}", alpha=0.15)
            ax.set_ylim(0, 1)
            ax.legend(fontsize=7, ncols=3)
        panels.append((f"{layer}: gates (mean over units; 10-90 % shaded)", draw_gates))
        memory_gate = "forget_gate" if kind == "lstm" else "update_gate"

        def draw_units(ax, fig, values=get(memory_gate)):
            image = ax.imshow(values.T, aspect="auto", cmap="magma", vmin=0, vmax=1, interpolation="nearest")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
            ax.set_ylabel("unit")
        panels.append((f"{layer}: {memory_gate.replace('_', ' ')} of every unit", draw_units))
        norms = [n for n in ("h_norm", "c_norm") if get(n) is not None]

        def draw_norms(ax, fig, norms=norms):
            for i, n in enumerate(norms):
                ax.plot(get(n), color=f"C{i + 3}", linewidth=1.5, label=f"||{n[0]}||")
            ax.legend(fontsize=7)
        panels.append((f"{layer}: state norm", draw_norms))
    return panels


def _state_panels(arrays: dict[str, Any]) -> list[tuple[str, Callable]]:
    keys = sorted({name.split("/")[1] for name in arrays if name.startswith("state/")})
    if not keys:
        return []

    def draw(ax, fig, what: str):
        for i, key in enumerate(keys):
            ax.plot(arrays[f"state/{key}/{what}"], label=key, color=f"C{i % 10}", linewidth=1.2)
        ax.legend(fontsize=7, ncols=min(4, len(keys)))
    return [("state: change per step", lambda ax, fig: draw(ax, fig, "change")),
            ("state: norm", lambda ax, fig: draw(ax, fig, "norm"))]


def plot_episode(arrays: dict[str, Any], kind: str, title: str):
    """The figure of one episode's arrays (module docstring); the caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = _layers(arrays)
    columns = [_panels(kind, arrays, layer) for layer in layers]
    columns = [c for c in columns if c] or [_state_panels(arrays)]
    rows = max(len(c) for c in columns)
    ncols = len(columns)
    fig = plt.figure(figsize=(max(10.0, 6.5 * ncols), 1.8 + 2.4 * (rows + 1)), layout="constrained")
    grid = fig.add_gridspec(rows + 1, ncols, height_ratios=[1.3] + [1] * rows)
    _context(fig.add_subplot(grid[0, :]), arrays)
    for c, panels in enumerate(columns):
        for r, (name, draw) in enumerate(panels):
            ax = fig.add_subplot(grid[r + 1, c])
            draw(ax, fig)
            ax.set_title(name, fontsize=9)
            if not ax.get_xlabel():
                ax.set_xlabel("step")
    fig.suptitle(title, fontsize=11)
    return fig


def limit_match(arrays: dict[str, Any], steps: int = MATCH_STEPS) -> dict[str, Any]:
    """The read matches of an episode longer than ``steps`` cut to its last ``steps`` steps (rows
    and columns), with ``<layer>/match_from`` the first step they cover."""
    out = dict(arrays)
    for name, value in arrays.items():
        if name.endswith("match") and value.ndim >= 2 and value.shape[0] > steps:
            start = value.shape[0] - steps
            out[name] = value[start:, start:]
            out[name + "_from"] = np.int64(start)
    return out


def write_episode(folder: Path, index: int, arrays: dict[str, Any], kind: str, title: str) -> tuple[Path, Path]:
    """``episode-<index>.npz`` and ``.png`` in ``folder``, each written atomically."""
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    npz, png = folder / f"episode-{index}.npz", folder / f"episode-{index}.png"
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{name: np.asarray(v) for name, v in arrays.items()})
    atomic_write(npz, lambda f: f.write(buffer.getvalue()))
    fig = plot_episode(arrays, kind, title)
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=100)
    finally:
        plt.close(fig)
    atomic_write(png, lambda f: f.write(image.getvalue()))
    return png, npz


def inspect_agent(model, env: str, config: dict[str, Any], folder: Path, *, episodes: int = 1, seed: int = 0,
                  greedy: bool = True, device="cpu", env_wrappers: Sequence[str] = (),
                  say: Callable[[str], None] = print) -> list[tuple[Path, Path]]:
    """Play and trace ``episodes`` episodes of ``env``'s first task (test split) with ``model``;
    write each one's PNG and NPZ into ``folder``; returns their paths."""
    from fwrl.evaluation.memory_trace import kind_of, trace_episodes
    from fwrl.evaluation.playback import env_for
    from fwrl.evaluation.protocols import protocol_splits

    split = protocol_splits(env)[-1]  # ProcGen: the last test split (unseen levels); others: test
    made = env_for(split.env, 0, seed, env_wrappers)
    kind = kind_of(model.core)
    try:
        traced = trace_episodes(model, made, episodes=episodes, greedy=greedy, seed=seed, device=device, progress=say)
    finally:
        made.close()
    written = []
    for index, arrays in enumerate(traced):
        arrays = limit_match(arrays)
        title = (f"{env} ({split.name}), core {config.get('core')}, {int(config.get('agent_steps', 0)):,} agent steps"
                 f" - episode {index}: {int(arrays['length'])} steps, return {float(arrays['episode_return']):.4g}")
        written.append(write_episode(folder, index, arrays, kind, title))
        say(f"wrote {written[-1][0]} and {written[-1][1].name}")
    return written


__all__ = ["MATCH_STEPS", "inspect_agent", "limit_match", "plot_episode", "write_episode"]
