"""Production in MLflow 3: its traces and their assessments in, a prompt from its registry
optimized, checked, published under an alias, and rolled back.

- `read_traces(experiment)`: each trace of an experiment as a `LoggedRollout`, through
  MLflow's public API: the root span's inputs and outputs, every feedback assessment
  (value, rationale, source) as the score and feedback text, an expectation as the
  expected answer (`info`), the trace id and time. A recorded output is never a target.
  Traces with no input or output, or with no assessment, are counted and said.
- `registry_prompt("prompts:/NAME@production")`: a text `Parameter` that starts from the
  version the alias points to, and remembers where it came from.
- `publish(result, prompt)`: registers the run's value as a new version (its commit
  message and tags hold the scores, the final check and the run's directory) and moves
  the alias to it only when the final check passed; the version it replaces keeps a
  second alias (`previous`). A value identical to the current version is never
  registered; a publish that stopped halfway can be run again: the version it
  registered is found by its tags and reused, and the aliases move last. It refuses,
  changing nothing, when the alias moved away from the version the run started from
  while it trained (a hotfix would stop being served).
- `rollback(prompt)`: moves the alias back to the `previous` version, only when the live
  version is the one opto published over it (a version put live by hand, or an alias
  that does not exist, changes nothing and says why).

`mlflow` is imported when these are called: `pip install "opto-agents[mlflow]"` for
traces, and MLflow's full package with a tracking server for the prompt registry.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from ..core.logged import LoggedRollout
from ..core.parameters import Parameter
from ..datasets.traces import TraceRecords, feedback_score
from ..errors import MissingDependencyError, OptoTypeError, OptoValueError
from ..run.results import TrainResult

__all__ = ["Publication", "RegistryPrompt", "publish", "read_traces", "registry_prompt", "rollback"]

#: The tag a published version carries: which run's value it is (a publish run again finds it).
RUN_TAG = "opto.run"
FROM_TAG = "opto.from_version"  # the version a published one replaced: where rollback may go back to


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise MissingDependencyError(
            'opto.integrations.mlflow needs MLflow 3: pip install "opto-agents[mlflow]"'
        ) from exc
    return mlflow


# Traces in ------------------------------------------------------------------------------


def read_traces(
    experiment: str | None = None,
    *,
    input: str | Callable[[Mapping[str, Any]], Any] | None = None,
    expected: str | None = None,
    rating_scale: tuple[float, float] | None = None,
    max_results: int = 1000,
    filter_string: str | None = None,
) -> TraceRecords:
    """The traces of an MLflow experiment (its name or id; None: the active one) as
    `LoggedRollout`s, newest last.

    Args:
        experiment: the experiment's name or id.
        input: what the agent takes from the root span's inputs: a key, a function of
            them, or None (the only value when there is one, else the inputs as a dict).
        expected: the expectation that holds the expected answer (default: the only
            expectation when there is one).
        rating_scale: (lowest, highest) of numeric feedback outside [0, 1] (a 1-5 rating),
            scaled to [0, 1]; without it such values are kept as text only.
        max_results: the most traces read.
        filter_string: MLflow's trace filter.
    """
    mlflow = _mlflow()
    ids = [_experiment_id(mlflow, experiment)]
    where = "locations" if "locations" in inspect.signature(mlflow.search_traces).parameters else "experiment_ids"
    traces = mlflow.search_traces(  # MLflow 3.x names the experiments `locations` from some 3.x on
        **{where: ids}, max_results=max_results, filter_string=filter_string, return_type="list"
    )
    source = f"MLflow experiment {ids[0]}"
    return TraceRecords.of((_record(trace, input, expected, rating_scale, source) for trace in traces), source)


def _experiment_id(mlflow: Any, experiment: str | None) -> str:
    if experiment is None:
        active = mlflow.tracking.fluent._get_experiment_id()  # the experiment mlflow.set_experiment chose
        if active is None:
            raise OptoValueError("read_traces needs an experiment: pass its name or id, or mlflow.set_experiment(...)")
        return str(active)
    found = mlflow.get_experiment_by_name(experiment)
    if found is not None:
        return str(found.experiment_id)
    if experiment.isdigit() and mlflow.get_experiment(experiment) is not None:
        return str(experiment)
    raise OptoValueError(f"no MLflow experiment named or numbered {experiment!r}")


def _record(
    trace: Any, input: Any, expected: str | None, scale: tuple[float, float] | None, source: str
) -> LoggedRollout | None:
    roots = [s for s in trace.data.spans if s.parent_id is None]
    if not roots or roots[0].inputs is None or roots[0].outputs is None:
        return None
    root = roots[0]
    scores: list[float] = []
    said: list[str] = []
    expectations: dict[str, Any] = {}
    for assessment in trace.info.assessments or []:
        if getattr(assessment, "expectation", None) is not None:
            expectations[assessment.name] = assessment.expectation.value
            continue
        feedback = getattr(assessment, "feedback", None)
        if feedback is None:
            continue
        score = feedback_score(feedback.value, scale)
        if score is not None:
            scores.append(score)
        who = getattr(getattr(assessment, "source", None), "source_type", None)
        rationale = f": {assessment.rationale}" if assessment.rationale else ""
        said.append(f"{assessment.name} = {feedback.value!r}{f' (by {who})' if who else ''}{rationale}")
    if expected is not None:
        info = expectations.get(expected)
    else:
        info = next(iter(expectations.values())) if len(expectations) == 1 else (expectations or None)
    return LoggedRollout(
        x=_input(root.inputs, input),
        output=root.outputs,
        score=sum(scores) / len(scores) if scores else None,
        feedback="\n".join(said),
        info=info,
        id=trace.info.trace_id,
        time=trace.info.request_time / 1000 if trace.info.request_time else None,
        source=source,
    )


def _input(inputs: Any, chosen: Any) -> Any:
    if callable(chosen):
        return chosen(inputs)
    if isinstance(chosen, str):
        if not isinstance(inputs, Mapping) or chosen not in inputs:
            raise OptoValueError(f"a trace's inputs have no {chosen!r}: they are {inputs!r}")
        return inputs[chosen]
    if isinstance(inputs, Mapping) and len(inputs) == 1:
        return next(iter(inputs.values()))
    return inputs


# The registry ---------------------------------------------------------------------------


class RegistryPrompt(Parameter):
    """A text parameter bound to a prompt of MLflow's registry: its value starts as the
    version `alias` points to (`registry_prompt` makes it)."""

    def __init__(self, name: str, alias: str, version: int, template: str, *, parameter: str | None = None) -> None:
        super().__init__(template, name=parameter or name, description=f"the prompt {name!r} of MLflow's registry")
        self.prompt_name = name
        self.alias = alias
        self.version = version


def registry_prompt(uri: str, *, name: str | None = None) -> RegistryPrompt:
    """The prompt `prompts:/NAME@ALIAS` of MLflow's registry as a `RegistryPrompt`
    (`name`: the parameter's name, default the prompt's)."""
    if not isinstance(uri, str) or not uri.startswith("prompts:/") or "@" not in uri:
        raise OptoValueError(
            f"a registry prompt is named prompts:/NAME@ALIAS (e.g. prompts:/qa@production), got {uri!r}"
        )
    prompt, alias = uri.removeprefix("prompts:/").split("@", 1)
    version = _client().get_prompt_version_by_alias(prompt, alias)
    if not isinstance(version.template, str):
        raise OptoTypeError(f"{uri} is a chat prompt: opto optimizes a text prompt's template")
    return RegistryPrompt(prompt, alias, int(version.version), version.template, parameter=name)


def _client() -> Any:
    return _mlflow().MlflowClient()


class Publication(BaseModel):
    """What `publish` or `rollback` did: the version registered (None: none), whether the
    alias moved, where each alias points now, and why."""

    registered: int | None = None
    promoted: bool = False
    aliases: dict[str, int] = {}
    reason: str = ""


def publish(
    result: TrainResult,
    prompt: RegistryPrompt,
    *,
    message: str | None = None,
    previous: str = "previous",
    unchecked: str = "refuse",
) -> Publication:
    """Register the run's value of `prompt` as a new version and move `prompt.alias` to it
    when the final check passed (see the module's doc).

    Args:
        result: the `TrainResult` of the run that optimized `prompt`.
        prompt: the `RegistryPrompt` the run started from.
        message: the commit message (the check's summary is added to it).
        previous: the alias kept on the version that is replaced (for `rollback`).
        unchecked: when the check did not pass: "refuse" (register nothing) or "register"
            (register the version without moving the alias).
    """
    if unchecked not in ("refuse", "register"):
        raise OptoValueError(f'unchecked must be "refuse" or "register", got {unchecked!r}')
    if prompt.name not in result.final_parameters:
        raise OptoValueError(f"the run has no parameter {prompt.name!r}: publish the RegistryPrompt the run optimized")
    client = _client()
    current = client.get_prompt_version_by_alias(prompt.prompt_name, prompt.alias)
    check = result.final_check
    passed = check is not None and check.returned == "final"
    why = check.summary() if check is not None else "the run made no final check"
    # What the search found: returned when the check passed, else kept in the check's record.
    found = result.final_parameters if passed or check is None else check.search_parameters
    text = str(found.get(prompt.name, current.template))
    if text == current.template:
        return Publication(
            aliases={prompt.alias: int(current.version)},
            reason="the run's value is the current version: nothing to register",
        )
    if int(current.version) != prompt.version:  # moved while the run trained: publishing would drop that change
        return Publication(
            aliases={prompt.alias: int(current.version)},
            reason=(
                f"not published: {prompt.alias!r} moved from version {prompt.version}, which the run started from, "
                f"to version {current.version} while it ran (a hotfix?); publishing would stop serving that change. "
                f"Train again from version {current.version}"
            ),
        )
    if not passed and unchecked == "refuse":
        return Publication(
            aliases={prompt.alias: int(current.version)}, reason=f"not published: the final check did not pass ({why})"
        )
    run = _run_key(result, text)
    version = _registered(client, prompt.prompt_name, run)
    if version is None:
        version = int(
            _mlflow()
            .genai.register_prompt(
                name=prompt.prompt_name,
                template=text,
                commit_message=f"{message or 'optimized by opto'}; {why}",
                tags={
                    RUN_TAG: run,
                    "opto.run_dir": str(result.run_dir or ""),
                    FROM_TAG: str(current.version),
                    "opto.check": why[:4000],
                },  # fmt: skip
            )
            .version
        )
    if not passed:
        return Publication(
            registered=version, aliases={prompt.alias: int(current.version)},
            reason=f"registered version {version} without moving {prompt.alias!r}: the final check did not pass ({why})",
        )  # fmt: skip
    client.set_prompt_alias(prompt.prompt_name, previous, int(current.version))  # the way back first
    client.set_prompt_alias(prompt.prompt_name, prompt.alias, version)
    return Publication(
        registered=version, promoted=True, aliases={prompt.alias: version, previous: int(current.version)},
        reason=f"published version {version} as {prompt.alias!r} ({why}); version {current.version} is {previous!r}",
    )  # fmt: skip


def rollback(prompt: RegistryPrompt | str, *, previous: str = "previous") -> Publication:
    """Move the prompt's alias back to the version under `previous` (a `RegistryPrompt`, or
    its `prompts:/NAME@ALIAS`)."""
    if isinstance(prompt, str):
        if not prompt.startswith("prompts:/") or "@" not in prompt:
            raise OptoValueError(f"rollback takes a RegistryPrompt or prompts:/NAME@ALIAS, got {prompt!r}")
        name, alias = prompt.removeprefix("prompts:/").split("@", 1)
    else:
        name, alias = prompt.prompt_name, prompt.alias
    client = _client()
    try:
        live = client.get_prompt_version_by_alias(name, alias)
    except Exception as exc:  # MLflow raises its own error for an alias that does not exist
        raise OptoValueError(
            f"the prompt {name!r} has no alias {alias!r} (its aliases: {', '.join(_aliases(client, name)) or 'none'}):"
            " nothing was moved"
        ) from exc
    try:
        back = client.get_prompt_version_by_alias(name, previous)
    except Exception as exc:
        raise OptoValueError(f"the prompt {name!r} has no {previous!r} alias to roll back to: {exc}") from exc
    replaced = (live.tags or {}).get(FROM_TAG)
    if replaced != str(back.version):  # the live version is not the one publish put over `previous`
        raise OptoValueError(
            f"not rolled back: {alias!r} is at version {live.version}, which "
            + ("opto did not publish" if replaced is None else f"opto published over version {replaced}")
            + f" (moved there by hand or by another tool), so {previous!r} (version {back.version}) is not the version "
            f"it replaced and going back to it would skip what came between; nothing was moved. Set the alias "
            f"yourself: MlflowClient().set_prompt_alias({name!r}, {alias!r}, VERSION)"
        )
    client.set_prompt_alias(name, alias, int(back.version))
    return Publication(aliases={alias: int(back.version)}, reason=f"{alias!r} points again at version {back.version}")


def _aliases(client: Any, name: str) -> list[str]:
    """Every alias of the prompt's versions (for a message)."""
    try:
        versions = [client.get_prompt_version(name, v.version) for v in client.search_prompt_versions(name)]
        return sorted({alias for version in versions for alias in version.aliases or []})
    except Exception:  # only for a message: say nothing rather than fail
        return []


def _run_key(result: TrainResult, text: str) -> str:
    """Which run and value a version is: a publish run again finds the version it registered."""
    return hashlib.sha256(f"{result.run_dir}|{text}".encode()).hexdigest()[:16]


def _registered(client: Any, name: str, run: str) -> int | None:
    for version in client.search_prompt_versions(name):
        if (version.tags or {}).get(RUN_TAG) == run:
            return int(version.version)
    return None
