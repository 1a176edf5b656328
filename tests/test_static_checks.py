"""The linter, the formatter and the type checker, as CI runs them: clean on opto/ (and
the examples, which users copy from). Their settings are in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing_to_lint() -> None:
    done = _run("ruff", "check", "opto", "examples")
    assert done.returncode == 0, done.stdout[-5000:]


def test_ruff_finds_nothing_to_reformat() -> None:
    done = _run("ruff", "format", "--check", "opto", "examples")
    assert done.returncode == 0, done.stdout[-5000:]


def test_mypy_finds_no_type_error() -> None:
    done = _run("mypy")
    assert done.returncode == 0, done.stdout[-5000:]
    assert "Success: no issues found" in done.stdout


def test_train_and_atrain_take_the_same_options_in_their_signatures() -> None:
    import inspect

    from opto import AggregatedUpdate, Minibatch

    for trainer in (Minibatch, AggregatedUpdate):
        sync, asynchronous = inspect.signature(trainer.train), inspect.signature(trainer.atrain)
        assert list(sync.parameters) == list(asynchronous.parameters)
        assert [p.default for p in sync.parameters.values()] == [p.default for p in asynchronous.parameters.values()]
        assert len(sync.parameters) >= 20 and "budget" in sync.parameters
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sync.parameters.values())
    documented = inspect.getdoc(Minibatch.atrain) or ""
    options = [name for name in inspect.signature(Minibatch.atrain).parameters if name != "self"]
    assert [name for name in options if f"    {name}: " not in documented] == []


def test_every_public_module_says_what_it_exports() -> None:
    # A module whose name has no leading underscore is public: it declares __all__.
    import ast

    undeclared = []
    for path in sorted((ROOT / "opto").rglob("*.py")):
        if any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(ROOT / "opto").parts):
            continue  # a private module, or any module of a private package
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(target, ast.Name)}  # fmt: skip
        if "__all__" not in names:
            undeclared.append(str(path.relative_to(ROOT)))
    assert undeclared == []
