"""The package's import graph: layers in one direction, no cycles (imports read with ``ast``).

Layers, lowest first: ``fwrl`` itself, ``fwrl.errors`` and ``fwrl.utils`` <
``envs`` < ``kernels`` < ``memory_modules`` < ``agents`` < ``settings`` (the config
models, presets, core catalogue) < ``evaluation`` < ``runner`` (the training runtime,
which runs periodic evaluations) < ``launch`` (the command line) < ``fwrl.__main__``
(``python -m fwrl``, the command line's entry point). Data flows one way (envs ->
agents -> runner -> launch): a module may import its own layer and lower ones, never a
higher one, and no set of modules imports each other in a circle (imports inside
functions count too: they are cycles all the same).

Inside ``launch``, one folder (or module) per job, in the same one-way order:
``flags`` (the flags built from the settings models) < the commands (``bench``,
``plot``, ``sweep``, ``report``) < ``cli`` < ``entry`` (the console script).

Inside ``kernels`` (which imports nothing of ``memory_modules``, ``agents`` or
``launch``: it is below them), one folder per rule (``fwrl.kernels.<rule>``: its
public function, ``naive``, ``fused_recurrent``, ``cpu``) beside the shared modules
(:data:`KERNEL_SHARED`). A rule's folder imports its own modules, the shared
ones and ``fwrl.errors`` / ``fwrl.utils``, never another rule; the shared
modules import no rule.

Cores call a rule only through its public function (``fwrl.kernels.<rule>``, which picks the
backend): from a rule's own modules a core imports constants alone (UPPER_CASE names).

Runner parts take no run object (``ARCHITECTURE.md``, the runner's parts): inside ``runner``,
only :data:`RUN_READERS` (``train``, which wires the parts) imports ``build`` (whose groups of
parts, ``RunParts``, it reads), and no function outside ``build`` and ``train`` takes a parameter
named ``run`` or annotated ``Run``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Callable


PACKAGE = Path(__file__).resolve().parents[2] / "fwrl"
LAYERS = ("", "errors", "utils", "envs", "kernels", "memory_modules", "agents", "settings", "evaluation", "runner",
          "launch", "__main__")
RANK = {"": 0, "errors": 0, "utils": 0, "envs": 1, "kernels": 2, "memory_modules": 3, "agents": 4, "settings": 5,
        "evaluation": 6, "runner": 7, "launch": 8, "__main__": 9}
# fwrl.launch.<part>: the folders (and single-module commands) of the launch layer, lowest first
LAUNCH_RANK = {"": 0, "flags": 0, "bench": 1, "plot": 1, "inspect_memory": 1, "sweep": 1, "report": 1, "exits": 0,
               "cli": 2, "entry": 3}


# The modules of fwrl.kernels every rule may import (the package itself holds GRAD_MODES)
KERNEL_SHARED = ("fwrl.kernels", "fwrl.kernels.dispatch", "fwrl.kernels.feature_maps", "fwrl.kernels.triton",
                 "fwrl.kernels.triton.common", "fwrl.kernels.cpu_common",
                 "fwrl.kernels.cpu_delta_chunks")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The fwrl modules ``name`` imports (``from fwrl.x import y`` counts y when y is a module)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_module_has_a_layer():
    assert set(RANK) == set(LAYERS)
    unknown = sorted(name for name in MODULES if layer(name) not in RANK)
    assert not unknown, f"modules outside the known layers: {unknown}"


def launch_part(name: str) -> str:
    """``settings`` for ``fwrl.settings.config``; ``""`` for ``fwrl.launch`` itself."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 else ""


def layer_rank(name: str) -> int:
    return RANK[layer(name)]


def launch_rank(name: str) -> int:
    return LAUNCH_RANK[launch_part(name)]


def upward_imports(graph: dict[str, set[str]], rank: Callable[[str], int] = layer_rank) -> list[str]:
    """``importer -> imported`` for every import of a higher layer (by ``rank``)."""
    return sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                  if rank(target) > rank(name))


def test_no_module_imports_a_higher_layer():
    violations = upward_imports(GRAPH)
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_every_launch_module_has_a_part():
    unknown = sorted(name for name in MODULES if layer(name) == "launch" and launch_part(name) not in LAUNCH_RANK)
    assert not unknown, f"launch modules outside the known folders: {unknown}"


