"""Agents: objects whose `forward` uses trainable `Parameter`s."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .._util.files import atomic_write_json
from ..errors import OptoKeyError, OptoValueError
from .parameters import Parameter, ParameterError, ParameterValues, assign

__all__ = ["Agent", "agent"]


def _walk(value: Any, path: str, seen: set[int], kind: type = Parameter) -> Iterator[tuple[str, Any]]:
    """Every instance of `kind` reachable from `value`, with its attribute path."""
    if id(value) in seen:
        return
    if isinstance(value, kind):
        seen.add(id(value))
        yield path, value
    elif isinstance(value, Agent):
        seen.add(id(value))
        for attr, child in vars(value).items():
            if not attr.startswith("_"):
                yield from _walk(child, f"{path}.{attr}" if path else attr, seen, kind)
    elif isinstance(value, (list, tuple)):
        for index, child in enumerate(value):
            yield from _walk(child, f"{path}.{index}", seen, kind)
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from _walk(child, f"{path}.{key}", seen, kind)


def find_attributes(agent: Agent, kind: type) -> dict[str, Any]:
    """{attribute path: object} of every `kind` instance the agent holds (as `parameters`
    finds parameters: public attributes, nested agents, lists and dicts)."""
    return dict(_walk(agent, "", set(), kind))


class Agent:
    """Base class of an optimizable agent.

    Subclass it, keep `Parameter`s as attributes (directly, in nested agents, lists or
    dicts) and define `forward(self, x)`, sync or async. When an `Example.x` is a tuple
    or dict and `forward` takes several arguments, it is spread over them.
    """

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} must define forward(self, x)")

    def parameters(self, trainable_only: bool = False) -> list[Parameter]:
        """Every `Parameter` reachable from this agent's attributes, named by attribute path.

        A parameter without a name gets its path (`prompt`, `retriever.template`,
        `examples.0`); names must be unique within the agent.
        """
        found: list[Parameter] = []
        names: dict[str, str] = {}
        for path, param in _walk(self, "", set()):
            if param.name is None:
                param.name = path
            if param.name in names:
                raise OptoValueError(
                    f"two parameters are named {param.name!r} (at {names[param.name]!r} and {path!r}); "
                    "give them distinct names"
                )
            names[param.name] = path
            if param.trainable or not trainable_only:
                found.append(param)
        return found

    def named_parameters(self) -> dict[str, Parameter]:
        return {p.name: p for p in self.parameters()}  # type: ignore[misc]

    def parameter_values(self) -> dict[str, Any]:
        """{name: value} as seen by the current task."""
        return {name: p.value for name, p in self.named_parameters().items()}

    def stored_values(self, trainable_only: bool = False) -> dict[str, Any]:
        """{name: stored value}, ignoring any assignment context (what a checkpoint keeps)."""
        return {p.name: p.stored_value for p in self.parameters(trainable_only)}  # type: ignore[misc]

    def resolve(self, values: ParameterValues) -> dict[Parameter, Any]:
        """Map names to this agent's parameters; an unknown name is an error."""
        named = self.named_parameters()
        resolved: dict[Parameter, Any] = {}
        for key, value in values.items():
            if isinstance(key, str):
                if key not in named:
                    raise OptoKeyError(f"{type(self).__name__} has no parameter {key!r}; it has {sorted(named)}")
                key = named[key]
            resolved[key] = value
        return resolved

    def assign(self, values: ParameterValues) -> contextlib.AbstractContextManager[None]:
        """`opto.assign` with names resolved within this agent."""
        return assign(self.resolve(values))

    def apply(self, values: ParameterValues) -> None:
        """Write stored values (all validated first, so a bad value changes nothing)."""
        resolved = self.resolve(values)
        for param, value in resolved.items():
            param.validate(value)
        for param, value in resolved.items():
            param.value = value

    async def arun(self, x: Any) -> Any:
        """Run `forward` on one input: awaited if async, else in a worker thread.

        The thread inherits the current context, so it sees assigned values and
        records its model calls in the current trace.
        """
        return await _run_forward(self, x)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def save(self, path: str | Path) -> None:
        """Write the stored parameter values as JSON."""
        atomic_write_json(path, self.stored_values())

    def load(self, path: str | Path) -> None:
        """Read values written by `save`; unknown names or bad values change nothing."""
        try:
            values = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise OptoValueError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise OptoValueError(f"{path} must hold a JSON object of parameter values")
        if {"version", "step", "parameters", "loader_state"} <= values.keys():
            raise OptoValueError(
                f"{path} is a training checkpoint, not saved values: load the run's agent.json "
                f"({Path(path).with_name('agent.json')}), which holds the values the run ended with"
            )
        try:
            self.apply(values)
        except KeyError as exc:
            raise OptoKeyError(f"{path}: {exc.args[0]}") from None
        except ParameterError as exc:
            raise ParameterError(f"{path}: {exc}; nothing was changed") from None


