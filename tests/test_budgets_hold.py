"""Budgets that hold and paid calls on the record: a request that was sent is paid whether
or not its reply was awaited, a budget that runs out during the final check stops the run
(resume finishes it as an uninterrupted run ends), a budget too small to start is refused
up front, and every agent call of a run is a rollout in its ledger (`opto report`)."""

from __future__ import annotations

import asyncio
import json

import pytest

from opto import AggregatedUpdate, Budget, BudgetExceeded, DatasetValidation, ExactMatchGuide, FinalCheck, OpenAIModel, Optimizer
from opto import OptoValueError, RunDir
from opto.report.markdown import write_report
from opto.testing import FakeOpenAIServer
from test_final_check import GOOD, Adder, brain, sums

MSG = [{"role": "user", "content": "hello"}]


async def test_calls_cancelled_in_flight_are_paid_and_no_request_passes_max_calls() -> None:
    with FakeOpenAIServer(latency=0.5) as slow:
        budget = Budget(max_calls=10)
        model = OpenAIModel("gpt-test", base_url=slow.base_url, api_key="sk-test", max_concurrency=4, budget=budget)
        try:
            # Eight calls: four reach the server, four wait for a slot; all are cancelled.
            calls = [asyncio.create_task(model.complete(MSG)) for _ in range(8)]
            while len(slow.chat_requests) < 4:
                await asyncio.sleep(0.01)
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            assert len(slow.chat_requests) == 4
            assert model.usage.calls == 4  # the sent ones are paid, the ones never sent are not
            assert budget.remaining()["calls"] == 6
            assert model.usage.prompt_tokens > 0  # the sent prompts, estimated

            slow.latency = 0.0
            results = await asyncio.gather(*(model.complete(MSG) for _ in range(12)), return_exceptions=True)
        finally:
            await model.aclose()
    assert sum(isinstance(r, BudgetExceeded) for r in results) == 6
    assert len(slow.chat_requests) == 10 == model.usage.calls == budget.max_calls


def _run(run_dir, budget: Budget | None = None, resume: bool = False):
    """A run whose final check runs the agent: 60 of its 120 examples held out for it."""
    agent = Adder()
    trainer = AggregatedUpdate(agent, Optimizer(brain(GOOD)))
    result = trainer.train(ExactMatchGuide(), sums(120), batch_size=4, run_dir=run_dir, budget=budget,
                           resume=resume, progress=False)  # fmt: skip
    return result, agent


def test_a_budget_that_runs_out_in_the_final_check_stops_the_run_and_resume_ends_as_an_uninterrupted_run(tmp_path):
    whole, whole_agent = _run(tmp_path / "whole")
    total = whole.usage.calls
    check_calls = sum(1 for r in RunDir(tmp_path / "whole").ledger() if r.get("phase") == "final_check")
    assert whole.final_check.returned == "final" and whole.final_check.kind == "held-out" and check_calls == 120

    budget = Budget(max_calls=total - 50)  # the search fits; the check does not
    stopped, agent = _run(tmp_path / "parts", budget)
    assert stopped.stopped_reason and "budget" in stopped.stopped_reason
    assert stopped.final_check.kind == "not run" and "resume=True" in stopped.final_check.reason
    assert stopped.final_parameters == {"prompt": "Answer."}  # the start, until the check is made
    saved = json.loads((tmp_path / "parts" / "checkpoint.json").read_text())
    assert saved["finished"] is False and saved["parameters"] == {"prompt": GOOD}  # the search's values kept
    requests = len(agent.model.requests) + stopped.usage_by_model["brain"].calls
    assert requests == stopped.usage.calls == budget.calls <= budget.max_calls
    cut = [r for r in RunDir(tmp_path / "parts").ledger() if r.get("phase") == "final_check"]
    assert 0 < len(cut) < check_calls  # what the check paid before the stop is on the record

    resumed, _ = _run(tmp_path / "parts", Budget(max_calls=total), resume=True)
    assert resumed.stopped_reason is None
    assert resumed.final_parameters == whole.final_parameters == {"prompt": GOOD}
    keys = ("returned", "p_value", "start_score", "final_score", "examples", "evidence", "level")
    assert {k: getattr(resumed.final_check, k) for k in keys} == {k: getattr(whole.final_check, k) for k in keys}
    assert resumed.train_scores == whole.train_scores


