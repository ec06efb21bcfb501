"""Every memory core's speed on the CPU, side by side: the learner's update, the acting step, and
agent steps/s of real training (issue 53).

Two parts, each alternating the cores within a round (so a busy spell of the machine hits every
core alike) and reporting the median over the rounds:

- ``micro``: in this process, one torch thread (as the learner thread runs beside two env workers
  on two cores), the agent of each setting on a synthetic batch: one learner update (forward over
  T + 1 steps, the IMPALA loss, backward, RMSProp step) and one acting forward (T = 1, no autograd,
  a batch of every env of the setting), in ms;
- ``throughput``: ``fwrl bench throughput`` of each (setting, core) in its own process: agent steps/s,
  its ratio to the LSTM's in the same round, and from the learner thread's own shares the ms per
  update it spent busy and its idle share (near 0: learner-bound; the acting thread's forward share
  says how much acting costs).

``--kernels auto,reference`` runs every core on both paths of its rule (the CPU path, and the naive
reference that defined the maths and ran on the CPU before it), side by side in the same rounds.

    python benchmarks/cpu_cores.py --settings minatar quickstart pong --rounds 3 \\
        --out benchmarks/results/cpu_cores.md [--json-path ...] [--cores lstm,delta_net] [--part micro]

A run that fails (a window without updates) is recorded with its error and left out of the medians;
the tables and the JSON are written after every run, so a long benchmark keeps what it measured.

Settings (``SETTINGS``): ``minatar`` (Breakout, 2 workers x 8 envs, B 8, T 20: the MinAtar family
defaults), ``quickstart`` (``--preset quickstart``: memory:cue_delay, B 8, T 40), ``popgym`` (``--preset
popgym``: POPGym's RepeatFirst with the preset's workers, batch and unroll), ``pong`` (Atari Pong,
impala stem, 2 workers x 8 envs, B 8, T 50).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS: dict[str, list[str]] = {
    "minatar": ["--env", "minatar:breakout", "--num-workers", "2", "--envs-per-worker", "8",
                "--batch-size", "8", "--unroll-length", "20"],
    "quickstart": ["--preset", "quickstart"],
    "popgym": ["--preset", "popgym"],
    "pong": ["--env", "atari:Pong", "--stem", "impala", "--num-workers", "2", "--envs-per-worker", "8",
             "--batch-size", "8", "--unroll-length", "50"],
}
# (warm-up, measured) seconds per setting where the default window holds too few updates: Pong's impala
# stem on two cores makes an update of B 8 x T 50 every few seconds, and a slow core's first one later
WINDOWS = {"pong": (30.0, 30.0)}
CORES = ("feedforward", "lstm", "gru", "linear_transformer", "delta_net", "gated_delta_net", "rdn", "delta_rnn",
         "delta_lstm", "srwm", "fake_sr", "sr_delta_net", "elstm", "elstm:grad=rtrl")
BASELINE = "lstm"


def core_flags(spec: str) -> list[str]:
    """``name[:key=value...]`` as fwrl's flags: ``--core name --core-opt key=value ...``."""
    name, *options = spec.split(":")
    flags = ["--core", name]
    for option in options:
        flags += ["--core-opt", option]
    return flags


def _config(setting: str, spec: str):
    from fwrl.launch.cli import main  # noqa: F401  (registers the presets and flags)
    from fwrl.settings.config import build_config

    flags = SETTINGS[setting] + core_flags(spec)
    preset, overrides, i = None, {}, 0
    while i < len(flags):
        key, value = flags[i].removeprefix("--").replace("-", "_"), flags[i + 1]
        if key == "preset":
            preset = value
        elif key == "core_opt":
            overrides.setdefault("core_options", {}).update([value.split("=", 1)])
        else:
            overrides[key] = value
        i += 2
    return build_config(preset, overrides)


# --------------------------------------------------------------------------- micro