def test_launch_folders_import_downwards():
    launch = {name: {t for t in targets if layer(t) == "launch"} for name, targets in GRAPH.items()
              if layer(name) == "launch"}
    violations = upward_imports(launch, launch_rank)
    assert not violations, "launch folders out of order:\n" + "\n".join(violations)


def kernel_rule(name: str) -> str:
    """``rdn`` for ``fwrl.kernels.rdn.naive`` (a module of a rule's folder); ``""`` for a shared module."""
    parts = name.split(".")
    return parts[2] if layer(name) == "kernels" and name not in KERNEL_SHARED and len(parts) > 2 else ""


def kernel_rule_violations(graph: dict[str, set[str]]) -> list[str]:
    """``importer -> imported`` for every import inside ``kernels`` out of the rules' order: a rule's
    module importing another rule or anything above ``utils`` but the shared kernel modules, or a
    shared module importing a rule."""
    found = []
    for name, targets in graph.items():
        if layer(name) != "kernels":
            continue
        rule = kernel_rule(name)
        for target in targets:
            if kernel_rule(target):
                allowed = kernel_rule(target) == rule  # a rule's own folder; never from a shared module
            else:
                allowed = target in KERNEL_SHARED or layer_rank(target) == 0
            if not allowed:
                found.append(f"{name} -> {target}")
    return sorted(found)


def test_every_kernel_module_is_shared_or_in_a_rule_folder():
    kernels = [name for name in MODULES if layer(name) == "kernels"]
    missing = sorted(set(KERNEL_SHARED) - set(kernels))
    assert not missing, f"shared kernel modules not found: {missing}"
    rules = {kernel_rule(name) for name in kernels} - {""}
    assert rules >= {"delta_rule", "rdn", "delta_rnn", "delta_lstm", "srwm", "elstm_rtrl"}, rules
    loose = sorted(name for name in kernels if not kernel_rule(name) and name not in KERNEL_SHARED)
    assert not loose, f"kernel modules neither shared nor in a rule's folder: {loose}"
    for rule in rules:  # a folder (package) with the PyTorch reference that defines its maths
        assert MODULES[f"fwrl.kernels.{rule}"].name == "__init__.py", rule
        assert f"fwrl.kernels.{rule}.naive" in MODULES, f"fwrl/kernels/{rule}/ has no naive.py"


def test_kernel_rules_import_only_shared_kernel_modules():
    violations = kernel_rule_violations(GRAPH)
    assert not violations, "kernel rules out of order:\n" + "\n".join(violations)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_the_checks_catch_cycles_and_upward_imports():
    """The checks themselves, on graphs with the faults this package had (and on the real one)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward_imports({"fwrl.agents.checkpoint": {"fwrl.runner.rundir", "fwrl.utils.files"}}) == [
        "fwrl.agents.checkpoint -> fwrl.runner.rundir"]
    assert {"fwrl.runner.build", "fwrl.runner.acting", "fwrl.runner.learner_loop"} <= GRAPH["fwrl.runner.train"]
    assert "fwrl.utils.files" in GRAPH["fwrl.agents.checkpoint"]  # relative and from-imports resolve
    assert "fwrl.envs.backends" in GRAPH["fwrl.evaluation.episodes"]
    assert upward_imports({"fwrl.launch.flags": {"fwrl.launch.plot"}}, launch_rank) == [
        "fwrl.launch.flags -> fwrl.launch.plot"]
    assert upward_imports({"fwrl.agents.learner": {"fwrl.settings.config"}}) == [
        "fwrl.agents.learner -> fwrl.settings.config"]
    assert kernel_rule_violations({
        "fwrl.kernels.delta_lstm.naive": {"fwrl.kernels.delta_rnn.naive", "fwrl.kernels.feature_maps", "fwrl.errors"},
        "fwrl.kernels.srwm.fused_recurrent": {"fwrl.kernels.srwm.fused_recurrent_split", "fwrl.kernels.triton.common",
                                              "fwrl.envs.spec"},
        "fwrl.kernels.dispatch": {"fwrl.kernels.rdn"}}) == [
        "fwrl.kernels.delta_lstm.naive -> fwrl.kernels.delta_rnn.naive", "fwrl.kernels.dispatch -> fwrl.kernels.rdn",
        "fwrl.kernels.srwm.fused_recurrent -> fwrl.envs.spec"]
    assert {"fwrl.kernels.srwm.fused_recurrent_split", "fwrl.kernels.triton.common", "fwrl.kernels"} <= GRAPH[
        "fwrl.kernels.srwm.fused_recurrent"]  # relative imports inside kernels resolve


# The runner's modules that may read build.py's groups of parts: train() wires the parts from them
RUN_READERS = ("fwrl.runner.build", "fwrl.runner.train")


def run_parameters(tree: ast.AST) -> list[str]:
    """``function(parameter)`` for each parameter named ``run`` or annotated with ``Run``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            for arg in arguments:
                names = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} if arg.annotation else set()
                text = arg.annotation.value if isinstance(arg.annotation, ast.Constant) else ""
                if arg.arg == "run" or "Run" in names or str(text).split("|")[0].strip() == "Run":
                    found.append(f"{node.name}({arg.arg})")
    return found


