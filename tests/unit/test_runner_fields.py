"""No class of the runner holds more than :data:`MAX_FIELDS` fields (issue 72): a part that needs more
is several parts. A class's fields are read with ``ast``: its class-level annotations (a dataclass's
or NamedTuple's fields, an annotated class's attributes; ``ClassVar`` ones aside) and every
``self.<name>`` its methods assign (a plain class's instance attributes), each name once."""

from __future__ import annotations

import ast
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "fwrl" / "runner"
MAX_FIELDS = 12

# Records of results, exempt: each field is one measured figure a report prints, not a collaborator.
RESULT_RECORDS = {
    "fwrl.runner.probe.ProbeResult",  # the init probe's figures (fwrl probe-init's table and JSON)
}


def class_fields(node: ast.ClassDef) -> set[str]:
    """The field names of class ``node`` (module docstring)."""
    fields = set()
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            annotation = ast.unparse(statement.annotation)
            if not annotation.startswith(("ClassVar", "typing.ClassVar")):
                fields.add(statement.target.id)
    for function in node.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(function):
            targets = (inner.targets if isinstance(inner, ast.Assign)
                       else [inner.target] if isinstance(inner, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                for name in ast.walk(target):
                    if (isinstance(name, ast.Attribute) and isinstance(name.value, ast.Name)
                            and name.value.id == "self"):
                        fields.add(name.attr)
    return fields


def oversized(module: str, tree: ast.AST, limit: int = MAX_FIELDS) -> list[str]:
    """``module.Class: n fields (names)`` for each class of ``tree`` with more than ``limit`` fields."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = class_fields(node)
            if len(fields) > limit:
                found.append(f"{module}.{node.name}: {len(fields)} fields ({', '.join(sorted(fields))})")
    return found


def test_no_runner_class_has_more_than_twelve_fields():
    faults = []
    for path in sorted(RUNNER.glob("*.py")):
        module = f"fwrl.runner.{path.stem}"
        faults += [f for f in oversized(module, ast.parse(path.read_text(), str(path)))
                   if f.split(":")[0] not in RESULT_RECORDS]
    assert faults == []


def test_the_count_sees_every_kind_of_field():
    """The check itself: a dataclass's annotations, a NamedTuple's, a plain class's ``self`` attributes
    (tuple targets and augmented ones included), each name once; ``ClassVar`` and methods' locals aside."""
    thirteen = "\n".join(f"    f{i}: int" for i in range(13))
    source = (f"@dataclass\nclass Big:\n{thirteen}\n"
              "class Small(NamedTuple):\n    a: int\n    b: ClassVar[int] = 0\n"
              "class Plain:\n    def __init__(self):\n        self.a, self.b = 1, 2\n        local = 3\n"
              "    def more(self):\n        self.c += 1\n        self.a = 4\n")
    tree = ast.parse(source)
    classes = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    assert class_fields(classes["Small"]) == {"a"}
    assert class_fields(classes["Plain"]) == {"a", "b", "c"}
    assert oversized("m", tree) == [f"m.Big: 13 fields ({', '.join(sorted(f'f{i}' for i in range(13)))})"]
    assert oversized("m", tree, limit=2) == ["m.Big: 13 fields (" + ", ".join(sorted(f"f{i}" for i in range(13)))
                                              + ")", "m.Plain: 3 fields (a, b, c)"]
