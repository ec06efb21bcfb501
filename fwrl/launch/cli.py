"""The ``fwrl`` command line: train, evaluate, inspect, plot, info, bench, sweep, report.

Flags are generated from the settings models of ``fwrl.settings.config``
(``fwrl.launch.flags``), so each setting has one type, default, range and
help. Every command checks all of its input before it starts a process or
writes a file. User errors (:class:`fwrl.errors.FwrlError`, and argparse's
own) print ``fwrl: error: ...`` (one paragraph) and exit 2; an operating-system error left over
(a full disk, a read-only or removed folder) prints one line naming the path and exits 74
(``EX_IOERR`` of sysexits.h); a stop signal N exits 128 + N (130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from fwrl.errors import FwrlError
from fwrl.launch.exits import EXIT_OS_ERROR, end_process, interrupted
from fwrl.settings.config import BenchConfig, EvaluateConfig, InspectConfig, PlotConfig, TrainConfig
from fwrl.launch.flags import add_setting_flags, add_train_config_flags, given_settings, parse_key_values

_IMPORTED = time.monotonic()  # python -m fwrl.launch.cli: fwrl's start (the fwrl script passes its own)
_COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {}

# fwrl info --probe: the most envs the init probe acts (in its own process, one after another)
PROBE_MAX_BATCH = 1024
# fwrl bench throughput: its own defaults where no --preset or --config is given; flags override them
BENCH_THROUGHPUT_DEFAULTS = {"env": "atari:Pong", "core": "lstm", "num_workers": 4, "envs_per_worker": 1,
                             "batch_size": 8, "unroll_length": 80}
# the stem of the bench's own env (Pong); with --env the stem is picked as fwrl train picks it (auto)
BENCH_THROUGHPUT_STEM = "nature"
# settings bench throughput sets itself (a measuring window, no checkpoints)
BENCH_THROUGHPUT_FIXED = ("total_steps", "max_seconds", "log_interval", "log_every_steps", "checkpoint_interval")
BENCH_ENVS_DEFAULTS = {"env": "atari:Pong", "num_workers": 2, "envs_per_worker": 1}


_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


# flags whose repeat is refused (see _Parser._refuse_repeats): each names one layer of settings
LAYERED_FLAGS = ("preset", "config", "grid")


class UsageError(FwrlError):
    """A command line argparse cannot read (unknown flag, missing value)."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as FwrlError: ``fwrl: error: ...``, exit status 2, from ``main``.

    A value that looks like a negative number (``-1e-3``, ``-inf``) is a value, not a flag,
    so the setting's own check can say what is wrong with it.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)  # --total-step is not --total-steps: a typo is an error
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_known_args(self, args=None, namespace=None):
        if args is not None:
            self._refuse_repeats(list(args))
        namespace, unknown = super().parse_known_args(args, namespace)
        if unknown and args is not None:
            self._refuse_values_of_switches(list(args), unknown)
        return namespace, unknown

    def _option_action(self, token: str):
        """The action of option ``token`` (``--flag`` or ``--flag=value``) of this parser, or None."""
        if not token.startswith("-") or token == "--" or self._negative_number_matcher.match(token):
            return None
        return self._option_string_actions.get(token.split("=", 1)[0])

    def _refuse_repeats(self, args: list[str]) -> None:
        """A flag naming a layer of settings given twice (``--preset a --preset b``, ``--config``, ``--grid``)
        reads as if both layers counted, where argparse would keep the last silently: an error. Other flags
        given twice keep the command line's usual rule, the last wins (``$BASE --num-workers 2``, a sweep's
        ``--total-steps 200 ... --total-steps 300``)."""
        seen: dict[int, list[str]] = {}
        for i, token in enumerate(args):
            if token == "--":
                break
            action = self._option_action(token)
            if action is None or action.dest not in LAYERED_FLAGS:
                continue
            if "=" in token:
                given = token
            elif action.nargs == 0:
                given = token
            else:
                values = []
                for value in args[i + 1:]:
                    if self._option_action(value) is not None or value == "--":
                        break
                    values.append(value)
                    if action.nargs in (None, "?"):
                        break
                given = " ".join([token, *values])
            seen.setdefault(id(action), []).append(given)
            if len(seen[id(action)]) == 2:
                first, second = seen[id(action)]
                raise UsageError(f"{action.option_strings[0]} is given twice ({first}, then {second}); the last would "
                                 f"win silently: give it once (see {self.prog} --help)")

    def _refuse_values_of_switches(self, args: list[str], unknown: list[str]) -> None:
        """A value after a flag that takes none (``--freeze-vision yes``): say so, rather than 'unrecognized'."""
        for i, token in enumerate(args[1:], start=1):
            if token not in unknown:
                continue
            action = self._option_action(args[i - 1])
            if action is not None and action.nargs == 0 and "=" not in args[i - 1]:
                flag = args[i - 1]
                off = (f", {action.option_strings[1]} turns it off" if isinstance(action, argparse.BooleanOptionalAction)
                       and len(action.option_strings) > 1 else "")
                raise UsageError(f"{flag} takes no value (got {token!r}): {action.option_strings[0]} alone turns it on"
                                 f"{off} (see {self.prog} --help)")


def command(func: Callable[[argparse._SubParsersAction], None]):
    _COMMANDS[func.__name__.removeprefix("add_")] = func
    return func


# ----------------------------------------------------------------------------- train

