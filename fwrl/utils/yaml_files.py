"""YAML files the user writes (``--config``, ``--preset FILE``, a sweep's ``--grid``): read with
:func:`read_yaml`, whose errors name the file, the line and the column (1-based, as editors count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fwrl.errors import FwrlError


def yaml_problem(exc: yaml.YAMLError) -> str:
    """``line L, column C: <problem> (<context> at line L', column C')`` for a YAML syntax error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return problem
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        text += f" ({context}"
        if context_mark is not None and (context_mark.line, context_mark.column) != (mark.line, mark.column):
            text += f" at line {context_mark.line + 1}, column {context_mark.column + 1}"
        text += ")"
    return text


def read_yaml(path: Path, what: str) -> Any:
    """The data of YAML file ``path``; a FwrlError (``cannot read <what> <path>: ...``) when it cannot
    be read or parsed, with the line and column of a syntax error."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise FwrlError(f"cannot read {what} {path}: {yaml_problem(exc)}.") from None
    except UnicodeDecodeError:
        raise FwrlError(f"cannot read {what} {path}: it is not a text file (its bytes are not UTF-8); pass a "
                        "YAML file.") from None
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise FwrlError(f"cannot read {what} {path}: {reason}.") from None
