"""Env spec strings: ``family:name[+name...][?key=value&key=value]``.

Examples: ``atari:Pong``, ``procgen:bigfish?distribution=easy&num_levels=200``,
``procgen:bigfish+fruitbot`` (multi-task: worker i runs game i mod n),
``dmlab:rooms_watermaze``, ``gym:CartPole-v1``, ``memory:cue_delay?delay=40``.

Parsing only splits the string; each family (``fwrl.envs.registry``) checks
names and options and refuses bad ones with the list of valid choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from fwrl.errors import FwrlError, unknown_choice
from fwrl.utils.settings import parse_value, show


@dataclass(frozen=True)
class EnvSpec:
    family: str
    names: tuple[str, ...]
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        out = f"{self.family}:{'+'.join(self.names)}"
        if self.options:
            out += "?" + "&".join(f"{k}={v}" for k, v in self.options.items())
        return out

    @property
    def num_tasks(self) -> int:
        return len(self.names)

    def name_for_worker(self, worker_index: int) -> str:
        """Multi-task assignment: worker i runs game i mod n."""
        return self.names[worker_index % len(self.names)]

    def with_options(self, **options: Any) -> "EnvSpec":
        merged = dict(self.options)
        merged.update({k: str(v) for k, v in options.items()})
        return EnvSpec(self.family, self.names, merged)


def parse_env_spec(text: str) -> EnvSpec:
    """Split a spec string; raises FwrlError with the expected form on malformed input."""
    form = "expected FAMILY:NAME[+NAME...][?KEY=VALUE&KEY=VALUE], e.g. atari:Pong"
    if ":" not in text:
        raise FwrlError(f"env spec {text!r} has no family; {form}.")
    family, rest = text.split(":", 1)
    names_part, _, query = rest.partition("?")
    names = tuple(n for n in names_part.split("+"))
    if not family or not names_part or any(not n for n in names):
        raise FwrlError(f"env spec {text!r} is malformed; {form}.")
    options: dict[str, str] = {}
    if query:
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            if not eq or not key:
                raise FwrlError(f"env option {item!r} in {text!r} is not KEY=VALUE; {form}.")
            if key in options:
                raise FwrlError(f"env option {key!r} is given twice in {text!r}.")
            options[key] = value
    return EnvSpec(family, names, options)


@dataclass(frozen=True)
class Option:
    """One option of an env family: its type, default, help and allowed values.

    ``type`` is int, float, bool or str (read by :func:`fwrl.utils.settings.parse_value`,
    the rules of every fwrl setting) or a function of the option's text that
    raises ValueError for a bad one (e.g. ``parse_size``).
    """

    type: Callable[[str], Any]
    default: Any
    help: str = ""
    choices: Sequence[Any] | None = None


def parse_options(spec: EnvSpec, schema: Mapping[str, Option]) -> dict[str, Any]:
    """Typed options for ``spec`` from ``schema``; unknown keys and bad values are errors."""
    out = {key: opt.default for key, opt in schema.items()}
    for key, raw in spec.options.items():
        if key not in schema:
            raise unknown_choice(f"option for {spec.family} envs", key, schema)
        opt = schema[key]
        label = f"env option {key}={show(raw)} in {spec.text!r}"
        if opt.type in (int, float, bool, str):
            value = parse_value(opt.type, raw, label)
        else:
            try:
                value = opt.type(raw)
            except (TypeError, ValueError):
                type_name = getattr(opt.type, "__name__", str(opt.type))
                raise FwrlError(f"{label} is not valid; valid: a {type_name}. {key}: {opt.help}.") from None
        if opt.choices is not None and value not in opt.choices:
            raise unknown_choice(f"value for env option {key}", value, opt.choices)
        out[key] = value
    return out
