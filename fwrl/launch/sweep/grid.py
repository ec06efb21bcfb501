"""Sweep grids: axes of settings, settings common to every cell, and the cells they expand to.

A grid comes from a YAML file (``--grid FILE``) and from flags. In the file,
each key is a setting of ``fwrl train`` (the keys of a run's config.yaml, and
``elstm_grad``)::

    env: [minatar:breakout, minatar:asterix]      # a list: an axis, one value per cell
    core: [lstm, {label: elstm-rtrl, core: elstm, elstm_grad: rtrl}]
    seed: [1, 2, 3]
    total_steps: 2000000                          # anything else: common to every cell
    core_options: {hidden_size: 64}               # core options common to every cell that has them

An item of an axis is a value of its setting, or a mapping of several
settings with an optional ``label`` (a cell may then differ in more than one
setting; the axis key of such items may be any name). ``core_options: [...]``
is an axis of core-option mappings; ``env_wrappers`` (itself a list) is an
axis only as a list of lists. On the command line every training flag takes
one or more values (``--core lstm rdn --seed 1 2 3``): several make an axis,
one a common setting; a flag replaces the file's entry of the same setting.

Cells: one per combination of axis items, named from the items' labels
(``minatar-breakout__lstm__seed-1``), each a full :class:`TrainConfig` built as
``fwrl train`` builds one: defaults < ``--preset`` < ``--config`` < common
settings < the cell's axis items, over the env family's defaults for the cell's core
(``fwrl.settings.family_defaults``). Common core options apply to every cell
whose core has them (an option no core of the grid has is an error); a
preset's core options are dropped where a cell picks another core.
"""

from __future__ import annotations

import itertools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from fwrl.errors import FwrlError, unknown_choice
from fwrl.settings.config import TrainConfig, merge_settings, merge_with_per_core
from fwrl.utils.settings import base_type, show
from fwrl.utils.yaml_files import read_yaml

SEPARATOR = "__"  # between the labels of a cell's name
LABEL = "label"
EXTRA_KEYS = ("elstm_grad",)  # keys that are flags of fwrl train, not TrainConfig fields (core_options.grad)
GRID_KEYS = tuple(TrainConfig.model_fields) + EXTRA_KEYS


@dataclass(frozen=True)
class Item:
    """One value of an axis: its label (part of cell names) and the settings it sets."""

    label: str
    settings: dict[str, Any]  # TrainConfig keys; core options under "core_options"


@dataclass(frozen=True)
class Axis:
    """A named list of items; every cell takes one item of every axis."""

    name: str
    items: tuple[Item, ...]


@dataclass
class Grid:
    """Axes, settings common to every cell, and the base layers (preset, config file) under them."""

    axes: list[Axis] = field(default_factory=list)
    common: dict[str, Any] = field(default_factory=dict)  # TrainConfig keys, core options apart
    common_core_options: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)  # --preset < --config, merged as fwrl train does

    def describe(self) -> dict[str, Any]:
        """The grid as plain data (sweep.yaml)."""
        return {"axes": [{"name": a.name, "items": [{"label": i.label, "settings": i.settings} for i in a.items]}
                         for a in self.axes],
                "common": {**self.common, **({"core_options": self.common_core_options}
                                             if self.common_core_options else {})},
                "base": self.base}


@dataclass(frozen=True)
class Cell:
    """One run of the sweep: its name, the label of its item on each axis, and its config."""

    name: str
    labels: dict[str, str]
    config: TrainConfig


# ----------------------------------------------------------------------------- labels

def clean(text: str) -> str:
    """``text`` as part of a folder name: letters, digits, ``_ . = -``; other runs become ``-``."""
    out = re.sub(r"[^A-Za-z0-9_.=-]+", "-", text).strip("-")
    return re.sub(r"_{2,}", "_", out)  # SEPARATOR stays between labels only


def item_label(key: str, value: Any) -> str:
    """The label of a plain axis value: the env spec or core name itself, else ``key-value``."""
    text = show(value).lower() if isinstance(value, bool) else str(value)
    if isinstance(value, list):
        text = "+".join(str(v).rsplit(":", 1)[-1] for v in value) or "none"
    return clean(text if key in ("env", "core") else f"{key}-{text}")


