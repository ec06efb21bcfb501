"""The ``fwrl`` command line: train, info, bench (and evaluate, plot where installed).

User errors (:class:`fwrl.errors.FwrlError`) print one paragraph and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from fwrl.errors import FwrlError

# command name -> (module, function adding the subparser)
_COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {}


def command(func: Callable[[argparse._SubParsersAction], None]):
    _COMMANDS[func.__name__.removeprefix("add_")] = func
    return func


def parse_key_values(items: Sequence[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise FwrlError(f"{what} {item!r} is not KEY=VALUE.")
        out[key] = value
    return out


# ----------------------------------------------------------------------------- train

_TRAIN_FLAGS = {
    # flag: (config key, type, help)
    "--env": ("env", str, "env spec, e.g. atari:Pong, memory:cue_delay?delay=10"),
    "--core": ("core", str, "memory core (fwrl info --cores lists them)"),
    "--stem": ("stem", str, "vision stem: impala, nature, mlp or auto"),
    "--backend": ("backend", str, "env worker backend: local (default) or ray"),
    "--ray-address": ("ray_address", str, "Ray cluster address (auto or HOST:PORT)"),
    "--num-workers": ("num_workers", int, "env worker processes (actors)"),
    "--envs-per-worker": ("envs_per_worker", int, "envs stepped by each worker"),
    "--batch-size": ("batch_size", int, "rollouts per learner update"),
    "--unroll-length": ("unroll_length", int, "steps per rollout (T)"),
    "--total-steps": ("total_steps", int, "agent steps to train for"),
    "--max-seconds": ("max_seconds", float, "stop after this many seconds (0: no limit)"),
    "--learning-rate": ("learning_rate", float, "RMSProp learning rate (decays linearly to 0)"),
    "--entropy-cost": ("entropy_cost", float, "entropy regularisation weight"),
    "--discount": ("discount", float, "discount factor gamma"),
    "--device": ("device", str, "auto, cpu, cuda or cuda:N"),
    "--num-threads": ("num_threads", int, "torch threads (0: all cores)"),
    "--seed": ("seed", int, "random seed"),
    "--checkpoint-interval": ("checkpoint_interval", float, "seconds between checkpoint writes"),
    "--milestone-interval": ("milestone_interval", int, "agent steps between kept checkpoints"),
    "--log-interval": ("log_interval", float, "seconds between metrics rows"),
    "--load-vision-from": ("load_vision_from", str, "checkpoint whose vision stem to load (R2AC)"),
    "--eval-every": ("eval_every", int, "agent steps between evaluations written to metrics.csv (0: none)"),
    "--eval-episodes": ("eval_episodes", int, "episodes per task and split of each --eval-every evaluation"),
}


@command
def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an agent", description="Train an IMPALA agent.")
    p.add_argument("--preset", help="start from a preset (fwrl info --presets lists them)")
    p.add_argument("--name", help="run name (default: derived from env and core)")
    p.add_argument("--runs-dir", default="runs", help="folder holding runs (default: runs)")
    p.add_argument("--resume", action="store_true", help="continue the run --name from its checkpoint")
    for flag, (key, typ, help_text) in _TRAIN_FLAGS.items():
        p.add_argument(flag, dest=key, type=str, default=None, help=help_text)
    p.add_argument("--core-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="core option, repeatable (e.g. --core-opt num_layers=4)")
    p.add_argument("--elstm-grad", choices=("bptt", "rtrl"), help="eLSTM training: truncated BPTT or exact RTRL")
    p.add_argument("--freeze-vision", action="store_true", default=None, help="do not train the vision stem")
    p.add_argument("--sticky-actions", action="store_true", help="Atari: repeat_action_probability 0.25")
    p.add_argument("--full-action-space", action="store_true", help="Atari: all 18 actions")
    p.set_defaults(run=run_train)


def _train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {key: getattr(args, key) for key, _, _ in _TRAIN_FLAGS.values()
                                 if getattr(args, key) is not None}
    core_options: dict[str, Any] = parse_key_values(args.core_opt, "--core-opt")
    if args.elstm_grad:
        core_options["grad"] = args.elstm_grad
    if core_options:
        overrides["core_options"] = core_options
    if args.freeze_vision:
        overrides["freeze_vision"] = True
    atari_opts = {}
    if args.sticky_actions:
        atari_opts["sticky"] = "true"
    if args.full_action_space:
        atari_opts["full_action_space"] = "true"
    if atari_opts:
        overrides["_atari_opts"] = atari_opts
    return overrides


def _apply_atari_flags(config, atari_opts: dict[str, str]):
    from fwrl.envs.spec import parse_env_spec

    spec = parse_env_spec(config.env)
    if spec.family != "atari":
        raise FwrlError(f"--sticky-actions and --full-action-space apply to atari envs, not {config.env!r}.")
    config.env = spec.with_options(**atari_opts).text
    return config


def run_train(args: argparse.Namespace) -> int:
    from fwrl.launch.config import build_config, check_resume, read_config
    from fwrl.launch.rundir import prepare_run_dir
    from fwrl.launch.train import train

    overrides = _train_overrides(args)
    atari_opts = overrides.pop("_atari_opts", None)
    if args.resume:
        if not args.name:
            raise FwrlError("--resume needs --name of the run to continue.")
        run_dir = prepare_run_dir(Path(args.runs_dir) / args.name, resume=True)
        if args.preset:
            raise FwrlError("--resume continues a run with its saved config; do not pass --preset.")
        config = check_resume(read_config(run_dir / "config.yaml"), overrides)
    else:
        config = build_config(args.preset, overrides)
        if atari_opts:
            config = _apply_atari_flags(config, atari_opts)
        name = args.name or _default_name(config)
        run_dir = prepare_run_dir(Path(args.runs_dir) / name, resume=False)
    _validate(config)
    result = train(config, run_dir, resume=args.resume)
    print(
        f"run {run_dir}: {result.agent_steps:,} agent steps, {result.updates} updates, "
        f"{result.episodes} episodes, mean return {result.mean_return:.3g}"
        + (f", success {result.mean_success:.3f}" if result.mean_success == result.mean_success else "")
        + f" (stopped by {result.stopped_by}); checkpoint {run_dir / 'checkpoint.pt'}"
    )
    return 0 if result.stopped_by != "error" else 1


def _default_name(config) -> str:
    import re

    env = re.sub(r"[^A-Za-z0-9]+", "-", config.env.split("?")[0]).strip("-")
    return f"{env}-{config.core}"


def _validate(config) -> None:
    """Check env, core, stem and options before any process starts."""
    from fwrl.agents.model import STEMS
    from fwrl.envs.registry import resolve
    from fwrl.errors import unknown_choice
    from fwrl.memory_modules import build_core

    resolve(config.env)
    build_core(config.core, 257, config.core_options)
    if config.stem not in (*STEMS, "auto"):
        raise unknown_choice("vision stem", config.stem, (*STEMS, "auto"))
    for key in ("num_workers", "envs_per_worker", "batch_size", "unroll_length", "total_steps"):
        if getattr(config, key) < 1:
            raise FwrlError(f"{key} must be at least 1, got {getattr(config, key)}.")


# ----------------------------------------------------------------------------- info

@command
def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="cores, presets, envs, and a model's parameter table")
    p.add_argument("--env", help="env spec whose model to describe")
    p.add_argument("--core", default="lstm")
    p.add_argument("--core-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--stem", default="auto")
    p.add_argument("--cores", action="store_true", help="list the memory cores")
    p.add_argument("--presets", action="store_true", help="list the presets")
    p.set_defaults(run=run_info)


def run_info(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if args.cores or (not args.env and not args.presets):
        from fwrl.memory_modules import core_names
        from fwrl.memory_modules.base import core_config_class, core_summary

        table = Table("core", "options", "summary", title="memory cores")
        for name in core_names():
            table.add_row(name, ", ".join(core_config_class(name).option_names()), core_summary(name))
        console.print(table)
    if args.presets:
        from fwrl.launch.config import load_preset, preset_names

        table = Table("preset", "env", "core", title="presets")
        for name in preset_names():
            data = load_preset(name)
            table.add_row(name, str(data.get("env", "")), str(data.get("core", "")))
        console.print(table)
    if args.env:
        from fwrl.agents.model import AgentNet, count_parameters, layer_table
        from fwrl.envs.registry import describe_env

        info = describe_env(args.env)
        model = AgentNet(info.obs_shape, info.num_actions, args.core,
                         parse_key_values(args.core_opt, "--core-opt"),
                         None if args.stem == "auto" else args.stem)
        table = Table("module", "parameters", title=f"{args.env} / {args.core} / {model.stem_name} stem")
        for name, n in layer_table(model):
            table.add_row(name, f"{n:,}")
        table.add_row("total", f"{count_parameters(model):,}", style="bold")
        console.print(table)
        console.print(f"observations {info.obs_shape} {info.obs_dtype}, {info.num_actions} actions, "
                      f"tasks: {', '.join(info.task_names)}")
    return 0


# ----------------------------------------------------------------------------- bench

@command
def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: throughput, envs, kernels")
    bsub = p.add_subparsers(dest="bench", required=True)
    t = bsub.add_parser("throughput", help="agent steps/s of a short training run")
    t.add_argument("--env", default="atari:Pong")
    t.add_argument("--core", default="lstm")
    t.add_argument("--stem", default="nature")
    t.add_argument("--num-workers", type=int, default=4)
    t.add_argument("--envs-per-worker", type=int, default=1)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--unroll-length", type=int, default=80)
    t.add_argument("--num-threads", type=int, default=0)
    t.add_argument("--seconds", type=float, default=60.0, help="measured time after warm-up")
    t.add_argument("--warmup", type=float, default=15.0)
    t.set_defaults(run=_bench("throughput"))
    e = bsub.add_parser("envs", help="raw env steps/s through the worker layer")
    e.add_argument("--env", default="atari:Pong")
    e.add_argument("--num-workers", type=int, default=2)
    e.add_argument("--envs-per-worker", type=int, default=1)
    e.add_argument("--seconds", type=float, default=20.0)
    e.add_argument("--backend", default="local", choices=("local", "ray"), help="env worker backend: local (default) or ray")
    e.add_argument("--ray-address", default="auto",
                   help="with --backend ray: auto (running cluster), HOST:PORT, or local (private Ray)")
    e.set_defaults(run=_bench("envs"))
    k = bsub.add_parser("kernels", help="fast-weight kernel timings (needs a GPU); --help lists its options",
                        add_help=False)
    # its options belong to fwrl.kernels.benchmark, which parses them (see main)
    k.set_defaults(run=_bench("kernels"), passes_unknown_args=True)


def _bench(name: str):
    def run(args: argparse.Namespace) -> int:
        from fwrl.launch import bench

        return getattr(bench, f"bench_{name}")(args)

    return run


# ----------------------------------------------------------------------------- evaluate

@command
def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="play test episodes; JSON + table of scores",
                       description="Evaluate a run (its checkpoint.pt) or a checkpoint file with the "
                                   "protocol of its env family (REFERENCE.md section 5).")
    p.add_argument("source", help="run folder or checkpoint file")
    p.add_argument("--env", help="env spec to evaluate on (default: the run's env)")
    p.add_argument("--episodes", type=int, help="episodes per task, split and repeat "
                   "(default: atari 30, procgen 200, dmlab 100, others 100)")
    p.add_argument("--repeats", type=int, help="repeats (default: atari 5, dmlab 3, others 1)")
    p.add_argument("--policy", choices=("greedy", "sample"), default="greedy", help="argmax or sampled actions")
    p.add_argument("--splits", help="comma-separated splits to run (procgen: train,test_1000,test_1200,test_1400)")
    p.add_argument("--num-workers", type=int, help="env worker processes (default: CPU cores, at most 8)")
    p.add_argument("--envs-per-worker", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu (default), auto, cuda or cuda:N")
    p.add_argument("--backend", default="local", help="env worker backend: local or ray")
    p.add_argument("--ray-address", default="auto")
    p.add_argument("--step-timeout", type=float, default=60.0)
    p.add_argument("--out", help="JSON path (default: <run>/evaluation.json or <checkpoint>.eval.json); "
                   "the markdown table goes beside it")
    p.set_defaults(run=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    from fwrl.launch import evaluate as ev
    from fwrl.launch.agent import load_agent, pick_device
    from fwrl.launch.eval_protocols import default_num_workers
    from fwrl.launch.eval_report import print_table, write_result

    device = pick_device(args.device)
    model, payload, path = load_agent(Path(args.source), device)
    config = payload["config"]
    env = args.env or config["env"]
    if args.env:
        ev.check_env_fits(env, model)
    num_workers = args.num_workers or default_num_workers(env)
    if num_workers < 1 or args.envs_per_worker < 1:
        raise FwrlError(f"--num-workers and --envs-per-worker must be at least 1, got {num_workers} "
                        f"and {args.envs_per_worker}.")
    splits = [s.strip() for s in args.splits.split(",") if s.strip()] if args.splits else None
    result = ev.evaluate(
        model, env, episodes=args.episodes, repeats=args.repeats, greedy=args.policy == "greedy", splits=splits,
        num_workers=num_workers, envs_per_worker=args.envs_per_worker, seed=args.seed, device=device,
        backend=args.backend, step_timeout=args.step_timeout, core=config["core"],
        core_options=config.get("core_options", {}), unroll_length=config.get("unroll_length"),
        backend_options={"address": args.ray_address} if args.backend == "ray" else None,
    )
    result = {"checkpoint": str(path), "agent_steps": int(payload.get("agent_steps", 0)), **result}
    if args.out:
        out = Path(args.out)
    else:
        out = Path(args.source) / "evaluation.json" if Path(args.source).is_dir() else path.with_suffix(".eval.json")
    print_table(result)
    md = write_result(result, out)
    print(f"wrote {out} and {md}")
    return 0


# ----------------------------------------------------------------------------- plot

@command
def add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="learning curves of runs to a PNG",
                       description="Plot a metric of metrics.csv against agent steps, runs overlaid.")
    p.add_argument("runs", nargs="+", help="run folders (or metrics.csv files)")
    p.add_argument("--metric", default="mean_return", help="metrics.csv column (default: mean_return)")
    p.add_argument("--by", choices=("run", "task"), default="run",
                   help="task: one panel per task of multi-task runs (columns return/<task>)")
    p.add_argument("--smooth", type=int, default=1, help="moving average over K points")
    p.add_argument("--out", help="PNG path (default: <run>/<metric>.png for one run, ./<metric>.png for several)")
    p.add_argument("--size", default="1200x800", help="WIDTHxHEIGHT in pixels")
    p.set_defaults(run=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    import matplotlib.pyplot as plt

    from fwrl.launch.plot import default_out, parse_size, plot_runs

    runs = [Path(r) for r in args.runs]
    out = Path(args.out) if args.out else default_out(runs, args.metric)
    fig = plot_runs(runs, args.metric, args.by, args.smooth, out, parse_size(args.size))
    plt.close(fig)
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fwrl", description="IMPALA agents with fast-weight memories.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in _COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from fwrl.envs.quiet import silence_env_noise

    silence_env_noise()
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "passes_unknown_args", False):
        args.rest = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except FwrlError as exc:
        print(f"fwrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fwrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
