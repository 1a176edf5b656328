"""Learning from production with MLflow 3: a real MLflow server on 127.0.0.1 (SQLite store),
traces and feedback written through MLflow's own API, a prompt served by the alias
`@production`; opto reads the traces, optimizes, checks on the newest, publishes or
refuses, and rolls back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opto import AggregatedUpdate, ExactMatchGuide, FinalCheck, Optimizer, ScriptedModel
from opto.core.logged import split_newest
from opto.errors import OptoValueError

pytest.importorskip("mlflow.server", reason="MLflow's full package (the dev extra) runs a tracking server")
import mlflow  # noqa: E402
from mlflow_server import registered, traced_production  # noqa: E402
from test_logged import CAPITALS, RULE, START, Capitals, question  # noqa: E402

from opto.integrations.mlflow import publish, read_traces, registry_prompt, rollback  # noqa: E402

pytestmark = pytest.mark.xdist_group("mlflow_server")


@pytest.fixture
def server(mlflow_tracking_server: str) -> str:
    mlflow.set_tracking_uri(mlflow_tracking_server)
    return mlflow_tracking_server


def optimizer_reply(messages: list[dict[str, Any]]) -> str:
    update = RULE if "I wanted the city" in messages[-1]["content"] else "Answer politely."
    return json.dumps({"reasoning": "the users asked for the city", "suggestion": {"prompt": update}})


def _published(tmp_path: Path) -> tuple[Capitals, Any]:
    """A run from version 1 of a new prompt whose check passed, not published yet."""
    records = read_traces(traced_production(list(CAPITALS)[:12])).records
    older, newest = split_newest(records, 0.25)
    agent = Capitals()
    agent.prompt = registry_prompt(registered(START), name="prompt")
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer_reply)), final_check=FinalCheck(examples=newest))
    result = trainer.train(ExactMatchGuide(), [(question(c), CAPITALS[c]) for c in list(CAPITALS)[12:]],
                           logged=older, run_dir=tmp_path / "run", progress=False)  # fmt: skip
    assert result.final_check is not None and result.final_check.returned == "final"
    return agent, result


def test_traces_and_their_assessments_become_records(server: str) -> None:
    found = read_traces(traced_production(["France", "Peru"]), rating_scale=(1, 5))
    assert found.without_feedback == 1 and [r.x for r in found.records] == [question("France"), question("Peru")]
    record = found.records[0]
    assert record.output == "It is a lovely place." and record.info == "Paris" and record.id.startswith("tr-")
    assert record.score == pytest.approx((0.0 + 0.25) / 2)  # thumbs down, and a rating of 2 on 1-5
    assert "thumbs = False (by HUMAN): I wanted the city" in record.feedback and record.time > 1.7e9


def test_read_optimize_check_publish_and_roll_back(server: str, tmp_path: Path) -> None:
    agent, result = _published(tmp_path)  # the newest traces: the check's, never the search's
    done = publish(result, agent.prompt, message="asks for the capital")
    assert done.promoted and done.aliases == {"production": 2, "previous": 1}
    served = mlflow.genai.load_prompt(f"prompts:/{agent.prompt.prompt_name}@production", cache_ttl_seconds=0)
    assert served.template == RULE and "final check (held-out" in served.commit_message
    assert served.tags["opto.run_dir"] == str(tmp_path / "run")
    assert publish(result, registry_prompt(f"prompts:/{agent.prompt.prompt_name}@production", name="prompt")).registered is None

    back = rollback(agent.prompt)
    assert back.aliases == {"production": 1}
    assert mlflow.genai.load_prompt(f"prompts:/{agent.prompt.prompt_name}@production", cache_ttl_seconds=0).template == START


def test_a_run_whose_check_fails_is_not_promoted(server: str) -> None:
    agent = Capitals()
    agent.prompt = registry_prompt(registered(START), name="prompt")
    useless = ScriptedModel(lambda m: json.dumps({"reasoning": "r", "suggestion": {"prompt": "Answer politely."}}))
    result = AggregatedUpdate(agent, Optimizer(useless), validation="none").train(
        ExactMatchGuide(), [(question(c), CAPITALS[c]) for c in list(CAPITALS)[:4]], progress=False
    )
    assert result.final_check is not None and result.final_check.returned != "final"
    assert result.final_check.search_parameters["prompt"] == "Answer politely."  # the search moved; the check: no
    refused = publish(result, agent.prompt)
    assert refused.registered is None and not refused.promoted and "did not pass" in refused.reason
    kept = publish(result, agent.prompt, unchecked="register")
    assert kept.registered == 2 and not kept.promoted and kept.aliases == {"production": 1}


def test_a_publish_stopped_halfway_runs_again_without_a_second_version(server: str, monkeypatch, tmp_path) -> None:
    agent, result = _published(tmp_path)
    client = mlflow.MlflowClient()
    real = client.set_prompt_alias

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the registry went away")

    monkeypatch.setattr(mlflow.MlflowClient, "set_prompt_alias", unreachable)
    with pytest.raises(ConnectionError):
        publish(result, agent.prompt)
    name = agent.prompt.prompt_name
    assert client.get_prompt_version_by_alias(name, "production").version == 1  # the alias did not move
    monkeypatch.setattr(mlflow.MlflowClient, "set_prompt_alias", real)
    again = publish(result, agent.prompt)
    assert again.promoted and again.registered == 2 and len(list(client.search_prompt_versions(name))) == 2


def test_bad_registry_names_are_refused(server: str) -> None:
    with pytest.raises(OptoValueError, match="prompts:/NAME@ALIAS"):
        registry_prompt("capitals")
    with pytest.raises(OptoValueError, match="no 'previous' alias"):
        rollback(registered(START))
    with pytest.raises(OptoValueError, match="no MLflow experiment"):
        read_traces("no-such-experiment-anywhere")


AGENT = """
from opto import Agent, Parameter

