"""The package's import graph has no cycles: not between modules, and not between the top-level
subpackages (radixlm.core, radixlm.sampling, radixlm.layers, ...), so each package can be read
and tested from the bottom up. Read from the source with `ast` (function-level imports count;
imports under `if TYPE_CHECKING:` are annotations only and are checked separately)."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "python" / "radixlm"

# Cycles that exist only through annotations (`if TYPE_CHECKING:` imports): none are left. They
# do not break imports, but each marks two modules that know each other; the architecture work removes them
# one by one. A new one must not appear; a removed one must be taken off this list.
KNOWN_ANNOTATION_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = ("radixlm",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(with_annotations: bool) -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped: set[int] = set()
        if not with_annotations:
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and _is_type_checking(node):
                    skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from radixlm.x import y`: y may be a module of package x, else a name in x.
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                           else node.module for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:   # Tarjan's algorithm; the graph is a few hundred nodes
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
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_graph_is_read():
    graph = import_graph(with_annotations=False)
    assert "radixlm.sampling.params" in graph["radixlm.managers.messages"]
    assert "radixlm.core.forward_batch" in graph["radixlm.models.llama"]


def test_no_module_cycles():
    assert strongly_connected(import_graph(with_annotations=False)) == []


def test_no_cycles_between_subpackages():
    packages: dict[str, set[str]] = collections.defaultdict(set)
    for src, targets in import_graph(with_annotations=False).items():
        packages[subpackage(src)] |= {subpackage(t) for t in targets} - {subpackage(src)}
    # The root package's __init__ lazily exposes the public API; it may import anything, and
    # no subpackage imports it (they import radixlm.envs, radixlm.version, ... directly).
    for src in packages:
        assert "radixlm" not in packages[src], f"{src} imports the root package"
    packages.pop("radixlm", None)
    assert strongly_connected(packages) == []


def test_annotation_cycles_are_only_the_known_ones():
    cycles = {frozenset(c) for c in strongly_connected(import_graph(with_annotations=True))}
    assert cycles <= KNOWN_ANNOTATION_CYCLES, cycles - KNOWN_ANNOTATION_CYCLES
    assert KNOWN_ANNOTATION_CYCLES <= cycles, (
        f"cycles gone, take them off the list: {KNOWN_ANNOTATION_CYCLES - cycles}")


def _bound_names(target: ast.AST) -> list[ast.Name]:
    """The names an assignment target binds (`a`, `a, b`, `*a`), not those it reads
    (`x[i] = ...`, `obj.attr = ...` bind nothing at module level)."""
    if isinstance(target, ast.Name):
        return [target]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _bound_names(elt)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names a module defines at its top level (also inside top-level if/try blocks); None
    when it has a module __getattr__ or a star import (then any name may exist)."""
    names: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in _bound_names(t)}
        elif isinstance(node, ast.If) and _is_type_checking(node):
            stack += node.orelse      # (names imported for annotations only do not exist)
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            if isinstance(node, ast.For):
                names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            if isinstance(node, ast.With):
                names |= {n.id for item in node.items if item.optional_vars is not None
                          for n in ast.walk(item.optional_vars) if isinstance(n, ast.Name)}
            stack += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            stack += [s for h in getattr(node, "handlers", []) for s in h.body]
    return names


def test_every_imported_name_exists():
    """`from radixlm.x import y` names a submodule or a top-level name of x, in every module,
    function-level imports included: a renamed helper cannot leave a rarely run module (a
    benchmark) failing at import on the GPU machine."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    defined = {name: _top_level_names(ast.parse(path.read_text()))
               for name, path in paths.items()}
    missing = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith("radixlm")):
                continue
            if node.module not in paths:
                missing.append(f"{name}: no module {node.module}")
                continue
            have = defined[node.module]
            if have is None:
                continue
            missing += [f"{name}: {node.module}.{a.name}" for a in node.names
                        if a.name not in have and f"{node.module}.{a.name}" not in paths]
    assert missing == []
