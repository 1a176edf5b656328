"""opto's modules form no import circle: every module-level and function-level import
between two of them points one way (imports under `if TYPE_CHECKING:` aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import opto

PACKAGE = Path(opto.__file__).parent


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at `root`."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, at any depth, except in TYPE_CHECKING blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                found += _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append(child)
        found += _imports(child)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Which of the package's modules each of its modules imports."""
    known = modules(root)
    top = root.name

    def owner(name: str) -> str:  # the module that defines `name` (a module, or a name in one)
        while name not in known:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names if a.name.split(".")[0] == top}
                continue
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != top:
                continue
            targets |= {f"{source}.{a.name}" if f"{source}.{a.name}" in known else owner(source) for a in node.names}
        graph[name] = targets - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_opto_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "opto.ledger" in graph["opto.trainer.minibatch"]  # the graph was really read
    assert circles(graph) == []


def test_the_base_of_callbacks_imports_nothing_above_it():
    # opto.errors imports nothing of opto: it is the floor every module may stand on.
    graph = import_graph(PACKAGE)
    assert not graph["opto.errors"]
    assert graph["opto.callbacks"] <= {"opto.errors"}, "opto.callbacks must stay at the bottom of the layers"


def test_the_check_finds_a_circle_made_by_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .low import thing\n")
    (package / "sub" / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                            "    from ..high import typed\n\ndef thing():\n    from .. import high\n")
    (package / "high.py").write_text("from .sub.low import thing\n")
    (package / "side.py").write_text("import pkg.high\nif TYPE_CHECKING:\n    from .sub import low\n")
    graph = import_graph(package)
    assert graph["pkg.sub.low"] == {"pkg.high"} and graph["pkg.side"] == {"pkg.high"}
    assert circles(graph) == [["pkg.high", "pkg.sub.low"]]