CAPITALS = {capitals!r}


class Capitals(Agent):
    def __init__(self):
        self.prompt = Parameter("Answer the question.", description="the system prompt")

    def forward(self, question):
        country = question.rsplit(" ", 1)[-1].rstrip("?")
        return CAPITALS[country] if "capital city" in self.prompt.value else "It is a lovely place."


def make_agent():
    return Capitals()
"""


def test_the_periodic_job_is_one_command_that_says_what_it_did(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from opto.cli import main
    from opto.testing import FakeOpenAIServer

    import sys

    (tmp_path / "prod_agent.py").write_text(AGENT.format(capitals=CAPITALS))
    monkeypatch.chdir(tmp_path)  # the agent's module is found from the current folder, as `python -m` finds it
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    experiment = traced_production(list(CAPITALS)[:12])
    uri = registered(START)

    def reply(body: dict[str, Any]) -> str:
        return optimizer_reply(body["messages"])

    with FakeOpenAIServer(reply) as optimizer:
        base = ["production", "--agent", "prod_agent:make_agent", "--prompt", uri, "--experiment", experiment,
                "--model", "optimizer", "--base-url", optimizer.base_url]  # fmt: skip
        assert main([*base, "--dry-run"]) == 0
        assert "a dry run: nothing registered" in capsys.readouterr().out
        assert main(base) == 0
        said = capsys.readouterr().out
    assert "trained on 9 logged traces; checked on the newest 3" in said and "published version 2" in said
    assert mlflow.genai.load_prompt(uri, cache_ttl_seconds=0).template == RULE

    useless = lambda body: json.dumps({"reasoning": "r", "suggestion": {"prompt": "Answer politely."}})  # noqa: E731
    with FakeOpenAIServer(useless) as optimizer:
        other = registered(START)
        code = main(["production", "--agent", "prod_agent:make_agent", "--prompt", other, "--experiment", experiment,
                     "--model", "optimizer", "--base-url", optimizer.base_url])  # fmt: skip
    assert code == 3 and "could not" not in capsys.readouterr().err  # refused with evidence, not an error
    assert mlflow.genai.load_prompt(other, cache_ttl_seconds=0).template == START


def test_the_same_cycle_from_an_otlp_export_publishes_to_the_registry(server: str, tmp_path: Path) -> None:
    """Traces from an OTLP JSON file (GenAI spans with evaluation events and the expected
    answer), the prompt from MLflow's registry: read, train, check, publish."""
    from opto.integrations.production import production_cycle

    spans = []
    for i, country in enumerate(list(CAPITALS)[:12]):
        attribute = lambda key, value: {"key": key, "value": {"stringValue": value}}  # noqa: E731
        text = lambda role, words: json.dumps([{"role": role, "parts": [{"type": "text", "content": words}]}])  # noqa: E731
        spans.append({
            "traceId": f"{i:032x}", "spanId": f"{i:016x}", "name": "invoke_agent",
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + i * 10**9),
            "attributes": [attribute("gen_ai.input.messages", text("user", question(country))),
                           attribute("gen_ai.output.messages", text("assistant", "It is a lovely place.")),
                           attribute("expected_answer", CAPITALS[country])],
            "events": [{"name": "gen_ai.evaluation.result", "attributes": [
                attribute("gen_ai.evaluation.name", "thumbs"), attribute("gen_ai.evaluation.score.label", "thumbs_down"),
                attribute("gen_ai.evaluation.explanation", "I wanted the city")]}],
        })  # fmt: skip
    (export := tmp_path / "traces.json").write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
    uri = registered(START)

    cycle = production_cycle(Capitals(), ScriptedModel(optimizer_reply), prompt=uri, otlp=export,
                             expected="expected_answer")  # fmt: skip
    assert cycle.improved and "published version 2" in cycle.published and cycle.checked_on == 3
    assert mlflow.genai.load_prompt(uri, cache_ttl_seconds=0).template == RULE