def run_agent(agent: Agent, x: Any) -> Awaitable[Any]:
    """What awaiting `agent.arun(x)` gives. Unless `arun` is overridden, this is `forward`'s
    own awaitable, without `arun`'s coroutine around it: a rollout in flight holds one fewer."""
    return _run_forward(agent, x) if type(agent).arun is Agent.arun else agent.arun(x)


def _run_forward(agent: Agent, x: Any) -> Awaitable[Any]:
    """`forward` on `x`: an async one's coroutine, a sync one in a worker thread."""
    several, is_async = _forward_shape(agent.forward)
    args, kwargs = _spread(x, several)
    if is_async:
        return agent.forward(*args, **kwargs)
    return _in_thread(agent.forward, args, kwargs)


async def _in_thread(forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = await asyncio.to_thread(forward, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def _spread(x: Any, several: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One input argument gets x as is; several get a tuple spread positionally, a dict by name."""
    if several:
        if isinstance(x, tuple):
            return x, {}
        if isinstance(x, dict):
            return (), x
    return (x,), {}


def _takes_several(forward: Callable[..., Any], exclude: frozenset[str] = frozenset()) -> bool:
    """Whether `forward` (as called: a bound method without its self) takes several inputs."""
    try:
        params = [
            p
            for p in inspect.signature(forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_POSITIONAL)
            and p.name not in exclude
        ]
    except (TypeError, ValueError):
        return False
    return len(params) > 1 or bool(params and params[0].kind is inspect.Parameter.VAR_POSITIONAL)


# `forward`'s shape, read once per function: inspect.signature is slow and every rollout
# needs it. Weak, so a function's globals (a notebook's, an exec'd script's) are not kept alive.
_FORWARD_SHAPES: weakref.WeakKeyDictionary[Callable[..., Any], tuple[bool, bool]] = weakref.WeakKeyDictionary()


def _forward_shape(forward: Callable[..., Any]) -> tuple[bool, bool]:
    """(whether `forward` takes several inputs, whether it is a coroutine function)."""
    function = getattr(forward, "__func__", forward)  # a bound method is a new object each time
    try:
        return _FORWARD_SHAPES[function]
    except KeyError:
        shape = _FORWARD_SHAPES[function] = (_takes_several(forward), inspect.iscoroutinefunction(forward))
    except TypeError:  # a callable that cannot be weakly referenced
        shape = (_takes_several(forward), inspect.iscoroutinefunction(forward))
    return shape


class _FunctionAgent(Agent):
    def __init__(self, fn: Callable[..., Any], params: dict[str, Parameter]) -> None:
        self._fn = fn
        self.params = params
        functools.update_wrapper(self, fn)
        self._is_async = inspect.iscoroutinefunction(fn)
        self._takes_several = _takes_several(fn, frozenset(params))

    def parameters(self, trainable_only: bool = False) -> list[Parameter]:
        for key, param in self.params.items():
            if param.name is None:
                param.name = key
        return super().parameters(trainable_only)

    def _call(self, x: Any) -> Any:
        args, kwargs = _spread(x, self._takes_several)
        return self._fn(*args, **kwargs, **{key: param.value for key, param in self.params.items()})

    def forward(self, x: Any) -> Any:
        return self._call(x)

    async def arun(self, x: Any) -> Any:
        if self._is_async:
            return await self._call(x)
        result = await asyncio.to_thread(self._call, x)
        return await result if inspect.isawaitable(result) else result

    def __repr__(self) -> str:
        return f"agent({getattr(self._fn, '__name__', 'function')})"


def agent(
    params: Mapping[str, Any] | list[Parameter] | None = None,
) -> Callable[[Callable[..., Any]], Agent]:
    """Turn a plain function into an `Agent`.

    `params` maps keyword names to initial values or `Parameter`s (or is a list of
    named `Parameter`s). The function receives the input, then each parameter's current
    value as a keyword argument of that name::

        @agent(params={"prompt": "Answer briefly.", "k": 3})
        async def qa(question, prompt, k): ...
    """
    if params is None:
        named: dict[str, Parameter] = {}
    elif isinstance(params, Mapping):
        named = {k: v if isinstance(v, Parameter) else Parameter(v, name=k) for k, v in params.items()}
    else:
        named = {}
        for param in params:
            if not isinstance(param, Parameter) or not param.name:
                raise OptoValueError("@agent(params=[...]) takes named Parameter objects; use a dict to name values")
            named[param.name] = param

    def wrap(fn: Callable[..., Any]) -> Agent:
        return _FunctionAgent(fn, named)

    return wrap
