"""``fwrl sweep``: check the grid, write the sweep folder, run what is left with the chosen executor.

Order of work: read the grid and expand its cells (every cell's config is
validated as ``fwrl train`` validates one); compare with the sweep folder's
cells (:func:`fwrl.launch.sweep.plan.check_compatible`); find what is left;
with the local executor, check each cell as ``fwrl train`` would (env, model,
device) before anything starts; with the slurm executor, that ``sbatch`` is here. Only then is the folder written and the cells
run. ``--status`` and ``--dry-run`` write nothing.

Exit status: 0 when every cell is done (or, slurm, the array was submitted), 1
when a cell failed, 75 when cells stopped at their time limit (``max_seconds``)
before their budget, 128 + N after signal N stopped the sweep, 2 for bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from fwrl.errors import FwrlError, install_command, missing_dependency
from fwrl.launch.flags import given_settings, parse_key_values
from fwrl.launch.sweep.arguments import grid_from_args
from fwrl.launch.sweep.cell import EXIT_LATER
from fwrl.launch.sweep.grid import Cell, expand
from fwrl.launch.sweep.options import SweepConfig
from fwrl.launch.sweep.plan import (CellState, Sweep, SweepLock, cell_states, check_compatible, finished, is_sweep,
                                    load_sweep, stored_evaluation, to_run, write_sweep)
from fwrl.launch.sweep.sweep_progress import SweepProgress, run_time_left
from fwrl.runner.train_progress import format_duration


def run_sweep(args: argparse.Namespace) -> int:
    given = given_settings(args, SweepConfig)
    opts = SweepConfig.parse(given)
    sbatch_options = parse_key_values(args.sbatch_opt, "--sbatch-opt")
    if sbatch_options and opts.executor != "slurm":
        raise FwrlError(f"--sbatch-opt applies to --executor slurm only, not --executor {opts.executor}.")
    if "ray_address" in given and opts.executor != "ray":
        raise FwrlError(f"--ray-address {opts.ray_address} is the cluster of --executor ray; the executor here is "
                        f"{opts.executor!r}: add --executor ray, or drop --ray-address (the env workers' cluster of "
                        "--backend ray is the grid file's ray_address).")
    if opts.executor == "ray" and importlib.util.find_spec("ray") is None:
        raise missing_dependency("ray", "ray", "fwrl sweep --executor ray")
    path = Path(args.sweep_dir)
    if path.exists() and not path.is_dir():
        raise FwrlError(f"sweep folder {path} is a file; choose a folder.")
    evaluate, eval_episodes, stored = sweep_evaluation(given, opts, path)
    opts = opts.model_copy(update={"evaluate": evaluate, "eval_episodes": eval_episodes})
    if stored and evaluate and not opts.status:
        print(f"sweep {path}: evaluating each finished cell ({_episodes_text(eval_episodes)}), as the sweep was "
              f"started (recorded in {path / 'sweep.yaml'}); --no-evaluate turns it off", file=sys.stderr)
    grid = grid_from_args(args, opts)
    if grid is None:
        if not is_sweep(path):
            raise FwrlError(f"{path} holds no sweep (no sweep.yaml) and no grid was given: pass --grid FILE or "
                            "settings flags, e.g. --env minatar:breakout minatar:asterix --core lstm rdn --seed 1 2.")
        cells = list(load_sweep(path).cells)
    else:
        cells = expand(grid)
        if is_sweep(path):
            check_compatible(load_sweep(path), cells)
    sweep = Sweep(path, tuple(cells))
    states = cell_states(sweep)
    if opts.status:
        print_status(sweep, states)
        return 1 if any(s.state == "failed" for s in states) else 0
    todo = to_run(states, opts.evaluate, opts.eval_episodes)
    if opts.executor == "slurm":
        from fwrl.launch.sweep.slurm import alive_cells

        alive = alive_cells(sweep)
        todo = [c for c in todo if c not in alive]
    check_stems([sweep.cell(c) for c in todo])  # every executor: a stem that does not fit is said here
    check_env_specs([sweep.cell(c) for c in todo])  # every executor: a bad env option, without its library
    if opts.executor == "local" and todo:  # the dry run too: it lists only what the sweep would start
        check_cells([sweep.cell(c) for c in todo])
    if opts.dry_run:
        return _dry_run(sweep, states, todo, opts, sbatch_options)
    if opts.executor == "slurm" and todo:
        from fwrl.launch.sweep.slurm import check_sbatch

        check_sbatch()  # before the sweep folder is written

    with SweepLock(path):
        sweep = write_sweep(path, grid, cells, opts.evaluate, opts.eval_episodes)
        states = cell_states(sweep)
        wanted = set(todo)  # what was checked above, less what another process finished meanwhile
        todo = [c for c in to_run(states, opts.evaluate, opts.eval_episodes) if c in wanted]
        if not todo:
            left = [s.name for s in states if not finished(s, opts.evaluate, opts.eval_episodes)]
            print(f"sweep {path}: nothing to start: {len(states) - len(left)} of {len(states)} cells done"
                  + (f", {len(left)} running or queued elsewhere" if left else ""), file=sys.stderr)
            if not left:
                print(next_step(path), file=sys.stderr)
            return 0
        if opts.executor == "slurm":
            return _submit(sweep, todo, opts, sbatch_options)
        parallel = opts.parallel
        if opts.executor == "local":
            from fwrl.launch.sweep.local import default_parallel, run_local

            parallel = parallel or default_parallel(sweep, todo)
            progress = SweepProgress(str(path), states, parallel, time_left=_time_left(sweep))
            print(f"sweep {path}: {len(todo)} of {len(states)} cells to run, {parallel} at a time (local)",
                  file=sys.stderr)
            code = run_local(sweep, todo, progress, parallel, opts.evaluate, opts.eval_episodes)
        else:
            from fwrl.launch.sweep.ray_executor import run_ray

            progress = SweepProgress(str(path), states, parallel or len(todo), time_left=_time_left(sweep))
            print(f"sweep {path}: {len(todo)} of {len(states)} cells to run as Ray tasks "
                  f"(--ray-address {opts.ray_address})", file=sys.stderr)
            code = run_ray(sweep, todo, progress, opts.ray_address, opts.cell_cpus, opts.cell_gpus, opts.evaluate,
                           opts.eval_episodes)
    return _finish(sweep, code)


def sweep_evaluation(given: dict, opts: SweepConfig, path: Path) -> tuple[bool, int | None, bool]:
    """(evaluate, eval_episodes, taken from the sweep folder): the flags where given (``--evaluate`` alone:
    the family's protocol), else what the sweep folder's manifest records, so that ``fwrl sweep SWEEP``
    alone (or with the grid again) evaluates as the sweep was started; ``--eval-episodes`` without
    ``--evaluate`` changes a recorded evaluation's episodes."""
    stored = stored_evaluation(path)
    if "evaluate" in given:
        evaluate, episodes, from_folder = opts.evaluate, opts.eval_episodes, False
    elif stored is not None and stored["evaluate"]:
        evaluate, from_folder = True, True
        episodes = opts.eval_episodes if "eval_episodes" in given else stored["eval_episodes"]
    else:
        evaluate, episodes, from_folder = False, opts.eval_episodes, False
    if episodes is not None and not evaluate:
        raise FwrlError(f"--eval-episodes {episodes} sets the episodes of --evaluate; pass --evaluate too.")
    return evaluate, episodes, from_folder


def _episodes_text(eval_episodes: int | None) -> str:
    return "the family's protocol" if eval_episodes is None else f"{eval_episodes} episodes per task and split"


def _time_left(sweep: Sweep):
    """A running cell's seconds left, from its run's metrics.csv (None before its first update)."""
    return lambda cell: run_time_left(sweep.path / "runs" / cell, sweep.cell(cell).config.total_steps)


def check_stems(cells: list[Cell]) -> None:
    """A stem named for a cell fits its env's observations, where the env can be described here (its
    library installed; a ray or slurm cell's is checked where it runs, as fwrl train checks it)."""
    from fwrl.agents.stem_shapes import check_stem
    from fwrl.envs.registry import describe_env

    seen = set()
    for cell in cells:
        config = cell.config
        key = (config.env, config.stem, tuple(config.env_wrappers))
        if config.stem == "auto" or key in seen:
            continue
        seen.add(key)
        try:
            info = describe_env(config.env, wrappers=tuple(config.env_wrappers))
        except Exception:  # noqa: BLE001 - not describable here (a missing library, a ROM): the cell's run checks it
            continue
        try:
            check_stem(config.stem, info.obs_shape, config.env)
        except FwrlError as exc:
            raise FwrlError(f"cell {cell.name}: {exc}") from None


def check_env_specs(cells: list[Cell]) -> None:
    """Each cell's env spec names a family, games and options that exist, with valid values (without its
    library: a ray or slurm cell's library is checked where it runs)."""
    from fwrl.envs.registry import resolve

    for env in dict.fromkeys(cell.config.env for cell in cells):
        try:
            resolve(env)
        except FwrlError as exc:
            cell = next(c for c in cells if c.config.env == env)
            raise FwrlError(f"cell {cell.name}: {exc}") from None


def check_cells(cells: list[Cell]) -> None:
    """Check each distinct config (seeds apart) as ``fwrl train`` would before it starts (env, model, device;
    W&B where a cell tracks its run, the encoder and the env's frames where it records videos)."""
    from fwrl.runner.preflight import check_runnable

    if any(cell.config.wandb for cell in cells):
        from fwrl.runner.tracking import check_wandb

        check_wandb()
    for cell in cells:
        if cell.config.video_every > 0:
            from fwrl.evaluation.video import check_video

            try:
                check_video(cell.config.env, None, cell.config.env_wrappers)
            except FwrlError as exc:
                raise FwrlError(f"cell {cell.name}: {exc}") from None
    seen = set()
    for cell in cells:
        key = repr(sorted((k, repr(v)) for k, v in cell.config.to_dict().items() if k != "seed"))
        if key in seen:
            continue
        seen.add(key)
        try:
            check_runnable(cell.config)
        except FwrlError as exc:
            raise FwrlError(f"cell {cell.name}: {exc}") from None


def _finish(sweep: Sweep, code: int) -> int:
    """The final summary: counts, failed cells with their logs; the exit status."""
    states = cell_states(sweep)
    failed = [s for s in states if s.state == "failed"]
    for s in failed:
        status = s.status or {}
        print(f"  failed: {s.name} ({status.get('phase', 'train')} exit status {status.get('exit_code')}); "
              f"log {status.get('log')}" + (f"\n          {status['message']}" if status.get("message") else ""),
              file=sys.stderr)
    if code:
        return code
    if failed:
        print(f"{len(failed)} cell(s) failed; fix the cause and run the same command again (finished cells are "
              "skipped, failed and interrupted ones run again)", file=sys.stderr)
        return 1
    stopped = [s for s in states if s.state == "interrupted"]
    if stopped:
        print(f"{len(stopped)} cell(s) stopped before their budget (max_seconds); run the same command again to "
              "continue them", file=sys.stderr)
        return EXIT_LATER
    if all(s.state == "done" for s in states):
        print(next_step(sweep.path), file=sys.stderr)
    return 0


def next_step(path) -> str:
    """What a finished sweep suggests next: its report, and the extra that needs where it is missing."""
    text = f"next: fwrl report {path}   (tables, aggregates and curves of the sweep's runs)"
    if importlib.util.find_spec("rliable") is None:
        text += f"; it needs the report extra: {install_command('report')}"
    return text


def print_status(sweep: Sweep, states: list[CellState]) -> None:
    from rich.table import Table

    from fwrl.utils.console import show_table

    table = Table(title=f"sweep {sweep.path}", title_justify="left")
    table.add_column("cell", overflow="fold")  # whole names, folded only where a terminal is narrower
    for column in ("state", "exit", "time", "agent steps", "evaluated"):
        table.add_column(column, no_wrap=True)
    table.add_column("log / message", overflow="fold")
    for s in states:
        status = s.status or {}
        seconds = status.get("seconds")
        steps = status.get("agent_steps")
        table.add_row(s.name, s.state, "" if status.get("exit_code") is None else str(status["exit_code"]),
                      format_duration(seconds) if seconds else "", f"{steps:,}" if steps else "",
                      "yes" if status.get("evaluated") else "",
                      status.get("message") or (status.get("log", "") if s.state == "failed" else ""))
    show_table(table)  # a pipe or a file: every row on one line, however long (not 80 columns)
    print(SweepProgress(str(sweep.path), states, 1).summary().split(", ETA")[0])


def _dry_run(sweep: Sweep, states: list[CellState], todo: list[str], opts: SweepConfig,
             sbatch_options: dict[str, str]) -> int:
    if opts.executor == "slurm":
        from fwrl.launch.sweep.slurm import array_script

        if not todo:
            print(f"# sweep {sweep.path}: every cell is done (or queued); nothing to submit", file=sys.stderr)
            return 0
        sys.stdout.write(array_script(sweep, todo, opts.evaluate, opts.eval_episodes, opts.cell_cpus,
                                      opts.cell_gpus, opts.parallel, sbatch_options))
        return 0
    state = {s.name: s.state for s in states}
    evaluation = f", each evaluated ({_episodes_text(opts.eval_episodes)})" if opts.evaluate else ""
    print(f"sweep {sweep.path}: {len(todo)} of {len(states)} cells would run ({opts.executor}){evaluation}")
    for name in todo:
        what = "to evaluate" if state[name] == "done" else state[name]
        print(f"  {what:<12} {name}")
    return 0


def _submit(sweep: Sweep, todo: list[str], opts: SweepConfig, sbatch_options: dict[str, str]) -> int:
    from fwrl.launch.sweep.slurm import array_script, submit

    script = array_script(sweep, todo, opts.evaluate, opts.eval_episodes, opts.cell_cpus, opts.cell_gpus,
                          opts.parallel, sbatch_options)
    job = submit(sweep, script)
    print(f"sweep {sweep.path}: submitted SLURM job array {job} with {len(todo)} cells (script in "
          f"{sweep.path / 'slurm'}); `fwrl sweep {sweep.path} --status` shows their progress, and the same "
          "command again resubmits what is unfinished", file=sys.stderr)
    return 0