def test_a_publish_after_the_alias_moved_changes_nothing(server: str, tmp_path: Path) -> None:
    agent, result = _published(tmp_path)
    name, client = agent.prompt.prompt_name, mlflow.MlflowClient()
    hotfix = mlflow.genai.register_prompt(name=name, template="Answer with the capital.").version  # v2, put live
    client.set_prompt_alias(name, "production", hotfix)
    refused = publish(result, agent.prompt)
    assert not refused.promoted and refused.registered is None and refused.aliases == {"production": 2}
    assert "moved from version 1" in refused.reason and "to version 2" in refused.reason
    assert len(list(client.search_prompt_versions(name))) == 2  # nothing registered
    assert client.get_prompt_version_by_alias(name, "production").version == 2  # the hotfix still served


def test_a_rollback_after_a_hand_move_or_with_a_typo_changes_nothing(server: str, tmp_path: Path) -> None:
    agent, result = _published(tmp_path)
    name, client = agent.prompt.prompt_name, mlflow.MlflowClient()
    assert publish(result, agent.prompt).aliases == {"production": 2, "previous": 1}
    with pytest.raises(OptoValueError, match="has no alias 'prodution'") as typo:
        rollback(f"prompts:/{name}@prodution")
    assert "production" in str(typo.value) and "nothing was moved" in str(typo.value)
    by_hand = mlflow.genai.register_prompt(name=name, template="Answer with the capital, please.").version  # v3
    client.set_prompt_alias(name, "production", by_hand)
    with pytest.raises(OptoValueError, match="opto did not publish") as refused:
        rollback(agent.prompt)
    assert "skip what came between" in str(refused.value)
    live = {alias: client.get_prompt_version_by_alias(name, alias).version for alias in ("production", "previous")}
    assert live == {"production": 3, "previous": 1}  # untouched


def test_the_production_command_s_help_gives_its_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    from opto.cli import main

    with pytest.raises(SystemExit):
        main(["production", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 a better prompt was published" in said and "3 the cycle could not improve" in said