@command
def add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train an agent", description="Train an IMPALA agent. Settings come "
                       "from the defaults, then --preset, then --config, then flags.")
    p.add_argument("--name", help="run name (default: from env and core, with -2, -3, ... if that run exists)")
    p.add_argument("--runs-dir", default="runs", help="folder holding runs (default runs)")
    p.add_argument("--resume", action="store_true", help="continue the run --name from its checkpoint")
    p.add_argument("--accept-config-edits", action="store_true",
                   help="with --resume: train on the run's config.yaml where it was edited since the checkpoint in a "
                        "setting that defines the model or the learning problem (refused without this flag; "
                        "recorded in the run's config-edits.log)")
    add_train_config_flags(p)
    p.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from fwrl.settings.config import check_resume, config_yaml, read_config
    from fwrl.launch.flags import check_elstm_grad, check_ray_address, train_config_from_args, train_overrides
    from fwrl.runner.rundir import RunDir

    # input first (a misspelt env or core, a missing library, a bad value: said before torch is imported)
    if not str(args.runs_dir).strip():
        raise FwrlError(f"--runs-dir {args.runs_dir!r} names no folder: give the folder that holds runs (default runs).")
    if args.accept_config_edits and not args.resume:
        raise FwrlError("--accept-config-edits applies to --resume only (a new run has no checkpoint to compare with).")
    if args.resume:
        if not args.name:
            raise FwrlError("--resume needs --name of the run to continue.")
        if args.preset or args.config:
            raise FwrlError("--resume continues a run with its saved config; do not pass --preset or --config.")
        folder = RunDir(Path(args.runs_dir) / _run_name(args.name))
        folder.check(resume=True)
        run_dir = folder.path
        saved = read_config(folder.config_file)
        check_elstm_grad(args, saved.core)
        config = check_resume(saved, train_overrides(args))
    else:
        config = train_config_from_args(args, check_env=not args.print_config)
        run_dir = None
        _say_family_defaults(args)
    check_ray_address(train_overrides(args), config.backend)
    if args.print_config:
        print(config_yaml(config), end="")
        return 0
    if config.wandb:  # the package and, online, a login: said before torch is imported
        from fwrl.runner.tracking import check_wandb

        check_wandb()
    if config.video_every > 0:  # the encoder and the env's frames
        from fwrl.evaluation.video import check_video

        check_video(config.env, None, config.env_wrappers)

    from fwrl.agents.distributed import ranks_from_env
    from fwrl.runner.preflight import check_runnable

    ranks = ranks_from_env()  # set by torchrun, SLURM, or fwrl train --learners in the rank processes
    if run_dir is None:
        if args.name is not None:  # given: it must be a name, '' included
            run_dir = Path(args.runs_dir) / _run_name(args.name)
        elif ranks.distributed:  # every rank must find the same folder: no -2, -3 suffixes here
            run_dir = Path(args.runs_dir) / _default_name(config)
        else:  # a name of its own: the same command twice makes two runs
            run_dir = _unused_run_dir(Path(args.runs_dir), _default_name(config))
    folder = RunDir(run_dir)
    folder.check(resume=args.resume)
    check_runnable(config, resume=args.resume)
    if args.resume:  # a run at its budget would train nothing: say how to give it more, write nothing
        folder.check_budget_left(config.total_steps)
    if config.learners > 1 and not ranks.distributed:  # start the ranks; each runs this command again
        from fwrl.runner.learner_ranks import launch_learners

        argv = list(args.argv) + ([] if args.name else ["--name", run_dir.name])
        print(f"fwrl train: {config.learners} learner ranks, run folder {run_dir}", file=sys.stderr)
        return launch_learners(config.learners, argv)
    tracker = None
    failed = True
    try:
        # the writer (rank 0) takes the folder's lock before anything is written or cleaned in it
        folder.open(resume=args.resume, writer=ranks.is_main)

        from fwrl.runner.train_progress import Progress
        from fwrl.runner.slow_start import SlowStartHint
        from fwrl.runner.train import train

        if config.wandb and ranks.is_main:  # its W&B run, started (or continued) before the run starts
            from fwrl.runner.tracking import WandbTracker

            tracker = WandbTracker(run_dir, config.to_dict(), project=config.wandb_project, group=config.wandb_group,
                                   resume=args.resume)
        # the run's progress display; a slow first update says what to change
        progress = SlowStartHint(Progress(config, run_dir), config) if ranks.is_main else None
        result = train(config, run_dir, resume=args.resume, progress=progress, started=args.started,
                       accept_config_edits=args.accept_config_edits, tracker=tracker)
        failed = result.stopped_by == "error"
    except BaseException:  # refused or interrupted before the run had a checkpoint: leave no empty folder
        if tracker is not None:  # W&B's files closed before the folder may go
            tracker.close(failed=True)
            tracker = None
        folder.discard_unused()  # a new run's folder, where only this process wrote into it
        raise
    finally:
        if tracker is not None:
            tracker.close(failed=failed)
        folder.close()
    if ranks.is_main:
        from fwrl.runner.budget import Budget

        per_update = Budget.of(config, ranks.world_size).steps_per_update
        print(f"run {run_dir}: {_result_text(result, config, per_update)}; checkpoint {run_dir / 'checkpoint.pt'}"
              + (f"; {ranks.world_size} learner ranks" if ranks.distributed else ""))
    if result.signal:  # the shell's convention: 128 + the signal (130 after Ctrl-C, 143 after SIGTERM)
        return 128 + result.signal
    return 0 if result.stopped_by != "error" else 1