def test_a_budget_too_small_for_the_start_the_probe_and_one_step_is_refused_before_any_call():
    agent = Adder()
    trainer = AggregatedUpdate(agent, Optimizer(brain(GOOD)))
    with pytest.raises(OptoValueError, match="the noise probe") as refused:
        trainer.train(ExactMatchGuide(), sums(24), batch_size=4, test_dataset=sums(8, offset=100),
                      budget=Budget(max_calls=30), progress=False)  # fmt: skip
    assert "24 for the noise probe" in str(refused.value) and "8 for the initial test evaluation" in str(refused.value)
    assert agent.model.requests == []


def test_every_agent_call_of_a_run_with_a_probe_a_race_and_a_check_is_a_ledger_rollout(tmp_path):
    agent = Adder()
    validation = DatasetValidation(sums(12, offset=200), race=4)
    trainer = AggregatedUpdate(agent, Optimizer(brain(GOOD)), validation=validation)
    result = trainer.train(ExactMatchGuide(), sums(24), batch_size=4, run_dir=tmp_path, progress=False)
    phases = {}
    for record in RunDir(tmp_path).ledger():
        if record["type"] == "rollout":
            phases[record["phase"]] = phases.get(record["phase"], 0) + 1
    assert {"probe", "train", "validation", "current", "final_check"} <= set(phases)
    assert sum(phases.values()) == len(agent.model.requests) == result.metric_calls
    summary = write_report(tmp_path)
    assert summary.reconciled is True and summary.ledger_rollouts == phases
    assert "counted: they agree" in (tmp_path / "report.md").read_text()


async def test_a_timed_out_call_is_paid_and_a_refused_one_is_not() -> None:
    from opto import ScriptedModel
    from opto.llm.errors import LLMRequestError, LLMTimeoutError

    budget = Budget(max_calls=5)
    model = ScriptedModel([LLMTimeoutError("timed out", 3), LLMRequestError("refused", 400), "fine"], budget=budget)
    for _ in range(2):
        with pytest.raises((LLMTimeoutError, LLMRequestError)):
            await model.complete(MSG)
    assert (await model.complete(MSG)).text == "fine"
    assert model.usage.calls == 2 == budget.calls  # the timed-out request and the answered one


def test_a_step_a_metric_limit_cuts_short_stays_on_the_record(tmp_path):
    from opto import MaxMetricCalls
    from opto.report.markdown import write_report

    agent = Adder()
    trainer = AggregatedUpdate(agent, Optimizer(brain(GOOD)))
    result = trainer.train(ExactMatchGuide(), sums(40), batch_size=4, run_dir=tmp_path, stop=MaxMetricCalls(120),
                           progress=False)  # fmt: skip
    assert "stopped unfinished" in result.stopped_reason
    assert write_report(tmp_path).reconciled is True  # the cut step's rollouts are in the ledger


def test_a_budget_stop_in_the_check_keeps_every_rollout_it_paid_for(tmp_path):
    from opto.report.markdown import write_report

    whole, _ = _run(tmp_path / "whole")
    stopped, _ = _run(tmp_path / "parts", Budget(max_calls=whole.usage.calls - 50))
    assert "budget" in stopped.stopped_reason
    assert write_report(tmp_path / "parts").reconciled is True


def test_a_check_that_keeps_no_calls_stays_within_a_metric_limit_even_on_held_out_data():
    from opto import MaxMetricCalls

    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), final_check=FinalCheck(probe=0, keep_calls=False))
    result = trainer.train(ExactMatchGuide(), sums(100), batch_size=4, stop=MaxMetricCalls(40), progress=False)
    assert result.final_check.kind == "held-out" and result.metric_calls <= 40
    estimate = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), final_check=FinalCheck(probe=0, keep_calls=False))
    found = estimate.estimate(ExactMatchGuide(), sums(100), batch_size=4)
    assert 0 <= found.calls_at_fewest <= found.calls_if_nothing_accepted <= found.calls <= found.calls_at_most
