"""The command line of ``fwrl sweep``: its own settings, and the training settings as grid flags.

Every setting of ``fwrl train`` is a flag that takes one or more values
(``--core lstm rdn``): one value is common to every cell, several make an axis
(booleans take none: ``--sticky-actions`` is common). ``--core-opt`` and
``--env-wrapper`` are common, repeatable. Two training settings have no flag
here because the sweep's flags of the same name mean something else: set
``ray_address`` (the env workers' cluster) and ``eval_episodes`` (the episodes
of ``--eval-every``) in the grid file.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, load_preset, merge_settings, read_settings_file
from fwrl.launch.flags import add_setting_flags, flag_name, parse_key_values, setting_help
from fwrl.launch.sweep.grid import Grid, add_common, axis_of, read_grid_file, set_axis
from fwrl.launch.sweep.options import SweepConfig
from fwrl.utils.settings import base_type, choices_of

# training settings whose flag names belong to the sweep's own settings (set them in the grid file)
SWEEP_OWN = ("ray_address", "eval_episodes")
_METAVARS = {int: "INT", float: "FLOAT"}


def _grid_settings() -> list[str]:
    """Training settings with a grid flag (scalar ones; lists and mappings have their own flags)."""
    out = []
    for name, info in TrainConfig.model_fields.items():
        kind = base_type(info.annotation)
        if name in SWEEP_OWN or dict in (kind, typing.get_origin(kind)) or list in (kind, typing.get_origin(kind)):
            continue
        out.append(name)
    return out


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep folder, the sweep's settings, --preset / --config, and one grid flag per training setting."""
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR", type=Path,
                        help="the sweep folder (created; run the same command again to resume)")
    add_setting_flags(parser, SweepConfig)
    parser.add_argument("--sbatch-opt", action="append", default=[], metavar="KEY=VALUE",
                        help="slurm: an #SBATCH option of the array script, repeatable (e.g. --sbatch-opt "
                             "partition=gpu --sbatch-opt time=24:00:00)")
    parser.add_argument("--preset", metavar="NAME|FILE", help="every cell starts from this preset (or YAML file)")
    parser.add_argument("--config", metavar="FILE", type=Path,
                        help="YAML file of settings common to every cell, applied after --preset")
    group = parser.add_argument_group(
        "settings of fwrl train (one value: common to every cell; several: an axis of the grid; flags replace "
        "the grid file's entry of the same setting)")
    for name in _grid_settings():
        info = TrainConfig.model_fields[name]
        kind = base_type(info.annotation)
        help_text = setting_help(TrainConfig, name, info.get_default(call_default_factory=True))
        if kind is bool:
            group.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=help_text)
            continue
        choices = choices_of(kind)
        metavar = "{" + ",".join(map(str, choices)) + "}" if choices else _METAVARS.get(kind, "VALUE")
        group.add_argument(flag_name(name), dest=name, nargs="+", default=argparse.SUPPRESS, metavar=metavar,
                           help=help_text)
    group.add_argument("--core-opt", action="append", default=[], metavar="KEY=VALUE",
                       help="core option common to every cell whose core has it, repeatable")
    group.add_argument("--elstm-grad", nargs="+", choices=("bptt", "rtrl"),
                       help="eLSTM training: bptt or rtrl (several: an axis)")
    group.add_argument("--env-wrapper", dest="env_wrappers", action="append", default=argparse.SUPPRESS,
                       metavar="MODULE:CALLABLE", help="wrap every env of every cell, repeatable")


def grid_from_args(args: argparse.Namespace, opts: SweepConfig) -> Grid | None:
    """The grid of ``--grid`` and the flags over ``--preset`` / ``--config``; None where none of these is given."""
    flags: dict[str, Any] = {name: getattr(args, name) for name in _grid_settings() if hasattr(args, name)}
    core_options = parse_key_values(args.core_opt, "--core-opt")
    if args.elstm_grad and "grad" in core_options:
        raise FwrlError(f"--elstm-grad {' '.join(args.elstm_grad)} and --core-opt grad={core_options['grad']} set the "
                        "same option (the eLSTM's training): give one of them.")
    wrappers = getattr(args, "env_wrappers", None)
    given = (opts.grid or args.preset or args.config or flags or core_options or args.elstm_grad
             or wrappers is not None)
    if not given:
        return None
    grid = read_grid_file(Path(opts.grid)) if opts.grid else Grid()
    layers = []
    if args.preset:
        layers.append(load_preset(args.preset))
    if args.config is not None:
        layers.append(read_settings_file(args.config))
    grid.base = merge_settings(layers) if layers else {}
    for name, values in flags.items():
        if isinstance(values, bool) or len(values) == 1:
            add_common(grid, name, values if isinstance(values, bool) else values[0], "the command line")
        else:
            set_axis(grid, axis_of(name, values, "the command line"))
    if args.elstm_grad:
        if len(args.elstm_grad) == 1:
            add_common(grid, "elstm_grad", args.elstm_grad[0], "the command line")
        else:
            set_axis(grid, axis_of("elstm_grad", args.elstm_grad, "the command line"))
    if core_options:
        add_common(grid, "core_options", core_options, "the command line")
    if wrappers is not None:
        add_common(grid, "env_wrappers", list(wrappers), "the command line")
    if not grid.axes and not grid.common and not grid.common_core_options and not grid.base:
        raise FwrlError(f"grid file {opts.grid} sets nothing; give it settings (KEY: VALUE) and axes "
                        "(KEY: [VALUES]).")
    return grid