def _micro_case(setting: str, spec: str):
    """(update, act) closures for the agent of ``setting`` and core ``spec`` on synthetic data."""
    import torch

    from fwrl.agents.losses import impala_loss
    from fwrl.agents.optim import make_optimizer
    from fwrl.envs.registry import describe_env
    from fwrl.runner.agent import build_model, resolve_core_options

    config = _config(setting, spec)
    info = describe_env(config.env)
    config = resolve_core_options(config, info)
    torch.manual_seed(0)
    model = build_model(config, info)
    optimizer = make_optimizer(model.parameters(), lr=config.learning_rate)
    T, B, envs = config.unroll_length, config.batch_size, config.num_workers * config.envs_per_worker
    g = torch.Generator().manual_seed(0)

    def inputs(steps: int, columns: int) -> dict:
        obs = (torch.randint(0, 256, (steps, columns, *info.obs_shape), generator=g, dtype=torch.uint8)
               if info.obs_dtype == "uint8" else torch.randn(steps, columns, *info.obs_shape, generator=g))
        batch = {"obs": obs, "reward": torch.randn(steps, columns, generator=g),
                 "done": torch.rand(steps, columns, generator=g) < 0.02}
        if info.extra_size:
            batch["obs_extra"] = torch.randn(steps, columns, info.extra_size, generator=g)
        return batch

    batch = inputs(T + 1, B)
    batch.update(action=torch.randint(info.num_actions, (T + 1, B), generator=g),
                 policy_logits=torch.randn(T + 1, B, info.num_actions, generator=g),
                 baseline=torch.zeros(T + 1, B))
    state = model.initial_state(B)
    step, step_state = inputs(1, envs), model.initial_state(envs)

    def update() -> None:
        outputs, _ = model(batch, state)
        loss, _ = impala_loss(outputs, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def act(core_step=None) -> None:
        """One acting step; ``core_step`` stands in for the core (``fwrl.agents.traced_core``)."""
        with torch.no_grad():
            model(step, step_state, **({"core_step": core_step} if core_step is not None else {}))

    act.core = model.core

    return update, act


def _timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def run_micro(settings: list[str], cores: list[str], kernels: list[str], rounds: int) -> list[dict]:
    import torch

    from fwrl.utils.allocator import keep_freed_memory

    torch.set_num_threads(1)
    keep_freed_memory()  # as fwrl train's learner process
    rows = []
    for setting in settings:
        cases = {}
        for spec in cores:
            for backend in kernels:
                os.environ["FWRL_KERNELS"] = backend
                cases[spec, backend] = _micro_case(setting, spec)
        times = {key: ([], []) for key in cases}
        for round_ in range(rounds):
            for (spec, backend), (update, act) in cases.items():
                os.environ["FWRL_KERNELS"] = backend
                times[spec, backend][0].append(_timed(update, 5))
                times[spec, backend][1].append(_timed(act, 30))
            print(f"micro {setting}: round {round_ + 1} / {rounds}", file=sys.stderr, flush=True)
        for (spec, backend), (updates, acts) in times.items():
            rows.append({"setting": setting, "core": spec, "kernels": backend,
                         "update_ms": statistics.median(updates), "act_ms": statistics.median(acts),
                         "update_ms_all": updates, "act_ms_all": acts})
    os.environ.pop("FWRL_KERNELS", None)
    return rows


# --------------------------------------------------------------------------- throughput


def _throughput(setting: str, spec: str, backend: str, process: str, trace: str, seconds: float,
                warmup: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        command = [sys.executable, "-m", "fwrl.launch.cli", "bench", "throughput", *SETTINGS[setting],
                   *core_flags(spec), "--seconds", str(seconds), "--warmup", str(warmup),
                   "--ceiling-seconds", "0", "--json-path", str(out), "--learner-process", process,
                   "--acting-trace", trace]
        done = subprocess.run(command, env={**os.environ, "FWRL_KERNELS": backend}, capture_output=True,
                              text=True)
        if done.returncode != 0 or not out.exists():  # recorded, not fatal: the other runs go on
            lines = [line for line in done.stderr.splitlines() if line.startswith("fwrl: error")]
            return {"error": (lines[-1] if lines else done.stderr[-300:]).strip()}
        record = json.loads(out.read_text())
    learner = record["thread_shares"]["learner"]
    acting = record["thread_shares"]["acting"]
    busy = 1.0 - learner["learner_idle"]
    return {"steps_per_second": record["steps_per_second"], "updates": record["updates"],
            "seconds": record["seconds"], "learner_idle": learner["learner_idle"],
            "learner_ms_per_update": busy * record["seconds"] / max(record["updates"], 1) * 1e3,
            "acting_forward_share": acting["inference_forward"]}


def run_throughput(settings: list[str], cores: list[str], kernels: list[str], rounds: int, seconds: float | None,
                   warmup: float | None, save=lambda rows: None, processes: tuple[str, ...] = ("auto",),
                   traces: tuple[str, ...] = ("auto",)) -> list[dict]:
    """``seconds`` / ``warmup`` None: the setting's own window (:data:`WINDOWS`, else 10 s after 8 s).
    ``processes`` / ``traces``: the ``--learner-process`` / ``--acting-trace`` values each (core, kernels)
    runs with, alternated too.
    ``save(rows)`` is called after every run with the rows so far (a long benchmark keeps what it has)."""
    rows = []
    for setting in settings:
        own_warmup, own_seconds = WINDOWS.get(setting, (8.0, 10.0))
        window = (own_seconds if seconds is None else seconds, own_warmup if warmup is None else warmup)
        runs: dict[tuple[str, str, str, str], list[dict]] = {(s, b, p, t): [] for s in cores for p in processes
                                                             for t in traces for b in kernels}
        for round_ in range(rounds):
            for (spec, backend, process, trace), results in runs.items():
                results.append(_throughput(setting, spec, backend, process, trace, *window))
                said = results[-1].get("error") or f"{results[-1]['steps_per_second']:,.0f} agent steps/s"
                print(f"throughput {setting} round {round_ + 1} / {rounds}: {spec} ({backend}, learner process "
                      f"{process}, acting trace {trace}) {said}", file=sys.stderr, flush=True)
                save(rows + _rows(setting, runs, kernels, window))
        rows += _rows(setting, runs, kernels, window)
    return rows


def _rows(setting: str, runs: dict, kernels: list[str], window: tuple[float, float]) -> list[dict]:
    """Medians over each (core, kernels, learner process, acting trace)'s measured rounds, and the median of
    its per-round ratios to the LSTM's with the same learner process and acting trace (rounds where either
    failed left out)."""
    rows = []
    for (spec, backend, process, trace), results in runs.items():
        baseline = runs.get((BASELINE, kernels[0], process, trace), [])
        ok = [r for r in results if "error" not in r]
        row = {"setting": setting, "core": spec, "kernels": backend, "learner_process": process, "acting_trace": trace,
               "seconds": window[0], "warmup": window[1], "rounds": results, "measured_rounds": len(ok)}
        for key in ("steps_per_second", "learner_ms_per_update", "learner_idle", "acting_forward_share"):
            row[key] = statistics.median(r[key] for r in ok) if ok else None
        pairs = [(r, b) for r, b in zip(results, baseline) if "error" not in r and "error" not in b]
        if pairs:  # the ratio to the LSTM of the same round, then the median of the ratios
            row["ratio_to_lstm"] = statistics.median(r["steps_per_second"] / b["steps_per_second"] for r, b in pairs)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- report


def markdown(micro: list[dict], throughput: list[dict], args: argparse.Namespace) -> str:
    lines = [f"# Memory cores on the CPU ({time.strftime('%Y-%m-%d')})", "",
             f"`python benchmarks/cpu_cores.py {' '.join(sys.argv[1:])}`", "",
             f"Medians of {args.rounds} rounds, the cores alternated within each round. "
             f"FWRL_KERNELS: auto = each rule's CPU path, reference = the naive PyTorch reference.", ""]
    if micro:
        lines += ["## Learner update and acting step (one torch thread, synthetic data)", "",
                  "| setting | core | kernels | update ms | act ms |", "|---|---|---|---|---|"]
        lines += [f"| {r['setting']} | {r['core']} | {r['kernels']} | {r['update_ms']:.1f} | {r['act_ms']:.2f} |"
                  for r in micro]
        lines.append("")
    if throughput:
        windows = ", ".join(f"{setting} {seconds:g} s after {warmup:g} s of warm-up" for setting, seconds, warmup
                            in dict.fromkeys((r["setting"], r["seconds"], r["warmup"]) for r in throughput))
        lines += [f"## Training throughput (`fwrl bench throughput`: {windows})", "",
                  "| setting | core | kernels | learner process | acting trace | agent steps/s | x lstm | "
                  "learner ms / update | learner idle | acting forward share |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in throughput:
            if r["steps_per_second"] is None:
                errors = {x["error"] for x in r["rounds"] if "error" in x}
                lines.append(f"| {r['setting']} | {r['core']} | {r['kernels']} | {r['learner_process']} | "
                             f"{r['acting_trace']} | failed: {'; '.join(errors)[:200]} | | | | |")
                continue
            ratio = f"{r['ratio_to_lstm']:.2f}" if "ratio_to_lstm" in r else ""
            rounds = "" if r["measured_rounds"] == len(r["rounds"]) else f" ({r['measured_rounds']} rounds)"
            lines.append(f"| {r['setting']} | {r['core']} | {r['kernels']} | {r['learner_process']} | "
                         f"{r['acting_trace']} | {r['steps_per_second']:,.0f}{rounds} | "
                         f"{ratio} | {r['learner_ms_per_update']:.0f} | {r['learner_idle']:.0%} | "
                         f"{r['acting_forward_share']:.0%} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--cores", default=",".join(CORES), help="comma-separated name[:key=value] specs")
    parser.add_argument("--kernels", default="auto", help="comma-separated FWRL_KERNELS values: auto, reference")
    parser.add_argument("--learner-process", default="auto",
                        help="throughput: comma-separated --learner-process values to alternate (auto, on, off)")
    parser.add_argument("--acting-trace", default="auto",
                        help="throughput: comma-separated --acting-trace values to alternate (auto, on, off)")
    parser.add_argument("--part", choices=("micro", "throughput", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=None,
                        help="throughput: measured seconds per run (default: 10, pong 30)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="throughput: warm-up seconds per run (default: 8, pong 30)")
    parser.add_argument("--out", type=Path, help="write the markdown tables here")
    parser.add_argument("--json-path", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    from fwrl.memory_modules import core_names

    cores = [c.strip() for c in args.cores.split(",") if c.strip()]
    known = set(core_names())
    unknown = [c for c in cores if c.split(":")[0] not in known]
    if unknown:
        parser.error(f"unknown core {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    bad = [k for k in kernels if k not in ("auto", "reference", "cpu")]
    if bad or args.rounds < 1:
        parser.error(f"bad --kernels {', '.join(bad)} (valid: auto, reference, cpu) or --rounds {args.rounds}")
    processes = tuple(p.strip() for p in args.learner_process.split(",") if p.strip())
    if not processes or set(processes) - {"auto", "on", "off"}:
        parser.error(f"bad --learner-process {args.learner_process!r} (valid: auto, on, off, comma-separated)")
    traces = tuple(t.strip() for t in args.acting_trace.split(",") if t.strip())
    if not traces or set(traces) - {"auto", "on", "off"}:
        parser.error(f"bad --acting-trace {args.acting_trace!r} (valid: auto, on, off, comma-separated)")

    def save(micro: list[dict], throughput: list[dict]) -> str:
        text = markdown(micro, throughput, args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        if args.json_path:
            args.json_path.parent.mkdir(parents=True, exist_ok=True)
            args.json_path.write_text(json.dumps({"argv": sys.argv[1:], "micro": micro, "throughput": throughput},
                                                 indent=1) + "\n")
        return text

    micro = run_micro(args.settings, cores, kernels, args.rounds) if args.part in ("micro", "both") else []
    save(micro, [])
    throughput = (run_throughput(args.settings, cores, kernels, args.rounds, args.seconds, args.warmup,
                                 save=lambda rows: save(micro, rows), processes=processes, traces=traces)
                  if args.part in ("throughput", "both") else [])
    print(save(micro, throughput))
    return 0


if __name__ == "__main__":
    sys.exit(main())