def _say_family_defaults(args: argparse.Namespace) -> None:
    """Say which settings a new run took from its env family's defaults (the learning suite's), if any."""
    from fwrl.settings.config import PER_CORE, env_and_core, layered_settings, load_preset
    from fwrl.settings.family_defaults import describe, family_defaults
    from fwrl.launch.flags import train_overrides

    settings = layered_settings(args.preset, train_overrides(args), args.config, family=False)
    env, core = env_and_core(settings)
    added = family_defaults(settings, env, core)
    if added:
        print(f"fwrl train: {describe(added, env, core)}", file=sys.stderr)
    own = (load_preset(args.preset).get(PER_CORE) or {}).get(core) if args.preset else None
    own = {key: value for key, value in (own or {}).items() if settings.get(key) == value}  # a flag may win
    if own:
        values = ", ".join(f"{key} {value}" for key, value in own.items())
        print(f"fwrl train: the {args.preset} preset's settings for {core} (its per_core): {values}; a flag or "
              "--config sets them otherwise", file=sys.stderr)
    if float(settings.get("max_seconds") or 0) > 0 and "total_steps" not in {**settings, **added}:
        default = TrainConfig.model_fields["total_steps"].default
        print(f"fwrl train: the learning rate decays to 0 over --total-steps ({default:,} agent steps, the "
              "default), not over the --max-seconds limit; to anneal within the limit, set --total-steps to the "
              "steps it allows (fwrl bench throughput measures the rate).", file=sys.stderr)


def _result_text(result, config: TrainConfig, steps_per_update: int) -> str:
    """The final line's account of a run: steps against the budget, updates, episodes, how it stopped."""
    import math

    from fwrl.runner.train_progress import steps_text

    if math.isnan(result.mean_return):
        episodes = ("no episode finished yet" if result.episodes == 0
                    else f"{result.episodes:,} episodes (none finished in this session)")
    else:
        episodes = (f"{result.episodes:,} episodes, mean return {result.mean_return:.3g}"
                    + (f", success {result.mean_success:.3f}" if result.mean_success == result.mean_success else ""))
    stopped = f"stopped by {result.stopped_by} after {result.wall_seconds:.1f} s"
    if config.max_seconds > 0:
        stopped += f" (limit {config.max_seconds:g} s, start-up and stop included)"
        if result.stopped_by == "time limit" and result.updates == 0:
            stopped += ("; the limit ended it before its first update: raise --max-seconds (fwrl's start-up, the "
                        "env workers' and the first batch's take part of it)")
    updates = f"{result.updates:,} update{'' if result.updates == 1 else 's'}"
    return f"{steps_text(result.agent_steps, config.total_steps, steps_per_update)}, {updates}, {episodes}; {stopped}"


def _unused_run_dir(runs_dir: Path, name: str) -> Path:
    """``runs_dir/name``, or ``name-2``, ``name-3``, ... where that folder already holds a run."""
    candidate, n = runs_dir / name, 1
    while (candidate / "config.yaml").exists() or (candidate / "checkpoint.pt").exists():
        n += 1
        candidate = runs_dir / f"{name}-{n}"
    return candidate


# the longest file name most file systems take (bytes; ext4, XFS, btrfs, APFS, NTFS in UTF-16 units)
NAME_MAX = 255


def _run_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise FwrlError(f"--name {name!r} is not a folder name (no slashes; --runs-dir picks the parent folder).")
    if any(not c.isprintable() for c in name):
        raise FwrlError(f"--name {name!r} holds a control character (a newline, a tab...): use printable characters.")
    if len(name.encode()) > NAME_MAX:
        raise FwrlError(f"--name is {len(name.encode())} bytes long; a folder name takes at most {NAME_MAX} "
                        f"(it starts {name[:40]!r}).")
    return name


def _default_name(config: TrainConfig) -> str:
    env = re.sub(r"[^A-Za-z0-9]+", "-", config.env.split("?")[0]).strip("-")
    return f"{env}-{config.core}"


# ----------------------------------------------------------------------------- info

