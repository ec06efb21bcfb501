"""Every code name ARCHITECTURE.md quotes in backticks is one the repository has.

A backticked span is read as one of three kinds, by its form alone:

- **prose, shell or maths**, not a name: it holds a space (``fwrl train --learners N``, ``[T, B, D]``), or
  any character an identifier or a path cannot hold (``--flag``, ``KEY=value``, ``a|b``, ``T+1``,
  ``family:game?key=value``), or it is a single letter (``T``, ``K``: a symbol of the maths);
- **a path**: it holds a ``/`` or ends in a file suffix (``agents/rollouts.py``, ``fwrl/``, ``naive.py``,
  ``metrics.csv``); ``<placeholder>`` parts stand for any one folder or file;
- **a code name**: an identifier, or identifiers joined by dots (``build_run``, ``Counters``,
  ``Learner.discard``, ``fwrl.kernels.rdn``, ``torch.inference_mode``), with an optional ``()``.

A path resolves when it exists under the repository's root or under ``fwrl/`` (a bare file name: anywhere
under ``fwrl/``); a path that is a file of a run folder and not of the repository (``metrics.csv``,
``.lock``, ``tensorboard/``) resolves when the code spells it as a string. A dotted name resolves through
Python: its head is an importable module, a class the code defines (the rest then a member of that class or
of a class it derives from) or a name the code imports (``nn`` of ``from torch import nn``), and each further
part an attribute. A capitalised name (a class) must be one the code defines (``class``, ``def`` or an
assignment) or imports by that name. Any other identifier resolves when the code has it: a module, a class, a function or method, an
attribute assigned or read, an imported name, or a string the code spells exactly (a step-record column, a
metric, an option's value: the names the code keys data by). "The code" is every Python file under
``fwrl/``, ``tests/`` and ``benchmarks/`` but this one.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
CODE_NAME = re.compile(rf"({IDENTIFIER}(?:\.{IDENTIFIER})*)(?:\(\))?")
PATH = re.compile(r"[A-Za-z0-9_.<>/-]+")
FILE_SUFFIX = re.compile(r"\.(py|md|csv|yaml|yml|json|pt|log|lock|txt|sh|toml|png|npz)$")


def quoted_spans(text: str) -> list[str]:
    """The backticked spans of ``text`` outside fenced code blocks."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


def kind_of(span: str) -> str:
    """``"path"``, ``"name"`` or ``"prose"`` (prose, shell or maths), by the span's form (the module's rules)."""
    if " " in span or len(span) == 1:
        return "prose"
    if ("/" in span or FILE_SUFFIX.search(span)) and PATH.fullmatch(span):
        return "path"
    if CODE_NAME.fullmatch(span):
        return "name"
    return "prose"


@functools.lru_cache(maxsize=None)
def code() -> dict[str, object]:
    """What the code defines and spells, read from its syntax trees."""
    defined: set[str] = set()  # modules, classes, functions, assigned names and attributes
    used: set[str] = set()  # attributes read, names imported
    strings: set[str] = set()
    imports: dict[str, str] = {}  # a name the code imports -> the module or object it binds
    members: dict[str, set[str]] = {}  # class name -> its members (every class of that name)
    bases: dict[str, set[str]] = {}
    files = [*ROOT.glob("fwrl/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]
    for path in (p for p in files if p.resolve() != Path(__file__).resolve()):  # not the names quoted here
        defined.add(path.stem if path.stem != "__init__" else path.parent.name)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defined.add(node.name)
            elif isinstance(node, ast.ClassDef):
                defined.add(node.name)
                own = members.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(b.id for b in node.bases if isinstance(b, ast.Name))
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        own.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        own.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        own.update(t.id for t in item.targets if isinstance(t, ast.Name))
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        own.add(item.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute):
                (defined if isinstance(node.ctx, ast.Store) else used).add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 80:
                strings.add(node.value)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    used.update(imports)
    return {"defined": defined, "used": used, "strings": strings, "imports": imports, "members": members,
            "bases": bases}


def class_members(name: str) -> set[str]:
    """The members of every class called ``name`` and of the classes they derive from (by name)."""
    found, todo, seen = set(), [name], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        found |= code()["members"].get(cls, set())
        todo += code()["bases"].get(cls, set())
    return found


def python_object(dotted: str):
    """The object ``dotted`` names: an importable module, then attributes; None where it does not resolve."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(obj, part):
                return None
            obj = getattr(obj, part)
        return obj
    return None


def resolves(span: str) -> bool:
    """Whether the path or code name ``span`` is one the repository has (the module's rules)."""
    c = code()
    if kind_of(span) == "path":
        pattern = re.sub(r"<[^>/]+>", "*", span.rstrip("/"))
        wants_dir = span.endswith("/")
        roots = [ROOT, ROOT / "fwrl"] if "/" in span.rstrip("/") else [ROOT, ROOT / "fwrl", *ROOT.glob("fwrl/**/")]
        if any((p.is_dir() if wants_dir else p.exists()) for root in roots for p in root.glob(pattern)):
            return True
        return "/" not in span.rstrip("/") and span.rstrip("/") in c["strings"]  # a file of a run folder
    name = CODE_NAME.fullmatch(span).group(1)
    head, *rest = name.split(".")
    if rest:
        if head in c["members"]:
            return rest[0] in class_members(head) and (len(rest) == 1 or python_object(name) is not None)
        target = c["imports"].get(head, head)
        return python_object(".".join([target, *rest])) is not None
    if head[0].isupper():
        return head in c["defined"] or head in c["imports"]
    return head in c["defined"] or head in c["used"] or head in c["strings"]


def test_the_rules_tell_names_paths_and_prose_apart():
    assert [kind_of(s) for s in ("build_run", "Learner.discard", "train()", "fwrl.kernels.rdn")] == ["name"] * 4
    assert [kind_of(s) for s in ("agents/rollouts.py", "fwrl/", "naive.py", "kernels/<rule>/__init__.py",
                                 "metrics.csv", ".lock")] == ["path"] * 6
    assert [kind_of(s) for s in ("--acting-threads", "fwrl train --learners N", "[T, B, D]", "T+1", "K",
                                 "FWRL_KERNELS=reference|triton|cpu", "family:game?key=value", "writes=N",
                                 '("step", split)')] == ["prose"] * 9


def test_a_broken_name_does_not_resolve():
    """The check can fail: names and paths the repository does not have are told as such."""
    assert resolves("Learner.discard") and resolves("envs/step_record.py") and resolves("kernels/<rule>/naive.py")
    for broken in ("Learner.discard_all", "NoSuchLoop", "envs/step_records.py", "fwrl.kernels.no_rule",
                   "kernels/<rule>/slow.py", "no_such_function_anywhere", "torch.no_such_mode"):
        assert not resolves(broken), broken


def test_every_name_architecture_md_quotes_resolves():
    spans = [s for s in dict.fromkeys(quoted_spans(ARCHITECTURE.read_text())) if kind_of(s) != "prose"]
    assert len(spans) > 100
    broken = [s for s in spans if not resolves(s)]
    assert not broken, f"names ARCHITECTURE.md quotes that the repository does not have: {broken}"


@pytest.mark.parametrize("span", ["nn.GRU", "torch.inference_mode", "Core.python_recurrence", "tests/<tier>/"])
def test_names_of_other_packages_resolve_through_python(span):
    assert resolves(span)
