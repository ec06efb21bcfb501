"""Typed settings: every setting is defined once, with type, default, valid range and help.

fwrl's configurations (training, each memory core, evaluation, plots, env
spec options) are pydantic models deriving from :class:`Settings`, or single
values checked by :func:`parse_value`. The command line, presets, YAML files
and ``--resume`` all go through them, and a bad value becomes one
:class:`~fwrl.errors.FwrlError` that names the setting, the value and what is
valid, e.g. ``setting discount=1.5 is not valid: input should be less than or
equal to 1; valid: a number with 0 <= x <= 1. discount: discount factor gamma.``

Input rules (the same for command-line strings and YAML values):

- integers: ``"8"``, ``"5e7"`` or ``5.0e7`` (whole numbers); ``"2.5"``, ``2.5``
  and booleans are refused;
- numbers: finite (``nan`` and ``inf`` are refused), booleans refused;
- booleans: true/false, yes/no, on/off, 1/0;
- choices: ``Literal[...]`` annotations; an unknown value lists the valid ones.
"""

from __future__ import annotations

import copy
import types
import typing
from functools import lru_cache
from typing import Any, Literal, Mapping, TypeVar

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from fwrl.errors import FwrlError

S = TypeVar("S", bound="Settings")

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
_NOUNS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def base_type(annotation: Any) -> Any:
    """``int`` for ``int | None`` (and ``Optional[int]``); the annotation itself otherwise."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def choices_of(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a ``Literal[...]`` annotation (None for other types)."""
    annotation = base_type(annotation)
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    return None


def prepare_input(annotation: Any, value: Any) -> Any:
    """Refuse booleans for numbers; read whole numbers written as ``5e7``; refuse fractions for ints."""
    kind = base_type(annotation)
    if kind in (int, float) and isinstance(value, bool):
        raise PydanticCustomError("bool_for_number", "a boolean is not a number")
    if kind is int and isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            return value  # pydantic reports it
        if number.is_integer():
            return int(number)
        raise PydanticCustomError("int_fraction", "a whole number is needed")
    return value


class Settings(BaseModel):
    """Base of fwrl's settings models: unknown keys are errors, numbers are finite,
    integers whole (see the module docstring). ``parse`` turns validation errors
    into one FwrlError."""

    model_config = _STRICT

    @field_validator("*", mode="before")
    @classmethod
    def _prepare(cls, value: Any, info: ValidationInfo) -> Any:
        return prepare_input(cls.model_fields[info.field_name].annotation, value)

    @classmethod
    def parse(cls: type[S], data: Mapping[str, Any] | None = None, what: str = "setting",
              source: str = "") -> S:
        """Validate ``data`` (strings or typed values); FwrlError names the bad setting.

        ``what`` names a setting in messages ("core option"), ``source`` says
        where the values came from ("in my.yaml").
        """
        data = dict(data or {})
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise settings_error(exc, cls, what, source) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain values (YAML- and ``torch.load(weights_only=True)``-safe)."""
        return self.model_dump()


def redefault(base: type[BaseModel], name: str, default: Any) -> Any:
    """The field ``name`` of ``base`` with another default: type range and help stay defined once.

    Use in a subclass: ``num_heads: int = redefault(FWPConfig, "num_heads", 8)``.
    """
    info = copy.copy(base.model_fields[name])
    info.default = default
    return info


# --------------------------------------------------------------------------- describing a setting

def range_text(info: FieldInfo) -> str:
    """``0 <= x <= 1``, ``x >= 1``, ``x > 0`` from a field's bounds ('' if none)."""
    low = high = None
    for m in info.metadata:
        if isinstance(m, Ge):
            low = (">=", m.ge)
        elif isinstance(m, Gt):
            low = (">", m.gt)
        elif isinstance(m, Le):
            high = ("<=", m.le)
        elif isinstance(m, Lt):
            high = ("<", m.lt)
    if low and high and low[1] == high[1] and (low[0], high[0]) == (">=", "<="):
        return f"x = {_number(low[1])}"
    if low and high:
        return f"{_number(low[1])} {low[0].replace('>', '<')} x {high[0]} {_number(high[1])}"
    if low or high:
        op, bound = low or high
        return f"x {op} {_number(bound)}"
    return ""


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def valid_text(info: FieldInfo) -> str:
    """What a field accepts, in words: 'an integer with x >= 1', 'one of a, b', 'true or false'."""
    choices = choices_of(info.annotation)
    if choices is not None:
        return "one of " + ", ".join(str(c) for c in choices)
    kind = base_type(info.annotation)
    noun = _NOUNS.get(kind) or f"a {getattr(kind, '__name__', str(kind))}"
    bounds = range_text(info)
    return f"{noun} with {bounds}" if bounds else noun


def show(value: Any) -> str:
    """A value as the user typed it: bare where that is unambiguous, quoted otherwise."""
    if isinstance(value, str) and value and value.isprintable() and not any(c.isspace() for c in value):
        return value
    return repr(value)


def settings_error(exc: ValidationError, cls: type[BaseModel], what: str = "setting",
                   source: str = "") -> FwrlError:
    """One FwrlError for the first problem of a pydantic validation error of ``cls``."""
    where = f" {source}" if source else ""
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else ""
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        valid = ", ".join(sorted(cls.model_fields))
        return FwrlError(f"unknown {what} {name!r}{where}; valid choices: {valid}.")
    info = cls.model_fields.get(name)
    if err["type"] == "literal_error" and info is not None:
        choices = ", ".join(str(c) for c in choices_of(info.annotation) or ())
        return FwrlError(f"unknown value {value!r} for {what} {name}{where}; valid choices: {choices}.")
    message = err["msg"].removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    valid = ""
    if info is not None:
        valid = f"; valid: {valid_text(info)}" + (f". {name}: {info.description}" if info.description else "")
    label = f"{what} {name}={show(value)}" if name else what
    return FwrlError(f"{label}{where} is not valid: {message}{valid}.")


# --------------------------------------------------------------------------- single values

@lru_cache(maxsize=None)
def _adapter(kind: type) -> TypeAdapter:
    return TypeAdapter(kind, config=ConfigDict(allow_inf_nan=False))


def parse_value(kind: Any, raw: Any, label: str) -> Any:
    """``raw`` (often a string) as a ``kind`` (int, float, bool, str or a Literal) by the rules above.

    ``label`` names the setting and value in the message, e.g. "env option delay=x in 'memory:...'".
    """
    choices = choices_of(kind)
    valid = "one of " + ", ".join(map(str, choices)) if choices else _NOUNS.get(kind, str(kind))
    try:
        return _adapter(kind).validate_python(prepare_input(kind, raw))
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
    except PydanticCustomError as exc:
        message = exc.message()
    raise FwrlError(f"{label} is not valid: {message[0].lower() + message[1:]}; valid: {valid}.")
