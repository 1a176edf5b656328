"""`switch_model`: an agent moves to a fine-tuned model (by name, or a local folder), the
switch is recorded in the run directory, and a resumed run goes on with the tuned model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tiny_models import build_tiny_model
from world import LevelAgent, agent_reply, dataset, make_brain

from opto import AggregatedUpdate, Budget, ExactMatchGuide, Optimizer, OptoValueError, OpenAIModel, RunDirError, ScriptedModel
from opto.finetune import FineTuneError, TrainingJobStatus, switch_model
from opto.run.switches import MODELS_FILE, recorded_switches
from opto.llm import TransformersModel
from opto.testing import FakeOpenAIServer

BASE, TUNED = "base-model", "ft:base-model:opto:42"


def succeeded(model: str) -> TrainingJobStatus:
    return TrainingJobStatus(job_id="job-1", status="succeeded", fine_tuned_model=model)


def tuned_answers_right(request: dict) -> str:
    """Only the tuned model knows the task: the base one always answers wrong."""
    return agent_reply(request["messages"]) if request["model"] == TUNED else "wrong"


def test_a_name_switch_copies_the_model_so_a_shared_one_keeps_its_name(tmp_path: Path) -> None:
    base = OpenAIModel(BASE, base_url="http://127.0.0.1:9/v1")
    agent = LevelAgent(base, level=5)
    tuned = switch_model(agent, succeeded(TUNED), run_dir=tmp_path)
    assert agent.model is tuned and tuned.name == TUNED and tuned.base_url == base.base_url
    assert base.name == BASE  # e.g. the optimizer's model, shared with the agent: not switched
    [record] = recorded_switches(tmp_path)
    assert (record.attributes, record.kind, record.target, record.job_id) == (["model"], "name", TUNED, "job-1")
    assert "api_key" not in (tmp_path / MODELS_FILE).read_text()


def test_a_switched_model_keeps_a_key_given_in_code_without_any_environment(monkeypatch, tmp_path: Path) -> None:
    # copy.copy goes through the pickling state, which never carries a key (for Ray workers);
    # an in-process copy must keep it, or the tuned model's first call has no key.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with FakeOpenAIServer(reply="ok") as server:
        base = OpenAIModel(BASE, base_url=server.base_url, api_key="sk-given-in-code-1234")
        agent = LevelAgent(base, level=5)
        tuned = switch_model(agent, succeeded(TUNED), run_dir=tmp_path)
        asyncio.run(tuned.complete([{"role": "user", "content": "3"}]))
        [request] = server.requests
        assert request.json["model"] == TUNED
        assert request.headers["authorization"] == "Bearer sk-given-in-code-1234"
        assert "sk-given-in-code-1234" not in (tmp_path / MODELS_FILE).read_text()
        tuned.close()
        base.close()


def test_only_a_job_that_succeeded_and_a_model_the_agent_holds_can_be_switched(tmp_path: Path) -> None:
    agent = LevelAgent(OpenAIModel(BASE, base_url="http://127.0.0.1:9/v1"), level=5)
    failed = TrainingJobStatus(job_id="job-2", status="failed", message="out of quota")
    with pytest.raises(FineTuneError, match="job-2 is failed.*out of quota"):
        switch_model(agent, failed)
    with pytest.raises(ValueError, match="no model at 'judge'; its models are at model"):
        switch_model(agent, TUNED, attributes=["judge"])
    with pytest.raises(ValueError, match="options .* are for a local model folder"):
        switch_model(agent, TUNED, max_batch_size=4)
    scripted = LevelAgent(ScriptedModel(agent_reply), level=5)
    with pytest.raises(OptoValueError, match="cannot ask for .* by name"):
        switch_model(scripted, TUNED)
    assert not (tmp_path / MODELS_FILE).exists() and agent.model.name == BASE


def test_a_local_folder_becomes_a_transformers_model_with_the_budget_kept(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "job-7" / "model", ["level 5", "10", "wrong"])
    budget = Budget(max_calls=100)
    agent = LevelAgent(ScriptedModel(agent_reply, budget=budget), level=5)
    tuned = switch_model(agent, succeeded(str(folder)), run_dir=tmp_path / "run", max_batch_size=4)
    assert isinstance(tuned, TransformersModel) and agent.model is tuned
    assert tuned.budget is budget and tuned.max_batch_size == 4 and tuned.name == "job-7/model"
    reply = asyncio.run(agent.arun(3))
    assert isinstance(reply, str) and tuned.usage.calls == 1 and budget.calls == 1
    [record] = recorded_switches(tmp_path / "run")
    assert record.kind == "local" and record.options == {"max_batch_size": 4}


def test_a_resumed_run_uses_the_model_it_was_switched_to(tmp_path: Path) -> None:
    run = tmp_path / "run"

    def train(model: OpenAIModel, epochs: int, resume: bool) -> tuple[LevelAgent, object]:
        agent = LevelAgent(model, level=10)
        brain = ScriptedModel(make_brain(), name="brain")
        trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, proposals="per_instance",
                                   validation="minibatch")
        result = trainer.train(ExactMatchGuide(), dataset([1, 2, 3, 4]), batch_size=2, num_epochs=epochs,
                               run_dir=run, resume=resume, progress=False)
        return agent, result

    with FakeOpenAIServer(reply=tuned_answers_right) as server:
        agent, first = train(OpenAIModel(BASE, base_url=server.base_url), 1, False)
        assert first.train_scores and max(first.train_scores) == 0.0  # the base model knows nothing
        switch_model(agent, TUNED, run_dir=run)
        # A new process: the script builds the base model again; the run directory says otherwise.
        agent, second = train(OpenAIModel(BASE, base_url=server.base_url), 2, True)
        assert agent.model.name == TUNED and second.steps == 4
        models = [r.json["model"] for r in server.requests if r.path.endswith("/completions")]
    assert second.train_scores[-1] == 1.0 and models[-1] == TUNED and BASE in models[:4]


def test_a_damaged_or_mismatched_switch_record_stops_the_resume_before_anything_changes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=10)
    brain = ScriptedModel(make_brain(), name="brain")
    trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch")
    trainer.train(ExactMatchGuide(), dataset([1, 2]), batch_size=2, run_dir=run, progress=False)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    (run / MODELS_FILE).write_text('{"switches": [{"attributes": [], "kind": "name", "target": "x"}]}')
    with pytest.raises(RunDirError, match="models.json: switches"):
        trainer.train(ExactMatchGuide(), dataset([1, 2]), batch_size=2, run_dir=run, resume=True, progress=False)
    (run / MODELS_FILE).write_text('{"switches": [{"attributes": ["judge"], "kind": "name", "target": "x"}]}')
    with pytest.raises(RunDirError, match="switches judge to x, but this agent holds no model there"):
        trainer.train(ExactMatchGuide(), dataset([1, 2]), batch_size=2, run_dir=run, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != MODELS_FILE} == before