def run_takers(graph: dict[str, set[str]], trees: dict[str, ast.AST]) -> list[str]:
    """The runner's modules besides :data:`RUN_READERS` that import ``build`` or take a run."""
    faults = [f"{name} -> fwrl.runner.build" for name, targets in sorted(graph.items())
              if layer(name) == "runner" and name not in RUN_READERS and "fwrl.runner.build" in targets]
    faults += [f"{name}: {taker}" for name, tree in sorted(trees.items())
               if layer(name) == "runner" and name not in RUN_READERS for taker in run_parameters(tree)]
    return faults


def test_runner_parts_take_no_run_object():
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items() if layer(name) == "runner"}
    assert run_takers(GRAPH, trees) == []
    # the check itself, on the faults the parts had: a part that imports the Run, or takes one
    assert run_takers({"fwrl.runner.stats": {"fwrl.runner.build", "fwrl.runner.peers"}}, {}) == [
        "fwrl.runner.stats -> fwrl.runner.build"]
    taker = ast.parse("class ActingLoop:\n    def __init__(self, run: Run, stop): pass\n"
                      "def row(run, steps): pass\ndef quoted(x: 'Run | None'): pass\ndef fine(runs: int): pass\n")
    assert sorted(run_takers({}, {"fwrl.runner.acting": taker})) == [
        "fwrl.runner.acting: __init__(run)", "fwrl.runner.acting: quoted(x)", "fwrl.runner.acting: row(run)"]
    assert run_takers({"fwrl.runner.train": {"fwrl.runner.build"}}, {"fwrl.runner.train": taker}) == []


def kernel_reaches(name: str, tree: ast.Module) -> list[str]:
    """What a core module takes from inside a rule's folder other than its public function: any name
    imported from ``fwrl.kernels.<rule>.<module>`` that is not a constant (UPPER_CASE), and any import
    of such a module itself. Cores call a rule only through ``fwrl.kernels.<rule>`` (ARCHITECTURE.md,
    the kernels' paragraph), which picks the backend; they may read its constants (a rule's matrix
    names, input maps)."""
    faults = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[:2] == ["fwrl", "kernels"] and len(parts) > 3 and kernel_rule(node.module):
                faults += [f"{name}: {alias.name} from {node.module}" for alias in node.names
                           if not alias.name.isupper()]
        elif isinstance(node, ast.Import):
            faults += [f"{name}: import {alias.name}" for alias in node.names
                       if alias.name.startswith("fwrl.kernels.") and len(alias.name.split(".")) > 3]
    return faults


def test_cores_call_only_a_rules_public_function():
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()
             if layer(name) == "memory_modules"}
    assert [fault for name, tree in sorted(trees.items()) for fault in kernel_reaches(name, tree)] == []
    # the check itself: a core that calls a backend or the reference directly
    core = ast.parse("from fwrl.kernels.rdn import rdn\nfrom fwrl.kernels.rdn.naive import rdn_reference\n"
                     "from fwrl.kernels.srwm.naive import INPUT_MAPS\nimport fwrl.kernels.delta_rule.cpu\n")
    assert kernel_reaches("fwrl.memory_modules.rdn", core) == [
        "fwrl.memory_modules.rdn: rdn_reference from fwrl.kernels.rdn.naive",
        "fwrl.memory_modules.rdn: import fwrl.kernels.delta_rule.cpu"]
