"""One error contract: every error opto raises on purpose is an `OptoError`.

Two checks: opto's public entry points called with a battery of bad arguments (each must
raise an `OptoError` that is still the built-in type a caller may catch), and the source
read for `raise` statements of bare built-in exceptions, which would break the contract.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from world import LevelAgent, dataset, make_brain

import opto
from opto import (
    AggregatedUpdate,
    Budget,
    DataLoader,
    Demos,
    ExactMatchGuide,
    LLMJudgeGuide,
    MaxCalls,
    MaxCost,
    MaxTime,
    NoImprovement,
    OpenAIModel,
    Optimizer,
    OptoError,
    Parameter,
    PromptTemplate,
    RunDir,
    ScriptedModel,
    TargetScore,
    assign,
    collect,
    evaluate,
    load_dataset,
)
from opto.datasets import bigbench
from opto.executors import WorkerError, WorkerLost
from opto.finetune import OpenAIFineTuneAdapter, switch_model
from opto.llm import LLMError
from opto.core.stats import paired_change
from opto.recipes.prompts_then_weights import prompts_then_weights

PACKAGE = Path(opto.__file__).resolve().parent


def _trainer(**options: Any) -> AggregatedUpdate:
    agent = LevelAgent(ScriptedModel(lambda messages: "0"))
    return AggregatedUpdate(agent, Optimizer(make_brain()), **options)


def _train(**options: Any) -> Any:
    return _trainer().train(ExactMatchGuide(), dataset([0, 1]), progress=False, **options)


def _agent() -> LevelAgent:
    return LevelAgent(ScriptedModel(lambda messages: "0"))


BAD_CALLS: dict[str, tuple[Callable[[], Any], type[Exception]]] = {
    "trainer: unknown selection": (lambda: _trainer(selection="best"), ValueError),
    "trainer: unknown candidates": (lambda: _trainer(candidates="all"), ValueError),
    "trainer: unknown proposals": (lambda: _trainer(proposals="many"), ValueError),
    "trainer: zero concurrency": (lambda: _trainer(concurrency=0), ValueError),
    "trainer: no proposer": (lambda: AggregatedUpdate(_agent(), []), ValueError),
    "train: batch size 0": (lambda: _train(batch_size=0), ValueError),
    "train: resume without run_dir": (lambda: _train(resume=True), ValueError),
    "train: dataset a number": (lambda: _trainer().train(ExactMatchGuide(), 42, progress=False), ValueError),
    "train: empty dataset": (lambda: _trainer().train(ExactMatchGuide(), [], progress=False), ValueError),
    "evaluate: zero concurrency": (
        lambda: evaluate(_agent(), ExactMatchGuide(), dataset([0]), concurrency=0),
        ValueError,
    ),
    "collect: zero samples": (
        lambda: collect(_agent(), ExactMatchGuide(), dataset([0]), run_dir="/tmp/never-made", samples=0),
        ValueError,
    ),
    "load_dataset: missing file": (lambda: load_dataset("/nonexistent/data.jsonl"), FileNotFoundError),
    "load_dataset: a number": (lambda: load_dataset(3.5), ValueError),
    "DataLoader: batch size 0": (lambda: DataLoader(dataset([0]), batch_size=0), ValueError),
    "bigbench: unknown task": (lambda: bigbench("no_such_task"), ValueError),
    "Parameter: bad constraint": (lambda: Parameter("x", constraint=42), TypeError),
    "assign: a key neither name nor Parameter": (lambda: assign({42: "1"}).__enter__(), TypeError),
    "Agent.assign: unknown parameter": (lambda: _agent().assign({"nope": "1"}).__enter__(), KeyError),
    "Demos: negative size": (lambda: Demos(max_demos=-1), ValueError),
    "Budget: negative cost": (lambda: Budget(max_cost_usd=-1), ValueError),
    "MaxCalls: zero": (lambda: MaxCalls(0), ValueError),
    "MaxCost: negative": (lambda: MaxCost(-1.0), ValueError),
    "MaxTime: negative": (lambda: MaxTime(-1.0), ValueError),
    "NoImprovement: zero steps": (lambda: NoImprovement(0), ValueError),
    "TargetScore: not a number": (lambda: TargetScore("high"), ValueError),
    "RunDir: a file": (lambda: RunDir(__file__), ValueError),
    "PromptTemplate: broken Jinja": (lambda: PromptTemplate("{{ unclosed"), ValueError),
    "ScriptedModel: a single string": (lambda: ScriptedModel("hello"), TypeError),
    "ScriptedModel: a reply of the wrong type": (
        lambda: asyncio.run(ScriptedModel([42]).complete([{"role": "user", "content": "hi"}])),
        TypeError,
    ),
    "OpenAIModel: zero concurrency": (
        lambda: OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key="k", max_concurrency=0),
        ValueError,
    ),
    "LLMJudgeGuide: out_of zero": (lambda: LLMJudgeGuide(ScriptedModel(["1"]), "good?", out_of=0), ValueError),
    "switch_model: not a result": (lambda: switch_model(_agent(), 42), TypeError),
    "fine-tuning: unknown method": (lambda: OpenAIFineTuneAdapter("m", method="rlhf"), ValueError),
    "prompts_then_weights: unknown method": (
        lambda: prompts_then_weights(run_dir="/tmp/never-made", method="ppo"),
        ValueError,
    ),
    "paired_change: lengths differ": (lambda: paired_change([1.0], [1.0, 0.0]), ValueError),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_a_bad_argument_raises_an_opto_error_of_the_builtin_type(name: str) -> None:
    call, builtin = BAD_CALLS[name]
    with pytest.raises(Exception) as caught:
        call()
    assert isinstance(caught.value, OptoError), f"{name}: {type(caught.value).__mro__}"
    assert isinstance(caught.value, builtin), f"{name}: {type(caught.value).__mro__} is no {builtin.__name__}"
    assert str(caught.value), f"{name}: an error with no message"


def test_worker_errors_and_model_errors_are_opto_errors() -> None:
    for kind in (WorkerLost, WorkerError, LLMError, *_model_error_classes()):
        assert issubclass(kind, OptoError), kind
    assert issubclass(WorkerError, RuntimeError)


def _model_error_classes() -> list[type]:
    import opto.llm.errors as errors

    return [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]


# Built-in exceptions a raise may still name, each for a reason that does not reach a user.
ALLOWED_BUILTIN_RAISES = {
    "NotImplementedError",  # abstract methods: the subclass's author meets it, not a user
    "AssertionError",  # "unreachable" markers
    "AttributeError",  # a module's __getattr__ must raise this exact type
    "RuntimeError",  # stop_on_sigterm's internal signal that a handler is not ours to install
    "StopIteration",
    "StopAsyncIteration",
    "KeyboardInterrupt",
    "SystemExit",
}
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _raised_names(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                found.append((target.id, node.lineno))
    return found


def test_opto_raises_no_bare_builtin_exception() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name, line in _raised_names(ast.parse(path.read_text(encoding="utf-8"))):
            if name in BUILTIN_EXCEPTIONS and name not in ALLOWED_BUILTIN_RAISES:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} raise {name}")
    assert offenders == [], "raise an OptoError subclass instead (opto/errors.py):\n" + "\n".join(offenders)


def test_the_source_check_finds_a_bare_builtin_raise() -> None:
    tree = ast.parse("def f(x):\n    if x:\n        raise ValueError('bad')\n    raise OptoValueError('ok')\n")
    assert sorted(_raised_names(tree)) == [("OptoValueError", 4), ("ValueError", 3)]


def test_every_exception_class_opto_defines_is_an_opto_error() -> None:
    # Except those raised and caught inside one worker process, never seen by a caller.
    internal = {"Cancelled", "RemoteError", "_MalformedReply"}
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name not in internal | {"OptoError"}:
                bases = {base.id for base in node.bases if isinstance(base, ast.Name)}
                if bases & BUILTIN_EXCEPTIONS and not any("Error" in b and b not in BUILTIN_EXCEPTIONS for b in bases):
                    if "OptoError" not in bases:
                        strays.append(f"{path.relative_to(PACKAGE.parent)}: class {node.name}({', '.join(bases)})")
    assert strays == []
