"""Model switches: point an agent at another model, and keep that in the run directory.

`opto.finetune.switch_model(agent, result, run_dir=RUN)` (after a fine-tuning job) and
`switch_to(agent, target, run_dir=RUN)` replace the models an agent holds with another:

- a model *name* (OpenAI, an OpenAI-compatible server, NeMo Customizer's output model,
  ART's served ``model@step``): each switched model becomes a copy of itself that asks
  for the new name (same server, key, budget and options). A copy, so a model object
  the agent shares with an optimizer or a judge keeps its old name there;
- a local *folder* (what `TRLAdapter` writes: merged weights, or a LoRA adapter on its
  base): a `TransformersModel` on it, with the replaced model's budget and cache.

With `run_dir`, the switch is appended to ``RUN/models.json``; a run resumed in that
folder (`train(..., resume=True)`) applies the recorded switches to its agent first, so
a restarted process goes on with the tuned model although its script builds the base one.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from .._util.files import atomic_write_json
from ..core.agent import Agent, find_attributes
from ..errors import OptoValueError, RunDirError
from ..llm.base import Model
from ..llm.remote import RemoteChatModel
from .ledger import damaged, read_json_object

__all__ = [
    "MODELS_FILE",
    "ModelSwitch",
    "apply_recorded_switches",
    "apply_switches",
    "recorded_switches",
    "switch_to",
]

logger = logging.getLogger(__name__)

#: The file in a run directory that lists the switches made there, oldest first.
MODELS_FILE = "models.json"

# TransformersModel options a switch records (all JSON values), to rebuild it on resume.
_LOCAL_OPTIONS = ("adapter", "gguf_file", "device", "dtype", "max_batch_size", "batch_wait", "max_tokens", "name")


class ModelSwitch(BaseModel):
    """One switch as recorded in ``models.json``: which attributes now use which model."""

    attributes: list[str] = Field(min_length=1)
    kind: Literal["name", "local"]
    target: str = Field(min_length=1, description="the model name, or the local model folder")
    options: dict[str, Any] = Field(default_factory=dict, description="TransformersModel options (local)")
    job_id: str | None = None
    switched_at: float = Field(default_factory=time.time)


def switch_to(
    agent: Agent,
    target: str,
    *,
    attributes: Iterable[str] | None = None,
    run_dir: str | Path | None = None,
    job_id: str | None = None,
    **options: Any,
) -> Model:
    """Make `agent` use the model `target` (a model name or a local model folder) and
    return it; with `run_dir`, record the switch in its ``models.json``. The arguments
    are `opto.finetune.switch_model`'s, which resolves a job's result to its `target`."""
    local = Path(target).is_dir()
    if options and not local:
        raise OptoValueError(
            f"options ({', '.join(options)}) are for a local model folder; {target!r} is a model name (no such folder)"
        )
    unknown = set(options) - set(_LOCAL_OPTIONS)
    if unknown:
        raise OptoValueError(
            f"unknown TransformersModel option(s) {sorted(unknown)}; a switch records only {', '.join(_LOCAL_OPTIONS)}"
        )
    change = ModelSwitch(
        attributes=_chosen(agent, attributes),
        kind="local" if local else "name",
        target=str(Path(target).resolve()) if local else target,
        options=options,
        job_id=job_id,
    )
    model = _apply(agent, change)
    if run_dir is not None:
        path = Path(run_dir) / MODELS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        switches = recorded_switches(run_dir) + [change]
        atomic_write_json(path, {"switches": [s.model_dump(mode="json") for s in switches]})
    logger.info("switched %s to %s", ", ".join(change.attributes), target)
    return model


def recorded_switches(run_dir: str | Path, agent: Agent | None = None) -> list[ModelSwitch]:
    """The switches recorded in ``run_dir/models.json``, oldest first ([] when none). A
    damaged file, or (given `agent`) one switching an attribute where the agent holds no
    model, is a `RunDirError` naming it."""
    path = Path(run_dir) / MODELS_FILE
    if not path.exists():
        return []
    record = read_json_object(path)
    try:
        switches = [ModelSwitch.model_validate(item) for item in record.get("switches", [])]
    except (ValidationError, TypeError) as exc:
        raise damaged(path, f"switches: {str(exc).splitlines()[0]} ({exc})") from None
    held = set(find_attributes(agent, Model)) if agent is not None else None
    for change in switches:
        missing = [a for a in change.attributes if held is not None and a not in held]
        if missing:
            raise RunDirError(
                f"{path} switches {', '.join(missing)} to {change.target}, but this agent holds no "
                "model there; build the agent as the run did"
            )
    return switches


def apply_switches(agent: Agent, switches: list[ModelSwitch]) -> None:
    """Apply recorded switches (from `recorded_switches(run_dir, agent)`) to `agent`, in order."""
    for change in switches:
        _apply(agent, change)
    if switches:
        logger.info("the agent uses %s (switched after fine-tuning)", switches[-1].target)


def apply_recorded_switches(agent: Agent, run_dir: str | Path) -> list[ModelSwitch]:
    """Read the switches recorded in `run_dir`, check them against `agent` and apply them
    (what a resumed run does first)."""
    switches = recorded_switches(run_dir, agent)
    apply_switches(agent, switches)
    return switches


def _chosen(agent: Agent, attributes: Iterable[str] | None) -> list[str]:
    models = find_attributes(agent, Model)
    if not models:
        raise OptoValueError(
            f"{type(agent).__name__} holds no Model in its attributes; keep the model the agent calls "
            "as an attribute (e.g. self.model) to switch it"
        )
    if attributes is None:
        return list(models)
    chosen = list(attributes)
    for name in chosen:
        if name not in models:
            raise OptoValueError(
                f"{type(agent).__name__} has no model at {name!r}; its models are at {', '.join(models)}"
            )
    return chosen


def _apply(agent: Agent, change: ModelSwitch) -> Model:
    models = find_attributes(agent, Model)
    built: dict[int, Model] = {}  # one new model per old one: attributes that shared a model still share
    for attribute in change.attributes:
        old = models[attribute]
        if id(old) not in built:
            built[id(old)] = _tuned(old, change)
        _set(agent, attribute, built[id(old)])
    return next(iter(built.values()))


def _tuned(old: Model, change: ModelSwitch) -> Model:
    if change.kind == "name":
        if old.name == change.target:
            return old
        if not isinstance(old, RemoteChatModel):
            raise OptoValueError(
                f"{type(old).__name__} {old.name!r} runs a model of its own and cannot ask for "
                f"{change.target!r} by name; switch an OpenAIModel or LiteLLMModel"
            )
        new = copy.copy(old)  # its own locks and clients, the same server and key
        new.name = change.target
        return new
    from ..llm.transformers_model import TransformersModel

    if isinstance(old, TransformersModel) and _same_local(old, change):
        return old
    options = dict(change.options)
    options.setdefault("name", _local_name(Path(change.target)))
    return TransformersModel(change.target, cache=old.cache, budget=old.budget, **options)


def _same_local(model: Any, change: ModelSwitch) -> bool:
    where = model.adapter or model.path
    return Path(where).resolve() == Path(change.target).resolve()


def _local_name(folder: Path) -> str:
    """A tuned folder is often just ``model``; its job folder's name makes it unique."""
    return f"{folder.parent.name}/{folder.name}" if folder.name == "model" else folder.name


def _set(agent: Agent, path: str, value: Any) -> None:
    """Put `value` at the attribute path `find_attributes` gave (attributes, list indexes, dict keys)."""
    *parents, last = path.split(".")
    holder: Any = agent
    for part in parents:
        holder = _child(holder, part)
    if isinstance(holder, tuple):
        raise OptoValueError(f"the model at {path!r} is inside a tuple, which cannot be changed; keep it in a list")
    if isinstance(holder, list):
        holder[int(last)] = value
    elif isinstance(holder, dict):
        holder[last] = value
    else:
        setattr(holder, last, value)


def _child(holder: Any, part: str) -> Any:
    if isinstance(holder, (list, tuple)):
        return holder[int(part)]
    return holder[part] if isinstance(holder, dict) else getattr(holder, part)
