"""Learner memory against unroll length for the eLSTM core: exact RTRL vs truncated BPTT.

``python benchmarks/r2ac_memory.py [--unrolls 10,50,100,200] [--batch 32] [--hidden 256]
[--env memory:cue_delay?delay=40] [--device auto] [--out DIR]``

What is measured, for each gradient mode and unroll T: one learner update
(forward of ``AgentNet`` with the ``elstm`` core over a ``[T+1, B]`` batch,
the IMPALA loss, backward), from the rollout's initial core state (for RTRL
that includes the carried sensitivities Z, F of shape ``[B, H, D]``).

Two numbers per run:

* ``peak_mib``: the peak of live tensor memory during the update, above what
  was live when it started (model, batch, initial state). On CUDA this is
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. On
  CPU there is no allocator peak counter, so the update runs under
  ``torch.profiler`` with ``profile_memory=True`` and the peak is read from
  its memory timeline (``export_memory_timeline``): the profiler records
  every tensor allocation and free of the CPU allocator, so the timeline's
  maximum is the largest total of live tensors at any moment. Process RSS
  would mix in allocator caching and thread stacks, and ``tracemalloc`` does
  not see ATen's allocations at all, so neither is used.
* ``saved_mib`` / ``core_saved_mib``: bytes autograd keeps between forward
  and backward (``torch.autograd.graph.saved_tensors_hooks``, each storage
  counted once), in total and for the tensors saved while the core runs.
  This is the part that grows with T. For truncated BPTT the core saves its
  per-step intermediates (O(T B H) with several tensors per step); for RTRL
  the core keeps per step only its input x_t, c_t and the output gate o_t
  (x and c are shared by the RTRL Function and the output gate; a, b, d,
  c_{t-1} are recomputed in backward), never a [T, B, H, D] sensitivity
  history (Paper 004, Sec. 3.1; see ``fwrl.kernels.elstm_rtrl.recurrence``).
  The stem and heads save O(T B D) in both modes: "what the heads need".

Prints a table and, with ``--out``, writes ``memory.csv`` and ``memory.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from fwrl.agents.losses import impala_loss
from fwrl.agents.model import AgentNet
from fwrl.envs.registry import describe_env
from fwrl.errors import FwrlError, run_main

MODES = ("rtrl", "bptt")
MIB = 2.0**20


class SavedTensorMeter:
    """Bytes autograd saves for backward, each storage once, split by module (core or rest)."""

    def __init__(self, model: AgentNet):
        self.bytes = {"core": 0, "rest": 0}
        self._seen: set[int] = set()
        self._where = "rest"
        model.core.register_forward_pre_hook(lambda *_: self._enter("core"))
        model.core.register_forward_hook(lambda *_: self._enter("rest"))

    def _enter(self, where: str) -> None:
        self._where = where

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._seen and storage.nbytes() > 0:
            self._seen.add(key)
            self.bytes[self._where] += storage.nbytes()
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


def make_batch(model: AgentNet, T: int, B: int, device: torch.device) -> dict[str, torch.Tensor]:
    """A random ``[T+1, B]`` rollout batch with the learner's keys (as ``collate`` gives them)."""
    gen = torch.Generator().manual_seed(0)
    A = model.num_actions
    obs = torch.rand((T + 1, B, *model.obs_shape), generator=gen)
    done = torch.rand((T + 1, B), generator=gen) < 0.02
    return {
        "obs": obs.to(device),
        "reward": (torch.rand((T + 1, B), generator=gen) < 0.1).float().to(device),
        "done": done.to(device),
        "action": torch.randint(A, (T + 1, B), generator=gen).to(device),
        "policy_logits": torch.randn((T + 1, B, A), generator=gen).to(device),
    }