def _bundle_label(settings: Mapping[str, Any]) -> str:
    parts = []
    for key, value in settings.items():
        if key == "core_options":
            parts += [f"{k}-{v}" for k, v in value.items()]
        else:
            parts.append(str(value) if key in ("env", "core") else f"{key}-{value}")
    return clean("-".join(parts)) or "default"


# ----------------------------------------------------------------------------- reading a grid

def _setting_keys(key: Any, source: str) -> str:
    if not isinstance(key, str) or key not in GRID_KEYS:
        raise unknown_choice("setting", key, GRID_KEYS, f"in {source}")
    return key


def _settings_of(key: str, value: Any, source: str) -> dict[str, Any]:
    """``{key: value}`` as TrainConfig settings (``elstm_grad`` becomes the core option ``grad``)."""
    if key == "elstm_grad":
        return {"core_options": {"grad": value}}
    if key == "core_options":
        if not isinstance(value, Mapping):
            raise FwrlError(f"core_options={show(value)} in {source} is not valid: a mapping of core options "
                            "(KEY: VALUE) is needed.")
        return {"core_options": dict(value)}
    return {key: value}


def _bundle(value: Mapping[str, Any], source: str) -> Item:
    """A mapping item of an axis: several settings and an optional label."""
    settings: dict[str, Any] = {}
    label = value.get(LABEL)
    for key, v in value.items():
        if key == LABEL:
            continue
        for k, s in _settings_of(_setting_keys(key, source), v, source).items():
            if k == "core_options":
                settings.setdefault("core_options", {}).update(s)
            else:
                settings[k] = s
    if not settings:
        raise FwrlError(f"an item of {source} sets no setting: {show(dict(value))}.")
    if label is not None and (not isinstance(label, (str, int, float)) or not clean(str(label))):
        raise FwrlError(f"label {label!r} in {source} is not valid: a short name of letters, digits, _ . = -.")
    return Item(clean(str(label)) if label is not None else _bundle_label(settings), settings)


def _is_list_setting(key: str) -> bool:
    kind = base_type(TrainConfig.model_fields[key].annotation) if key in TrainConfig.model_fields else None
    return kind is list or typing.get_origin(kind) is list


def axis_of(key: str, values: Sequence[Any], source: str) -> Axis:
    """The axis ``key: [values]``: plain values of setting ``key``, or mappings of several settings."""
    where = f"axis {key!r} of {source}"
    if not values:
        raise FwrlError(f"{where} is empty; give it at least one value.")
    items = []
    for value in values:
        if key == "core_options":
            if not isinstance(value, Mapping):
                raise FwrlError(f"an item of {where} is {show(value)}, not a mapping of core options.")
            options = {k: v for k, v in value.items() if k != LABEL}
            items.append(_bundle({**({LABEL: value[LABEL]} if LABEL in value else {}), "core_options": options},
                                 where))
        elif isinstance(value, Mapping):
            items.append(_bundle(value, where))
        else:
            if key not in GRID_KEYS:
                raise unknown_choice("setting", key, GRID_KEYS, f"in {source}")
            items.append(Item(item_label(key, value), _settings_of(key, value, where)))
    labels = [i.label for i in items]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise FwrlError(f"{where} has two items labelled {twice[0]!r}; give them distinct labels "
                        f"(label: NAME in a mapping item).")
    return Axis(key, tuple(items))


def read_grid_file(path: Path) -> Grid:
    """The grid of a YAML file (see the module docstring)."""
    path = Path(path)
    source = f"grid file {path}"
    data = read_yaml(path, "grid file")
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise FwrlError(f"{source} is not a mapping of settings (KEY: VALUE or KEY: [VALUES] lines), "
                        f"got {type(data).__name__}.")
    grid = Grid()
    for key, value in data.items():
        is_axis = isinstance(value, list) and (not _is_list_setting(str(key))
                                               or any(isinstance(v, list) for v in value))
        if is_axis:
            if key not in GRID_KEYS and not all(isinstance(v, Mapping) for v in value):
                raise unknown_choice("setting", key, GRID_KEYS, f"in {source}")
            grid.axes.append(axis_of(str(key), value, source))
            continue
        add_common(grid, _setting_keys(key, source), value, source)
    return grid


