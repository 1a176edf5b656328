"""The one registry of names: for each kind of piece a user can name, its names and what
each makes.

Every option that takes a name is looked up here, by the Python API and the `opto`
command alike: `validation="minibatch"`, `selection="pareto"`, `candidates="both"`,
`components="round_robin"`, `proposals="per_instance"`, a stop condition, `opto export
--format trl`, `opto finetune --backend nemo`. An object of the kind's protocol is used as
it is, so a name is only ever a shortcut.

An entry is an import path ("module:attribute"), imported when its name is first asked
for, the way packaging entry points work: the table names classes of every layer (the
fine-tuning backends sit far above this module) without importing them. `register` adds
a name of your own, with a class or any callable that makes the object::

    opto.register("selection", "best_of_3", lambda: TopK(3))
    AggregatedUpdate(agent, optimizer, selection="best_of_3")
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptoKeyError, OptoTypeError, OptoValueError

__all__ = ["KINDS", "Kind", "lookup", "make", "names", "register"]


@dataclass
class Kind:
    """One kind of piece: the option that names it, the protocol its objects follow
    (an import path) and its names (an import path or a callable each)."""

    option: str
    protocol: str
    entries: dict[str, str | Callable[..., Any]] = field(default_factory=dict)


KINDS: dict[str, Kind] = {
    "validation": Kind(
        "validation",
        "opto.search.validation:Validation",
        {"minibatch": "opto.search.validation:MinibatchValidation", "none": "opto.search.validation:NoValidation"},
    ),
    "selection": Kind(
        "selection",
        "opto.search.selection:CandidateSelector",
        {
            "greedy": "opto.search.selection:Greedy",
            "pareto": "opto.search.selection:Pareto",
            "epsilon_greedy": "opto.search.selection:EpsilonGreedy",
            "top_k": "opto.search.selection:TopK",
        },
    ),
    "candidates": Kind(
        "candidates",
        "opto.search.candidates:CandidateSource",
        {
            "merged": "opto.search.candidates:MergedCandidates",
            "each": "opto.search.candidates:EachProposal",
            "both": "opto.search.candidates:MergedAndEach",
        },
    ),
    "components": Kind(
        "components",
        "opto.search.components:ComponentSelector",
        {"all": "opto.search.components:AllComponents", "round_robin": "opto.search.components:RoundRobin"},
    ),
    "proposals": Kind(
        "proposals",
        "opto.search.batching:ProposalBatching",
        {"reflective": "opto.search.batching:Reflective", "per_instance": "opto.search.batching:PerInstance"},
    ),
    "stop": Kind(
        "stop",
        "opto.search.stopping:StopCondition",
        {
            "max_calls": "opto.search.stopping:MaxCalls",
            "max_cost": "opto.search.stopping:MaxCost",
            "max_time": "opto.search.stopping:MaxTime",
            "no_improvement": "opto.search.stopping:NoImprovement",
            "target_score": "opto.search.stopping:TargetScore",
            "stop_file": "opto.search.stopping:StopFile",
        },
    ),
    "preference format": Kind(
        "format",
        "opto.preference.writers:Writer",
        {
            "openai-dpo": "opto.preference.writers:OpenAIDPOWriter",
            "openai-sft": "opto.preference.writers:OpenAISFTWriter",
            "trl": "opto.preference.writers:TRLWriter",
            "trl-chat": "opto.preference.writers:TRLChatWriter",
            "nemo": "opto.preference.writers:NeMoWriter",
            "art": "opto.preference.writers:ARTWriter",
        },
    ),
    "finetune backend": Kind(
        "backend",
        "opto.finetune.base:TrainerAdapter",
        {
            "openai": "opto.finetune.openai_adapter:OpenAIFineTuneAdapter",
            "nemo": "opto.finetune.nemo_adapter:NeMoCustomizerAdapter",
            "trl": "opto.finetune.trl_adapter:TRLAdapter",
            "art": "opto.finetune.art_adapter:ARTAdapter",
        },
    ),
}


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise OptoKeyError(f"no kind {kind!r} in the registry; the kinds are {', '.join(KINDS)}")
    return KINDS[kind]


def _load(path: str | Callable[..., Any]) -> Any:
    if not isinstance(path, str):
        return path
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def names(kind: str) -> list[str]:
    """The names of `kind`, in the order they were registered."""
    return list(_kind(kind).entries)


def lookup(kind: str, name: str) -> Any:
    """What `name` makes for `kind` (a class, or the callable it was registered with)."""
    entries = _kind(kind).entries
    if name not in entries:
        raise OptoValueError(f"unknown {_kind(kind).option} {name!r}; use one of {', '.join(entries)}")
    return _load(entries[name])


def make(kind: str, spec: Any, **context: Any) -> Any:
    """The object `spec` stands for: `spec` itself when it already follows the kind's
    protocol, else what its name makes. `context` offers what a maker may need (the
    step's `aggregator`, a writer's `tokenizer`): each maker gets the keywords its
    signature takes, so makers that need nothing are called with nothing.

    A name that is not registered, or a value of another type, is an `OptoValueError`
    listing the names."""
    entry = _kind(kind)
    protocol = _load(entry.protocol)
    if isinstance(spec, protocol):
        return spec
    if not isinstance(spec, str) or spec not in entry.entries:
        raise OptoValueError(
            f"{entry.option} must be one of {', '.join(repr(n) for n in entry.entries)} "
            f"or a {protocol.__name__}, got {spec!r}"
        )
    maker = _load(entry.entries[spec])
    made = maker(**_accepted(maker, context))
    if not isinstance(made, protocol):
        raise OptoTypeError(f"{entry.option} {spec!r} made a {type(made).__name__}, not a {protocol.__name__}")
    return made


def register(kind: str, name: str, maker: str | Callable[..., Any]) -> None:
    """Add `name` to `kind`: `maker` is a class or a callable returning an object of the
    kind's protocol, or an import path ("package.module:attribute") to one. A name that
    is already taken is replaced (so a test or a plug-in can swap a built-in)."""
    if not isinstance(name, str) or not name:
        raise OptoValueError(f"a registered name is a non-empty str, got {name!r}")
    if not (callable(maker) or (isinstance(maker, str) and ":" in maker)):
        raise OptoTypeError(f"register a class, a callable or a 'module:attribute' path, got {maker!r}")
    _kind(kind).entries[name] = maker


def _accepted(maker: Callable[..., Any], context: dict[str, Any]) -> dict[str, Any]:
    try:
        parameters = inspect.signature(maker).parameters
    except (TypeError, ValueError):  # a builtin without a signature: offer nothing
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return dict(context)
    return {key: value for key, value in context.items() if key in parameters}
