"""Command-line flags generated from the settings models, and the train config they build.

Each setting ``some_name`` of a :class:`~fwrl.utils.settings.Settings` model
becomes ``--some-name`` (booleans: ``--some-name`` / ``--no-some-name``) with
its help, default and valid range, e.g.::

    --discount FLOAT      discount factor gamma (default 0.99; 0 <= x <= 1)

Flags take the text as typed; the model validates it (argparse converts
nothing), so the command line, presets, YAML files and ``--resume`` follow
one set of rules. Flags that are not given are absent from the namespace:
``given_settings`` returns only what the user typed.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from fwrl.errors import FwrlError
from fwrl.settings.config import TrainConfig, check_env_first, layered_settings
from fwrl.utils.settings import Settings, base_type, choices_of, range_text

_METAVARS = {int: "INT", float: "FLOAT"}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def setting_help(model: type[Settings], name: str, default: Any) -> str:
    """``description (default D; range)`` for the flag of setting ``name``."""
    info = model.model_fields[name]
    parts = []
    if default is not None and default != "":
        parts.append(f"default {str(default).lower() if isinstance(default, bool) else default}")
    bounds = range_text(info)
    if bounds:
        parts.append(bounds)
    text = info.description or name.replace("_", " ")
    if parts:
        text += f" ({'; '.join(parts)})"
    return text.replace("%", "%%")


def add_setting_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, model: type[Settings],
                      names: Iterable[str] | None = None, defaults: Mapping[str, Any] | None = None) -> None:
    """One flag per setting of ``model`` (all, or ``names``); ``defaults`` replace the model's in the help.

    Mapping and list settings (``core_options``, ``env_wrappers``) are left out: they have their
    own flags (``--core-opt KEY=VALUE``, ``--env-wrapper MODULE:CALLABLE``, both repeatable).
    """
    defaults = dict(defaults or {})
    for name in names if names is not None else model.model_fields:
        info = model.model_fields[name]
        kind = base_type(info.annotation)
        if dict in (kind, typing.get_origin(kind)) or list in (kind, typing.get_origin(kind)):
            continue
        default = defaults[name] if name in defaults else info.get_default(call_default_factory=True)
        help_text = setting_help(model, name, default)
        if kind is bool:
            parser.add_argument(flag_name(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=help_text)
            continue
        choices = choices_of(kind)
        metavar = "{" + ",".join(map(str, choices)) + "}" if choices else _METAVARS.get(kind)
        parser.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS, metavar=metavar, help=help_text)


def given_settings(args: argparse.Namespace, model: type[Settings]) -> dict[str, Any]:
    """The settings of ``model`` given on the command line (as typed)."""
    return {name: getattr(args, name) for name in model.model_fields if hasattr(args, name)}


def parse_key_values(items: Sequence[str], what: str) -> dict[str, str]:
    """``["a=1", "b=x"]`` -> ``{"a": "1", "b": "x"}``; an item without ``=`` is an error."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise FwrlError(f"{what} {item!r} is not KEY=VALUE.")
        if key in out:  # the last would win silently
            raise FwrlError(f"{what} {key} is given twice ({key}={out[key]}, then {key}={value}): give it once.")
        out[key] = value
    return out


def check_ray_address(given: Mapping[str, Any], backend: str) -> None:
    """``--ray-address`` names the Ray cluster of ``--backend ray``'s env workers: with another backend it would
    be ignored silently, so it is an error."""
    if "ray_address" in given and backend != "ray":
        raise FwrlError(f"--ray-address {given['ray_address']} is the cluster of --backend ray's env workers; the "
                        f"backend here is {backend!r}: add --backend ray, or drop --ray-address.")


# ----------------------------------------------------------------------------- train config

def add_train_config_flags(parser: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None,
                           exclude: Iterable[str] = ()) -> None:
    """The flags that make a TrainConfig: --preset, --config, --print-config, one per setting,
    --core-opt and --elstm-grad. ``defaults`` are the command's own (shown in the help)."""
    parser.add_argument("--preset", metavar="NAME|FILE",
                        help="start from a preset (fwrl info --presets lists them) or a YAML file of settings")
    parser.add_argument("--config", metavar="FILE", type=Path,
                        help="YAML file of settings (KEY: VALUE); applied after --preset, before flags")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config (YAML) and exit")
    group = parser.add_argument_group("settings (flags override --preset and --config)")
    skip = set(exclude)
    add_setting_flags(group, TrainConfig, [n for n in TrainConfig.model_fields if n not in skip], defaults)
    group.add_argument("--core-opt", action="append", default=[], metavar="KEY=VALUE",
                       help="core option, repeatable (e.g. --core-opt num_layers=4; fwrl info --cores lists them)")
    group.add_argument("--elstm-grad", choices=("bptt", "rtrl"),
                       help="eLSTM training: truncated BPTT or exact RTRL (same as --core-opt grad=...)")
    if "env_wrappers" not in skip:
        group.add_argument("--env-wrapper", dest="env_wrappers", action="append", default=argparse.SUPPRESS,
                           metavar="MODULE:CALLABLE",
                           help=TrainConfig.model_fields["env_wrappers"].description + " (repeatable)")


def train_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig settings given as flags (--core-opt and --elstm-grad as core_options)."""
    overrides = given_settings(args, TrainConfig)
    core_options: dict[str, Any] = parse_key_values(args.core_opt, "--core-opt")
    if args.elstm_grad:
        if core_options.get("grad", args.elstm_grad) != args.elstm_grad:
            raise FwrlError(f"--elstm-grad {args.elstm_grad} and --core-opt grad={core_options['grad']} set the same "
                            "option (the eLSTM's training) to different values: give one of them.")
        core_options["grad"] = args.elstm_grad
    if core_options:
        overrides["core_options"] = core_options
    return overrides


def check_elstm_grad(args: argparse.Namespace, core: Any) -> None:
    """``--elstm-grad`` sets how an eLSTM trains: with another core it is an error that says so
    (rather than an unknown core option ``grad``)."""
    grad = getattr(args, "elstm_grad", None)
    if grad and core != "elstm":
        raise FwrlError(f"--elstm-grad {grad} applies to --core elstm only, and the core here is {core!r}; drop "
                        "--elstm-grad, or pass --core elstm.")


def train_config_from_args(args: argparse.Namespace, base: Mapping[str, Any] | None = None,
                           check_env: bool = False) -> TrainConfig:
    """``base`` (a command's own defaults) < --preset < --config < flags, validated; with
    ``check_env``, the env (and the libraries it needs) is checked first, before torch is imported
    (:func:`~fwrl.settings.config.check_env_first`)."""
    settings = layered_settings(args.preset, train_overrides(args), args.config, base)
    check_elstm_grad(args, settings.get("core", TrainConfig.model_fields["core"].default))
    if check_env:
        check_env_first(settings)
    return TrainConfig.from_dict(settings)
