"""opto's layout: one package per layer, imports pointing down only, no import circle.

Every import counts: module-level, function-level and under `if TYPE_CHECKING:`. LAYERS
is the order, lowest first (docs/architecture.md draws it); a module may import its own
package and any package below it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import opto

PACKAGE = Path(opto.__file__).parent

LAYERS = [
    "opto._version",
    "opto.errors",
    "opto._util",
    "opto.llm",
    "opto.core",
    "opto.datasets",
    "opto.extraction",
    "opto.executors",
    "opto.search",
    "opto.run",
    "opto.trainer",
    "opto.preference",
    "opto.finetune",
    "opto.report",
    "opto.testing",
    "opto.recipes",
    "opto.integrations",
    "opto.cli",
    "opto",  # the package's __init__: it re-exports the public names of every layer
]


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package at `root`."""
    found = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under `node`, at any depth (in functions and under
    `if TYPE_CHECKING:` too)."""
    return [child for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom))]


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


def layer_of(module: str, layers: list[str]) -> int:
    """The index in `layers` of the package (or module) that holds `module`."""
    holders = [name for name in layers if module == name or module.startswith(name + ".")]
    assert holders, f"{module} is in no layer: add its package to LAYERS"
    return layers.index(max(holders, key=len))


def upward_imports(graph: dict[str, set[str]], layers: list[str]) -> list[str]:
    """Every import that points from a layer to one above it."""
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if layer_of(target, layers) > layer_of(module, layers)
    )


def test_opto_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "opto.run.ledger" in graph["opto.trainer.minibatch"]  # the graph was really read
    assert circles(graph) == []


def test_every_import_points_down_the_layers():
    graph = import_graph(PACKAGE)
    assert "opto.run.results" in graph["opto.run.callbacks"]  # TYPE_CHECKING imports are read
    assert upward_imports(graph, LAYERS) == []


def test_the_floor_imports_nothing_of_opto():
    graph = import_graph(PACKAGE)
    assert not graph["opto.errors"] and not graph["opto._version"]


def test_the_top_level_holds_only_entry_points():
    modules = sorted(path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py")
    assert modules == ["_version", "cli", "errors"]
    packages = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists())
    assert ["opto." + name for name in packages] == sorted(name for name in LAYERS if name.count(".") == 1
                                                           and name[5:] in packages)  # fmt: skip


def test_no_module_only_re_exports_names_defined_elsewhere():
    # A package's __init__ may gather its modules' names; a module must define something.
    shims = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        body = [node for node in ast.parse(path.read_text(encoding="utf-8")).body
                if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]  # fmt: skip
        if all(isinstance(node, (ast.Import, ast.ImportFrom)) or _assigns_all(node) for node in body):
            shims.append(str(path.relative_to(PACKAGE)))
    assert shims == []


def _assigns_all(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)


def test_the_layer_check_finds_an_import_that_points_up(tmp_path):
    package = tmp_path / "pkg"
    for folder in ("low", "high"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "high" / "user.py").write_text("from ..low.base import thing\n")
    (package / "low" / "base.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high.user import thing\nthing = 1\n"
    )
    graph = import_graph(package)
    assert upward_imports(graph, ["pkg.low", "pkg.high", "pkg"]) == ["pkg.low.base -> pkg.high.user"]
    assert upward_imports(graph, ["pkg.high", "pkg.low", "pkg"]) == ["pkg.high.user -> pkg.low.base"]


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
    assert graph["pkg.sub.low"] == {"pkg.high"} and graph["pkg.side"] == {"pkg.high", "pkg.sub.low"}
    assert circles(graph) == [["pkg.high", "pkg.sub.low"]]