@command
def add_info(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="cores, presets, and a model's parameter table",
                       description="List the memory cores (and their options) or the presets, or describe "
                                   "the model for --env: parameters per module.")
    p.add_argument("--cores", action="store_true", help="list the memory cores and all their options (without "
                   "arguments: one line per core, and the presets)")
    p.add_argument("--presets", action="store_true", help="list the presets")
    p.add_argument("--preset", metavar="NAME|FILE", help="describe (or probe) the model of this preset")
    add_setting_flags(p, TrainConfig, ("env", "core", "stem", "init"), {"env": None})
    p.add_argument("--core-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="core option, repeatable (e.g. --core-opt num_layers=4)")
    probe = p.add_argument_group("init probe (with --env)", "How hard the first updates of a fresh agent hit its "
                                 "policy and value, on one batch acted in --env (fwrl.runner.probe).")
    probe.add_argument("--probe", action="store_true", help="run the init probe")
    probe.add_argument("--probe-updates", type=int, default=10, metavar="INT",
                       help="updates on the probe's batch (default 10)")
    probe.add_argument("--probe-reference", metavar="CORE", default=None,
                       help="probe this core too (the same settings, its own core options) on the same batch, "
                            "and print the figures as multiples of its, e.g. lstm")
    probe.add_argument("--json-path", dest="json_path", default=None, metavar="PATH",
                       help="also write the probe's settings and figures to this JSON file")
    add_setting_flags(probe, TrainConfig, ("batch_size", "unroll_length", "learning_rate", "entropy_cost",
                                           "grad_norm_clip", "rmsprop_bias_correction", "seed"))
    p.set_defaults(run=run_info)


def run_info(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fwrl.settings.config import build_config

    settings = given_settings(args, TrainConfig)
    options = parse_key_values(args.core_opt, "--core-opt")
    describe = "env" in settings or bool(args.preset)
    if args.probe_updates < 1:  # the probe's own flags first: said before the config (and torch)
        raise FwrlError(f"--probe-updates {args.probe_updates} is not valid; valid: an integer >= 1.")
    if args.probe and not describe:
        raise FwrlError("--probe needs an env: pass --env ENV (or --preset NAME).")
    if args.json_path and not args.probe:
        raise FwrlError("--json-path writes the init probe's figures: pass --probe with it.")
    if args.probe_reference and not args.probe:
        raise FwrlError("--probe-reference compares the init probe's figures: pass --probe with it.")
    if args.probe_reference:
        from fwrl.errors import unknown_choice
        from fwrl.settings.core_catalog import core_names  # the registry's cores, without importing torch

        if args.probe_reference not in core_names():
            raise unknown_choice("core", args.probe_reference, core_names(), "given to --probe-reference")
    if describe:  # the env first: a misspelt env or a missing library is said before torch is imported
        from fwrl.settings.config import check_env_first, layered_settings

        check_env_first(layered_settings(args.preset, {**settings, "core_options": options}), installed=False)
    if args.preset or settings or options:  # checks core, options, stem, env (over the family's defaults)
        config = build_config(args.preset, {**settings, "core_options": options})
    if args.probe and config.batch_size > PROBE_MAX_BATCH:
        raise FwrlError(f"--batch-size {config.batch_size} with --probe: the init probe acts that many envs in this "
                        f"process, one after another; valid: 1..{PROBE_MAX_BATCH:,} (its figures need no larger "
                        "batch).")
    reference = None
    if args.probe_reference:  # the same batch (B, T), the reference core with its own options
        reference = build_config(args.preset, {**settings, "core": args.probe_reference, "core_options": {},
                                               "batch_size": config.batch_size,
                                               "unroll_length": config.unroll_length})
    if args.json_path:
        from fwrl.utils.files import check_writable

        check_writable(Path(args.json_path), "probe JSON", "Pass --json-path PATH to write it elsewhere.")
    from fwrl.utils.console import show_table

    console = Console()
    overview = not (args.cores or describe or args.presets)
    if args.cores or overview:
        from fwrl.settings.core_catalog import catalogue  # the registry's cores, without importing torch

        if overview:  # one line per core; --cores gives every option
            table = Table("core", "what it is", title="memory cores (fwrl info --cores: their options)",
                          title_justify="left")
            for core in catalogue()["cores"]:
                table.add_row(core["name"], core["summary"])
            show_table(table, console)
        for core in catalogue()["cores"] if args.cores else ():
            table = Table("option", "default", "valid", "meaning", title=f"{core['name']}: {core['summary']}",
                          title_justify="left")
            for option in core["options"]:
                table.add_row(option["name"], option["default"], option["valid"], option["description"])
            if not core["options"]:
                table.add_row("(none)", "", "", "")
            show_table(table, console)
    if args.presets or overview:
        from fwrl.settings.config import load_preset, preset_names

        table = Table("preset", "env", "core", title="presets (fwrl info --preset NAME: its model)",
                      title_justify="left")
        for name in preset_names():
            data = load_preset(name)
            table.add_row(name, str(data.get("env", "")), str(data.get("core", "")))
        show_table(table, console)
    if describe:
        from fwrl.agents.model import count_parameters, layer_table
        from fwrl.agents.stem_shapes import check_stem
        from fwrl.envs.registry import describe_env
        from fwrl.runner.agent import build_model

        from fwrl.runner.preflight import check_model_memory

        info = describe_env(config.env)
        check_stem(config.stem, info.obs_shape, config.env)
        check_model_memory(config, info, copies=3 if args.probe else 1,  # the probe: gradients, RMSProp's average
                           what="this model" + (" and the init probe's optimiser" if args.probe else ""))
        if reference is not None:
            check_model_memory(reference, info, copies=3, what=f"the reference core {reference.core}")
        model = build_model(config, info)
        table = Table("module", "parameters", title=f"{config.env} / {config.core} / {model.stem_name} stem")
        for name, n in layer_table(model):
            table.add_row(name, f"{n:,}")
        table.add_row("total", f"{count_parameters(model):,}", style="bold")
        show_table(table, console)
        console.print(f"observations {info.obs_shape} {info.obs_dtype}, {info.num_actions} actions, "
                      f"tasks: {', '.join(info.task_names)}")
        if args.probe:
            _run_probe(config, model, args.probe_updates, args.json_path, reference, info)
    return 0


class ProbeProgress:
    """The init probe's progress on stderr: a line as each phase starts (making the envs, the warm-up, acting,
    the updates), then one every ``every`` seconds within it, so a large probe is never silent for minutes."""

    def __init__(self, every: float = 5.0, out=None):
        self.every, self.out = every, out
        self.phase, self.last = None, 0.0

    def __call__(self, phase: str, done: int, of: int) -> None:
        import time

        now = time.monotonic()
        if phase == self.phase and now - self.last < self.every:
            return
        self.phase, self.last = phase, now
        print(f"probe: {phase} {done:,} of {of:,}", file=self.out or sys.stderr, flush=True)


def _probe_with(config: TrainConfig, model, batch, updates: int, say=None):
    """:func:`fwrl.runner.probe.probe` of ``model`` with ``config``'s optimiser and loss settings."""
    from fwrl.runner.probe import probe

    return probe(model, batch, updates=updates, say=say, learning_rate=config.learning_rate,
                 rmsprop_alpha=config.rmsprop_alpha, rmsprop_eps=config.rmsprop_eps,
                 rmsprop_momentum=config.rmsprop_momentum,
                 rmsprop_bias_correction=config.rmsprop_bias_correction, grad_norm_clip=config.grad_norm_clip,
                 discount=config.discount, baseline_cost=config.baseline_cost, entropy_cost=config.entropy_cost,
                 reward_clip=config.reward_clip)


def _probe_title(config: TrainConfig, updates: int) -> str:
    return (f"init probe: {config.env} / {config.core} / B {config.batch_size}, T {config.unroll_length}, "
            f"lr {config.learning_rate:g}{', bias-corrected RMSProp' if config.rmsprop_bias_correction else ''}, "
            f"{updates} updates on one batch")


def _run_probe(config: TrainConfig, model, updates: int, json_path: str | None = None,
               reference: TrainConfig | None = None, info=None) -> None:
    """The init probe of ``model``; with ``reference``, that config's agent probed on the same batch too
    (built from the same seed) and the figures printed as multiples of its."""
    import json

    import torch

    from fwrl.runner.agent import build_model
    from fwrl.runner.probe import collect_batch, format_probe, format_reference

    torch.manual_seed(config.seed)
    print(f"probe: acting {config.batch_size} envs x {config.unroll_length + 1} steps with the fresh agent ...",
          file=sys.stderr, flush=True)
    say = ProbeProgress()
    batch = collect_batch(config.env, model, config.batch_size, config.unroll_length, seed=config.seed, say=say)
    result = _probe_with(config, model, batch, updates, say)
    print(format_probe(result, _probe_title(config, updates)))
    reference_result = None
    if reference is not None:
        torch.manual_seed(reference.seed)
        reference_result = _probe_with(reference, build_model(reference, info), batch, updates, ProbeProgress())
        print(format_probe(reference_result, "reference " + _probe_title(reference, updates)))
        print(format_reference(result, reference_result, f"{config.core} against {reference.core} on the same "
                               f"batch (the reference's figure -> {config.core}'s as a multiple of it):"))
    if json_path:
        from fwrl.utils.files import atomic_write_text

        settings = {"env": config.env, "core": config.core, "core_options": config.core_options,
                    "stem": model.stem_name, "batch_size": config.batch_size, "unroll_length": config.unroll_length,
                    "learning_rate": config.learning_rate, "updates": updates, "seed": config.seed}
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        record = {"settings": settings, **result.to_dict()}
        if reference_result is not None:
            record["reference"] = {"core": reference.core, "core_options": reference.core_options,
                                   "learning_rate": reference.learning_rate, **reference_result.to_dict()}
        atomic_write_text(Path(json_path), json.dumps(record, indent=2, default=str) + "\n")
        print(f"wrote {json_path}")


# ----------------------------------------------------------------------------- bench

@command
def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: throughput, envs, kernels")
    bsub = p.add_subparsers(dest="bench", required=True, parser_class=_Parser)
    t = bsub.add_parser("throughput", help="agent steps/s of a short training run",
                        description="Agent steps/s of real training (env workers, inference, learner) after a "
                                    "warm-up. Takes the settings of fwrl train; without --preset or --config its "
                                    "own defaults are " + ", ".join(f"{k} {v}" for k, v in BENCH_THROUGHPUT_DEFAULTS.items())
                                    + f", and stem {BENCH_THROUGHPUT_STEM} on its own env (with --env: auto, as "
                                    "fwrl train picks it).")
    add_setting_flags(t, BenchConfig)
    add_train_config_flags(t, {**BENCH_THROUGHPUT_DEFAULTS, "stem": f"{BENCH_THROUGHPUT_STEM} (with --env: auto)"},
                           exclude=BENCH_THROUGHPUT_FIXED)
    _add_env_path_flags(t)
    t.set_defaults(run=run_bench_throughput)
    e = bsub.add_parser("envs", help="raw env steps/s through the worker layer",
                        description="Env steps/s of random actions through the env workers (no model), and per "
                                    "core of the worker processes. --paths compares the env paths of the spec "
                                    "(vector=ale|envpool|none) on the same workers.")
    add_setting_flags(e, TrainConfig, ("env", "num_workers", "envs_per_worker", "backend", "ray_address"),
                      {**BENCH_ENVS_DEFAULTS, "ray_address": "auto"})
    add_setting_flags(e, BenchConfig, ("seconds", "warmup"), {"seconds": 20.0, "warmup": "min(5, seconds / 4)"})
    e.add_argument("--json-path", dest="json_path", default=argparse.SUPPRESS, metavar="PATH",
                   help="also write the figures (per path and round) to this JSON file")
    _add_env_path_flags(e)
    e.set_defaults(run=run_bench_envs)
    k = bsub.add_parser("kernels", help="fast-weight kernel timings (needs a GPU); --help lists its options",
                        add_help=False)
    # its options belong to fwrl.launch.bench.kernels, which parses them (see main)
    k.set_defaults(run=run_bench_kernels, passes_unknown_args=True)


def _add_env_path_flags(parser: argparse.ArgumentParser) -> None:
    """``--paths`` and ``--rounds``: compare the env paths of the spec (its ``vector`` option)."""
    parser.add_argument("--paths", default=None, metavar="PATH[,PATH...]|all",
                        help="measure each env path of the spec on the same workers, alternating: values of its "
                             "vector option (ale, envpool, none = the Python chain) or all (every one installed); "
                             "default: the spec as given")
    parser.add_argument("--rounds", type=int, default=1, metavar="N",
                        help="with --paths: how many times to measure each path, alternating (default 1)")


def run_bench_throughput(args: argparse.Namespace) -> int:
    from fwrl.launch.bench.throughput import bench_throughput
    from fwrl.settings.config import config_yaml
    from fwrl.launch.flags import train_config_from_args
    from fwrl.runner.preflight import check_runnable

    from fwrl.launch.flags import check_ray_address, train_overrides

    window = BenchConfig.parse(given_settings(args, BenchConfig))
    config = train_config_from_args(args, base=bench_throughput_base(args), check_env=not args.print_config)
    check_ray_address(train_overrides(args), config.backend)
    if args.print_config:
        print(config_yaml(config), end="")
        return 0
    check_runnable(config)
    return bench_throughput(config, seconds=window.seconds, warmup=window.warmup,
                            ceiling_seconds=window.ceiling_seconds, json_path=window.json_path, paths=args.paths,
                            rounds=args.rounds, profile_path=window.profile_path,
                            profile_seconds=window.profile_seconds, acting_only=window.acting_only)


def bench_throughput_base(args: argparse.Namespace) -> dict | None:
    """The bench's own defaults under the flags: none with --preset or --config (they replace them);
    the nature stem only on the bench's own env (Pong): with --env, the stem is auto, as in fwrl train."""
    if args.preset is not None or args.config is not None:
        return None
    return {**BENCH_THROUGHPUT_DEFAULTS, **({} if hasattr(args, "env") else {"stem": BENCH_THROUGHPUT_STEM})}


def run_bench_envs(args: argparse.Namespace) -> int:
    from fwrl.launch.bench.envs import bench_envs
    from fwrl.settings.config import build_config

    given = given_settings(args, BenchConfig)
    window = BenchConfig.parse({"seconds": 20.0, **given})
    config = build_config(None, given_settings(args, TrainConfig), base=BENCH_ENVS_DEFAULTS)
    from fwrl.launch.flags import check_ray_address
    from fwrl.runner.preflight import check_workers_runnable

    check_ray_address(given_settings(args, TrainConfig), config.backend)

    check_workers_runnable(config.env, config.backend)
    return bench_envs(argparse.Namespace(env=config.env, num_workers=config.num_workers,
                                         envs_per_worker=config.envs_per_worker, backend=config.backend,
                                         ray_address=config.ray_address, seconds=window.seconds,
                                         warmup=window.warmup if "warmup" in given else None,
                                         json_path=window.json_path, paths=args.paths, rounds=args.rounds))


def run_bench_kernels(args: argparse.Namespace) -> int:
    from fwrl.launch.bench.kernels import main

    return main(args.rest)  # its options are those of fwrl.launch.bench.kernels


# ----------------------------------------------------------------------------- evaluate

@command
def add_evaluate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="play test episodes; JSON + table of scores (and MP4s with --video)",
                       description="Evaluate a run (its checkpoint.pt) or a checkpoint file with the "
                                   "protocol of its env family (PAPERS.md §5); with --video DIR, also an MP4 of "
                                   "the first --video-episodes episodes of every task and split.")
    p.add_argument("source", help="run folder or checkpoint file")
    add_setting_flags(p, EvaluateConfig)
    p.set_defaults(run=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    from fwrl.runner.preflight import check_workers_runnable

    from fwrl.utils.checkpoint_files import check_checkpoint_file, checkpoint_of

    from fwrl.launch.flags import check_ray_address

    opts = EvaluateConfig.parse(given_settings(args, EvaluateConfig))
    check_ray_address(given_settings(args, EvaluateConfig), opts.backend)
    source = Path(args.source)
    check_checkpoint_file(checkpoint_of(source))  # a folder without a run, a file that is no checkpoint: before torch
    if opts.video_episodes is not None and not opts.video:
        raise FwrlError(f"--video-episodes {opts.video_episodes} sets how many episodes --video records; pass "
                        "--video DIR too.")
    if opts.env:  # a bad spec or a missing library is said before torch loads the checkpoint
        check_workers_runnable(opts.env, opts.backend)
    if opts.video:  # the encoder, the folder, and (with --env) the family's frames: before torch too
        from fwrl.evaluation.video import check_video, check_video_folder

        check_video(opts.env, opts.video) if opts.env else check_video_folder(opts.video)
    tracked = _wandb_of(source if source.is_dir() else source.parent)

    from fwrl.evaluation import evaluate as ev
    from fwrl.evaluation.protocols import default_num_workers, default_protocol, select_splits
    from fwrl.evaluation.results import print_table, write_result
    from fwrl.runner.agent import load_agent, pick_device
    from fwrl.utils.files import check_writable

    device = pick_device(opts.device)
    model, payload, path = load_agent(source, device)
    config = payload["config"]
    folder_config = path.parent / "config.yaml"
    if not opts.env and folder_config.is_file():  # the run's own record against its checkpoint's
        from fwrl.utils.yaml_files import read_yaml

        recorded = read_yaml(folder_config, "run config")
        if isinstance(recorded, dict) and recorded.get("env") not in (None, config.get("env")):
            raise FwrlError(f"{path} is an agent of env {config.get('env')!r}, but its run folder's config.yaml says "
                            f"{recorded.get('env')!r}: the checkpoint was copied from another run. Evaluate it from "
                            "its own run folder, or pass --env and --out explicitly.")
    if not opts.out:  # the evaluation goes into the checkpoint's folder: the checkpoint must be that folder's run's
        _check_own_run(path, payload)
    env = opts.env or config["env"]
    wrappers = tuple(config.get("env_wrappers", ()))
    check_workers_runnable(env, opts.backend, wrappers)  # the run's env: its library, Ray, its wrappers
    if opts.env:
        ev.check_env_fits(env, model, wrappers)
    splits = [s.strip() for s in opts.splits.split(",") if s.strip()] if opts.splits else None
    select_splits(default_protocol(env).splits, splits)
    if opts.out:
        out = Path(opts.out)
    else:
        out = source / "evaluation.json" if source.is_dir() else path.with_suffix(".eval.json")
    check_writable(out, "evaluation JSON", "Pass --out PATH to write it elsewhere.")
    check_writable(out.with_suffix(".md"), "evaluation table", "Pass --out PATH to write it elsewhere.")
    if opts.video:  # the run's env has frames to record (refused here, before any episode)
        from fwrl.evaluation.video import check_video

        check_video(env, opts.video, wrappers)
    num_workers = opts.num_workers or default_num_workers(env)
    import torch

    from fwrl.evaluation.evaluate_progress import EvalProgress
    from fwrl.runner.concurrency import torch_threads
    from fwrl.utils.allocator import keep_freed_memory

    torch.set_num_threads(torch_threads(0, num_workers, opts.backend))  # not every core: the workers need theirs
    keep_freed_memory()  # no page faults for each step's tensors on the CPU (fwrl.utils.allocator)

    with EvalProgress(env) as progress:  # episodes played, the running mean return, an ETA
        result = ev.evaluate(
            model, env, episodes=opts.episodes, repeats=opts.repeats, greedy=opts.policy == "greedy",
            splits=splits, num_workers=num_workers, envs_per_worker=opts.envs_per_worker, seed=opts.seed,
            device=device, backend=opts.backend, step_timeout=opts.step_timeout, core=config["core"],
            core_options=config.get("core_options", {}), unroll_length=config.get("unroll_length"),
            backend_options={"address": opts.ray_address} if opts.backend == "ray" else None,
            env_wrappers=tuple(config.get("env_wrappers", ())), progress=progress,
        )
    result = {"checkpoint": str(path), "agent_steps": int(payload.get("agent_steps", 0)), **result}
    print_table(result)
    if opts.video:
        from fwrl.evaluation.video import record_videos

        episodes = opts.video_episodes or 1
        print(f"recording {episodes} episode(s) per task and split into {opts.video}", file=sys.stderr)
        videos = record_videos(model, env, Path(opts.video), episodes=episodes,
                               splits=select_splits(default_protocol(env).splits, splits), seed=opts.seed,
                               greedy=opts.policy == "greedy", device=device, env_wrappers=wrappers,
                               progress=lambda line: print(line, file=sys.stderr))
        result["videos"] = [v.describe() for v in videos]
    md = write_result(result, out)
    print(f"wrote {out} and {md}")
    if tracked is not None:  # the run's W&B run gets the table and the videos
        from fwrl.runner.tracking import WandbTracker

        tracker = WandbTracker(tracked, {}, project=config.get("wandb_project") or "fwrl",
                               group=config.get("wandb_group") or "", resume=True, job_type="evaluate")
        try:
            tracker.log_evaluation(result)
        finally:
            tracker.close()
        print(f"logged the evaluation to the run's W&B run ({tracked / 'wandb'})", file=sys.stderr)
    return 0


def _wandb_of(run_dir: Path) -> Path | None:
    """``run_dir`` where its run is tracked in W&B and W&B can log here (else None, said in one line
    where it cannot: the evaluation goes on without it)."""
    from fwrl.runner.tracking import check_wandb, tracked_run

    if not tracked_run(run_dir):
        return None
    try:
        check_wandb()
    except FwrlError as exc:
        print(f"fwrl evaluate: not logged to the run's W&B run: {exc}", file=sys.stderr)
        return None
    return run_dir


# ----------------------------------------------------------------------------- inspect

@command
def add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="plot what the agent's memory does in an episode (PNG + NPZ)",
                       description="Play episodes with a run's agent (its checkpoint.pt) or a checkpoint file, "
                                   "in this process, and plot per step what its core does: the delta rule's "
                                   "write strength, fast-weight change and read match; the SRWM's learning "
                                   "rates and self-modification; the LSTM's and GRU's gates and state norms. "
                                   "One PNG per episode, its arrays beside it (NPZ).")
    p.add_argument("source", help="run folder or checkpoint file")
    add_setting_flags(p, InspectConfig)
    p.set_defaults(run=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from fwrl.runner.preflight import check_workers_runnable
    from fwrl.utils.checkpoint_files import check_checkpoint_file, checkpoint_of
    from fwrl.utils.files import check_writable_folder

    opts = InspectConfig.parse(given_settings(args, InspectConfig))
    source = Path(args.source)
    check_checkpoint_file(checkpoint_of(source))  # before torch
    if opts.env:
        check_workers_runnable(opts.env, "local")
    out = Path(opts.out) if opts.out else (source / "inspect" if source.is_dir() else source.with_suffix(".inspect"))
    if out.exists() and not out.is_dir():
        raise FwrlError(f"inspect folder {out} is a file; pass --out DIR, a folder for the PNGs and NPZs.")
    check_writable_folder(out, "inspect folder", "Pass --out DIR to write elsewhere.")

    from fwrl.evaluation.evaluate import check_env_fits
    from fwrl.launch.inspect_memory import inspect_agent
    from fwrl.runner.agent import load_agent, pick_device

    device = pick_device(opts.device)
    model, payload, path = load_agent(source, device)
    config = dict(payload["config"], agent_steps=int(payload.get("agent_steps", 0)))
    env = opts.env or config["env"]
    wrappers = tuple(config.get("env_wrappers", ()))
    check_workers_runnable(env, "local", wrappers)
    if opts.env:
        check_env_fits(env, model, wrappers)
    inspect_agent(model, env, config, out, episodes=opts.episodes, seed=opts.seed, greedy=opts.policy == "greedy",
                  device=device, env_wrappers=wrappers, say=lambda line: print(line, file=sys.stderr))
    return 0


def _check_own_run(path: Path, payload: dict) -> None:
    """Refuse to file an evaluation of checkpoint ``path`` in its folder where the folder holds another
    run: another run id (``run.json``; checkpoints carry their run's), or, where either has no id (fwrl
    before run ids), another env or core in the folder's ``config.yaml``."""
    from fwrl.runner.rundir import RunDir

    folder = path.parent
    why = RunDir(folder).foreign_checkpoint(path, payload)
    config = payload.get("config") or {}
    folder_config = folder / "config.yaml"
    if why is None and folder_config.is_file():
        from fwrl.utils.yaml_files import read_yaml

        recorded = read_yaml(folder_config, "run config")
        differ = [key for key in ("env", "core")
                  if isinstance(recorded, dict) and recorded.get(key) not in (None, config.get(key))]
        if differ:
            why = (f"{path} is an agent of {', '.join(f'{k} {config.get(k)!r}' for k in differ)}, but its run folder's "
                   f"config.yaml says {', '.join(f'{k} {recorded.get(k)!r}' for k in differ)}")
    if why:
        raise FwrlError(f"{why}: its evaluation would be filed in {folder} as that run's. Evaluate it with --out PATH "
                        "(written elsewhere), or from its own run folder.")


# ----------------------------------------------------------------------------- plot

@command
def add_plot(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plot", help="learning curves of runs to a PNG",
                       description="Plot a metric of metrics.csv against agent steps, runs overlaid.")
    p.add_argument("runs", nargs="+", help="run folders (or metrics.csv files)")
    add_setting_flags(p, PlotConfig)
    p.set_defaults(run=run_plot)


def run_plot(args: argparse.Namespace) -> int:
    from fwrl.launch.plot import default_out, image_format, plot_runs, read_metrics
    from fwrl.settings.config import parse_size
    from fwrl.utils.files import check_writable

    opts = PlotConfig.parse(given_settings(args, PlotConfig))
    runs = [Path(r) for r in args.runs]
    for run in runs:
        read_metrics(run, say_damage=False)  # each run has a readable metrics.csv (damage is said once, below)
    out = Path(opts.out) if opts.out else default_out(runs, opts.metric)
    check_writable(out, "plot", "Pass --out PATH to write it elsewhere.")
    image_format(out)  # before any drawing
    if opts.random:
        from fwrl.launch.plot import random_returns

        random_returns(Path(opts.random), opts.by)  # a bad file is said before any drawing

    import matplotlib.pyplot as plt

    fig = plot_runs(runs, opts.metric, opts.by, opts.smooth, out, parse_size(opts.size),
                    random=Path(opts.random) if opts.random else None)
    plt.close(fig)
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------- sweep

@command
def add_sweep(sub: argparse._SubParsersAction) -> None:
    from fwrl.launch.sweep.arguments import add_sweep_arguments

    p = sub.add_parser("sweep", help="train a grid of runs (games x cores x seeds ...): local, ray or slurm",
                       description="Train every cell of a grid, each a run folder under SWEEP_DIR/runs/. "
                                   "Run the same command again to skip finished cells and resume the others.")
    add_sweep_arguments(p)
    p.set_defaults(run=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from fwrl.launch.sweep.command import run_sweep as sweep

    return sweep(args)


# ----------------------------------------------------------------------------- report

@command
def add_report(sub: argparse._SubParsersAction) -> None:
    from fwrl.launch.report.options import ReportConfig

    p = sub.add_parser("report", help="tables, aggregates (IQM, CIs) and figures of sweeps or runs",
                       description="Per-game scores over seeds, normalised scores, aggregates with stratified "
                                   "bootstrap CIs (rliable), performance profiles and learning curves of "
                                   "sweep folders or run folders: markdown, PNG, JSON (and HTML).")
    p.add_argument("paths", nargs="+", metavar="SWEEP_OR_RUNS", help="sweep folders, run folders, or folders of runs")
    add_setting_flags(p, ReportConfig)
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from fwrl.launch.report.build import run_report as report

    return report(args)


# ----------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fwrl", description="IMPALA agents with fast-weight memories.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in _COMMANDS.values():
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    """The ``fwrl`` command. ``started``: ``time.monotonic()`` when fwrl began (the ``fwrl`` script's
    import of :mod:`fwrl.launch.entry`); ``--max-seconds`` and the elapsed time count from there. Not
    from the process's start: a process ``exec``'d by a shell that ran other commands first (``bash -c
    "sleep 30 && fwrl train ..."``) started long before fwrl did. Default: this module's import
    (``python -m fwrl.launch.cli``) or, for in-process calls with ``argv`` (tests), now."""
    from fwrl.envs.quiet import plain_fwrl_warnings, silence_env_noise

    if started is None:
        started = _IMPORTED if argv is None else time.monotonic()
    silence_env_noise()
    plain_fwrl_warnings()
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        args, unknown = parser.parse_known_args(argv)
        args.argv = argv  # as typed: fwrl train --learners N runs it again in every rank
        args.started = started  # fwrl train --max-seconds counts from here
        if getattr(args, "passes_unknown_args", False):
            args.rest = unknown
        elif unknown:
            command = " ".join(c for c in ("fwrl", args.command, getattr(args, "bench", None)) if c)
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {command} --help)")
        return args.run(args)
    except FwrlError as exc:
        print(f"fwrl: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_status", 2)  # 2: bad input; 69: the env workers or their cluster are lost
    except KeyboardInterrupt:
        return interrupted()
    except OSError as exc:  # a disk fault (full, read-only, a folder removed) or an unreadable file: one line
        where = f": {exc.filename}" if exc.filename else ""
        print(f"fwrl: error: {exc.strerror or exc}{where} (errno {exc.errno})", file=sys.stderr)
        return EXIT_OS_ERROR


if __name__ == "__main__":
    sys.exit(end_process(main()))