def initial_state(model: AgentNet, B: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Non-zero carried state, as in the middle of an episode."""
    gen = torch.Generator().manual_seed(1)
    return {k: (torch.randn(v.shape, generator=gen) * 0.1).to(device)
            for k, v in model.initial_state(B).items()}


def learner_update(model: AgentNet, batch, state, meter: SavedTensorMeter) -> None:
    with meter.hooks():
        outputs, _ = model(batch, state)
        loss, _ = impala_loss(outputs, batch)
    loss.backward()


def measure(env: str, mode: str, T: int, B: int, hidden: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    info = describe_env(env)
    model = AgentNet(info.obs_shape, info.num_actions, "elstm",
                     {"hidden_size": hidden, "grad": mode}, stem=None).to(device)
    batch = make_batch(model, T, B, device)
    state = initial_state(model, B, device)
    # warm-up (lazy initialisation of kernels and the allocator), not measured
    learner_update(model, make_batch(model, 2, B, device), state, SavedTensorMeter(model))
    model.zero_grad(set_to_none=False)
    meter = SavedTensorMeter(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        learner_update(model, batch, state, meter)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
    else:
        peak = _cpu_peak(lambda: learner_update(model, batch, state, meter))
    state_bytes = sum(v.numel() * v.element_size() for v in state.values())
    return {"mode": mode, "unroll": T, "batch": B, "hidden": hidden, "input": model.core.input_size,
            "peak_mib": peak / MIB, "saved_mib": (meter.bytes["core"] + meter.bytes["rest"]) / MIB,
            "core_saved_mib": meter.bytes["core"] / MIB, "state_mib": state_bytes / MIB}


def _cpu_peak(fn) -> float:
    """Peak live CPU tensor bytes while ``fn`` runs, above the bytes live at its start."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # deprecated in favour of CUDA memory snapshots, which do not cover the CPU
        warnings.simplefilter("ignore", FutureWarning)
        path = Path(tmp) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        times, sizes = json.loads(path.read_text())
    totals = [sum(row) for row in sizes]
    return max(totals) - totals[0] if totals else 0.0


def slope(rows: list[dict], key: str) -> float:
    """Least-squares MiB per unroll step of ``key`` over the rows of one mode."""
    xs = [r["unroll"] for r in rows]
    ys = [r[key] for r in rows]
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--unrolls", default="10,50,100,200", help="comma-separated unroll lengths T")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--env", default="memory:cue_delay?delay=40", help="env spec (sets obs shape and stem)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--out", default="", help="folder for memory.csv and memory.json")
    args = parser.parse_args(argv)
    try:
        unrolls = [int(u) for u in args.unrolls.split(",") if u.strip()]
    except ValueError:
        raise FwrlError(f"--unrolls must be comma-separated integers, got {args.unrolls!r}.") from None
    if not unrolls or min(unrolls) < 1:
        raise FwrlError(f"--unrolls needs positive integers, got {args.unrolls!r}.")
    from fwrl.runner.agent import pick_device

    device = pick_device(args.device)
    rows = [measure(args.env, mode, T, args.batch, args.hidden, device) for mode in MODES for T in unrolls]
    print(f"learner update memory, eLSTM H={args.hidden}, B={args.batch}, env {args.env}, device {device}")
    header = f"{'mode':<5} {'T':>5} {'peak MiB':>10} {'saved MiB':>10} {'core saved MiB':>15} {'init state MiB':>15}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['mode']:<5} {r['unroll']:>5} {r['peak_mib']:>10.2f} {r['saved_mib']:>10.2f} "
              f"{r['core_saved_mib']:>15.2f} {r['state_mib']:>15.2f}")
    summary = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: slope(mine, k) * 1024 for k in ("peak_mib", "saved_mib", "core_saved_mib")}
        print(f"{mode}: KiB per unroll step: peak {summary[mode]['peak_mib']:.1f}, saved "
              f"{summary[mode]['saved_mib']:.1f}, core saved {summary[mode]['core_saved_mib']:.1f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "memory.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        (out / "memory.json").write_text(json.dumps({"rows": rows, "kib_per_step": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
