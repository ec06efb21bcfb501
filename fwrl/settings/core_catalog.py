"""The memory cores, their summaries and options, without importing torch.

The cores live in ``fwrl.memory_modules``, whose modules import torch (a few
seconds). ``fwrl info`` (the core list) and the first check of ``--core`` and
its options (each option's type, choices and bounds: an unknown option or a bad
value is said before torch is imported; the checks across options stay the
registry's) read this catalogue instead: ``core_catalog.json`` beside this module, written
from the registry by ``python -m fwrl.settings.core_catalog``. It carries a
fingerprint of the sources the core configs are built from
(:data:`SOURCES`); where they changed since it was written (a core or an
option added or edited), the catalogue is not used and the registry is
imported instead, so the answer is always the registry's, only slower, and
``tests/e2e/test_answers_without_torch.py`` says to write the file again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping

PACKAGE = Path(__file__).resolve().parents[1]  # fwrl/
CATALOGUE = Path(__file__).with_name("core_catalog.json")
# what the cores' names, summaries and option models are built from (relative to fwrl/; a
# folder stands for its .py files, a pattern with * for the files it matches)
SOURCES = ("memory_modules", "kernels/__init__.py", "kernels/dispatch.py", "kernels/feature_maps.py",
           "kernels/*/naive.py", "utils/settings.py")


def fingerprint() -> str:
    """sha256 of the :data:`SOURCES` (paths and contents, in order)."""
    digest = hashlib.sha256()
    for source in SOURCES:
        path = PACKAGE / source
        files = (sorted(PACKAGE.glob(source)) if "*" in source
                 else sorted(path.rglob("*.py")) if path.is_dir() else [path])
        for file in files:
            digest.update(file.relative_to(PACKAGE).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def live_catalogue() -> dict[str, Any]:
    """The catalogue read from the registry (imports ``fwrl.memory_modules``, hence torch)."""
    from fwrl.memory_modules import core_config_class, core_names
    from fwrl.memory_modules.base import core_summary
    from fwrl.utils.settings import valid_text

    cores = []
    for name in core_names():
        cls = core_config_class(name)
        options = [{"name": option, "default": str(info.default), "valid": valid_text(info),
                    "description": info.description or "", **_option_type(info)}
                   for option, info in cls.model_fields.items()]
        cores.append({"name": name, "summary": core_summary(name), "options": options})
    return {"fingerprint": fingerprint(), "cores": cores}


def _option_type(info) -> dict[str, Any]:
    """What an option accepts, as JSON: ``type`` (int, float, bool, str), ``optional`` (None too),
    ``choices`` (a Literal's values) and ``bounds`` (ge, gt, le, lt)."""
    import types
    import typing

    from annotated_types import Ge, Gt, Le, Lt

    from fwrl.utils.settings import base_type, choices_of

    annotation = info.annotation
    optional = (typing.get_origin(annotation) in (typing.Union, types.UnionType)
                and type(None) in typing.get_args(annotation))
    choices = choices_of(annotation)
    kind = base_type(annotation)
    bounds = {key: getattr(m, key) for m in info.metadata for key in ("ge", "gt", "le", "lt")
              if isinstance(m, (Ge, Gt, Le, Lt)) and hasattr(m, key)}
    return {"type": "str" if choices is not None else kind.__name__, "optional": optional,
            "choices": list(choices) if choices is not None else None, "bounds": bounds}


@lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The shipped catalogue where its fingerprint matches the sources, else :func:`live_catalogue`."""
    try:
        data = json.loads((resources.files("fwrl.settings") / CATALOGUE.name).read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and data.get("fingerprint") == fingerprint():
        return data
    return live_catalogue()


def core_names() -> list[str]:
    """The registered cores' names, sorted (as ``fwrl.memory_modules.core_names``)."""
    return [core["name"] for core in catalogue()["cores"]]


def option_names(core: str) -> list[str]:
    """The options of ``core`` (a registered core's name), in the registry's order."""
    return [option["name"] for option in _core(core)["options"]]


def check_core_options(core: str, options: Mapping[str, Any] | None) -> None:
    """Refuse an unknown option of ``core`` or a value of the wrong type, out of its bounds or not
    one of its choices, with the registry's message, without importing torch. The checks across
    options (e.g. heads that split the hidden size) are left to the registry's config class."""
    _options_model(core).parse(dict(options or {}), what="core option", source=f"of core {core}")


def _core(core: str) -> dict[str, Any]:
    for entry in catalogue()["cores"]:
        if entry["name"] == core:
            return entry
    from fwrl.errors import unknown_choice

    raise unknown_choice("core", core, core_names())


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


@lru_cache(maxsize=None)
def _options_model(core: str):
    """A settings model of ``core``'s options built from the catalogue: the same names, types,
    choices, bounds and descriptions as the registry's config class (hence the same messages)."""
    from pydantic import Field, create_model

    from fwrl.utils.settings import Settings

    fields: dict[str, Any] = {}
    for option in _core(core)["options"]:
        kind: Any = Literal[tuple(option["choices"])] if option.get("choices") is not None else _TYPES[option["type"]]
        if option.get("optional"):
            kind = kind | None
        fields[option["name"]] = (kind, Field(None, description=option["description"] or None,
                                              **option.get("bounds", {})))
    return create_model(f"CatalogueOptions_{core}", __base__=Settings, **fields)


def write(path: Path = CATALOGUE) -> Path:
    """Write the catalogue of the registry as it is now."""
    from fwrl.utils.files import atomic_write_text

    atomic_write_text(path, json.dumps(live_catalogue(), indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(f"wrote {write()}", file=sys.stderr)