def add_common(grid: Grid, key: str, value: Any, source: str) -> None:
    """A setting common to every cell of ``grid`` (replacing an axis of the same key)."""
    grid.axes = [a for a in grid.axes if a.name != key]
    for k, v in _settings_of(key, value, source).items():
        if k == "core_options":
            grid.common_core_options.update(v)
        else:
            grid.common[k] = v


def set_axis(grid: Grid, axis: Axis) -> None:
    """Put ``axis`` into ``grid``: in the place of an axis or common setting of the same key, else last."""
    grid.common.pop(axis.name, None)
    names = [a.name for a in grid.axes]
    if axis.name in names:
        grid.axes[names.index(axis.name)] = axis
    else:
        grid.axes.append(axis)


# ----------------------------------------------------------------------------- cells

def _core_option_names(core: str) -> set[str]:
    from fwrl.settings.core_catalog import option_names  # without importing torch

    return set(option_names(core))


def expand(grid: Grid) -> list[Cell]:
    """Every cell of ``grid``, validated as fwrl train validates a config; names unique, configs distinct.
    Cores and their option names come from the core catalogue, and every cell's core is checked before
    any config is built, so a typo is said before torch is imported."""
    from fwrl.settings.core_catalog import core_names
    from fwrl.settings.family_defaults import family_defaults

    combos = list(itertools.product(*(axis.items for axis in grid.axes)))
    planned: list[tuple[str, dict[str, str], str, dict[str, Any]]] = []  # name, labels, source, settings
    cores_seen: set[str] = set()
    for combo in combos:
        labels = {axis.name: item.label for axis, item in zip(grid.axes, combo)}
        name = SEPARATOR.join(labels.values()) or "run"
        source = f"sweep cell {name}" if grid.axes else "the sweep's settings"
        layers: list[Mapping[str, Any]] = [grid.base, grid.common]
        own_options: dict[str, Any] = {}
        for item in combo:
            settings = dict(item.settings)
            own_options.update(settings.pop("core_options", {}))
            layers.append(settings)
        data = merge_with_per_core(layers)  # the preset's settings for the cell's core (per_core) under the grid's
        core = data.get("core", TrainConfig.model_fields["core"].default)
        if core not in core_names():
            raise unknown_choice("core", core, core_names(), f"in {source}")
        data.update(family_defaults(data, data.get("env", TrainConfig.model_fields["env"].default), core))  # the env family's settings for this core, where the grid sets none
        cores_seen.add(core)
        fields = _core_option_names(core)
        common = {k: v for k, v in grid.common_core_options.items() if k in fields}
        data["core_options"] = {**data.get("core_options", {}), **common, **own_options}
        planned.append((name, labels, source, data))
    unused = [k for k in grid.common_core_options if not any(k in _core_option_names(c) for c in cores_seen)]
    if "grad" in unused and "elstm" not in cores_seen:
        raise FwrlError(f"--elstm-grad (elstm_grad) applies to core elstm only, and no cell of this grid has it "
                        f"(cores: {', '.join(sorted(cores_seen))}); drop it, or add elstm to the cores.")
    if unused:
        valid = sorted(set().union(*(_core_option_names(c) for c in cores_seen)))
        raise unknown_choice("core option", unused[0], valid, f"(for the cores of this grid: {', '.join(sorted(cores_seen))})")
    cells = [Cell(name, labels, TrainConfig.from_dict(data, source=source)) for name, labels, source, data in planned]
    check_distinct(cells)
    return cells


def check_distinct(cells: Sequence[Cell]) -> None:
    """Cells have distinct names (folders) and distinct configs (else two runs would repeat one)."""
    by_name: dict[str, Cell] = {}
    by_config: dict[str, str] = {}
    for cell in cells:
        if cell.name in by_name:
            raise FwrlError(f"two cells of the grid are both named {cell.name!r}; give their axis items "
                            "distinct labels (label: NAME in a mapping item).")
        by_name[cell.name] = cell
        key = yaml.safe_dump(cell.config.to_dict(), sort_keys=True)
        if key in by_config:
            raise FwrlError(f"cells {by_config[key]!r} and {cell.name!r} of the grid have the same settings; "
                            "remove one of the items that make them.")
        by_config[key] = cell.name
