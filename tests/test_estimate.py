"""The cost estimate before a run: `trainer.estimate()` against what the run spends, and
`train(confirm=...)`, which asks before the run's first call."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opto import (
    Agent,
    AggregatedUpdate,
    Aggregator,
    Budget,
    ExactMatchGuide,
    Optimizer,
    OptoValueError,
    Parameter,
    RunNotConfirmed,
    ScriptedModel,
)
from opto.llm import OpenAIModel
from opto.report.html import write_html_report
from opto.report.markdown import write_report
from opto.testing import FakeOpenAIServer

PRICES = {
    "agent": {"input": 0.15, "output": 0.6},
    "optimizer": {"input": 2.5, "output": 10.0},
    "aggregator": {"input": 2.5, "output": 10.0},
}
ITEM = re.compile(r"item-\d{4}")


def reply(body: dict[str, Any]) -> list[str]:
    """bench/step_pipeline.py's task: the agent answers "no" to all (the expected answer is
    "yes"); each proposal names the item it saw; the aggregator merges into numbered prompts."""
    n = body.get("n") or 1
    text = json.dumps(body["messages"])
    if body["model"] == "agent":
        return ["no"] * n
    if body["model"] == "optimizer":
        item = ITEM.search(text)
        suggestion = {"system_prompt": f"Answer the question; mind {item.group(0) if item else 'it'}."}
        return [json.dumps({"reasoning": "be careful", "suggestion": suggestion})] * n
    return [json.dumps({"reasoning_system_prompt": "merge", "suggestion": {"system_prompt": f"Say yes ({i})."}})
            for i in range(n)]  # fmt: skip


class QuestionAgent(Agent):
    def __init__(self, model: Any) -> None:
        self.model = model
        self.system_prompt = Parameter("Answer the question.", description="the agent's system prompt")

    async def forward(self, question: str) -> str:
        messages = [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": question}]
        return (await self.model.complete(messages)).text


def questions(ids: range, prefix: str) -> list[dict[str, str]]:
    return [{"x": f"Is item-{i:04d} on the list?", "info": "yes", "id": f"{prefix}{i}"} for i in ids]


def pipeline(llms: dict[str, OpenAIModel], **options: Any) -> AggregatedUpdate:
    return AggregatedUpdate(
        QuestionAgent(llms["agent"]),
        Optimizer(llms["optimizer"]),
        aggregator=Aggregator(llms["aggregator"], num_candidates=2),
        validation="minibatch",
        proposals="per_instance",
        **options,
    )


@pytest.fixture
def server():
    with FakeOpenAIServer(reply) as running:
        yield running


def models(server: FakeOpenAIServer, prices: dict[str, Any] | None = PRICES) -> dict[str, OpenAIModel]:
    return {n: OpenAIModel(n, base_url=server.base_url, api_key="k", prices=prices) for n in PRICES}


def test_the_estimate_predicts_the_runs_calls_tokens_and_dollars_within_a_quarter(server):
    llms = models(server)
    options = {"batch_size": 4, "num_epochs": 2, "test_dataset": questions(range(100, 108), "t"), "progress": False}
    estimate = pipeline(llms).estimate(ExactMatchGuide(), questions(range(16), "q"), **options)
    measuring = {name: m.usage for name, m in llms.items()}
    assert sum(u.calls for u in measuring.values()) == estimate.spent.calls > 0

    pipeline(llms).train(ExactMatchGuide(), questions(range(16), "q"), **options)

    spent = {name: m.usage.calls - measuring[name].calls for name, m in llms.items()}
    roles = estimate.by_role
    by_model = {
        "agent": roles["agent"].calls + roles["validation"].calls + roles["check"].calls + roles["test"].calls,
        "optimizer": roles["optimizer"].calls,
        "aggregator": roles["aggregator"].calls,
    }
    assert by_model == pytest.approx(spent, rel=0.25)
    tokens = sum(m.usage.total_tokens - measuring[n].total_tokens for n, m in llms.items())
    dollars = sum(m.usage.cost_usd - measuring[n].cost_usd for n, m in llms.items())
    assert estimate.prompt_tokens + estimate.completion_tokens == pytest.approx(tokens, rel=0.25)
    assert estimate.usd == pytest.approx(dollars, rel=0.25)
    assert estimate.steps == 8 and roles["test"].calls == 2 * 8  # the start's and the end's evaluation
    text = str(estimate)
    assert "optimizer" in text and "$" in text and "8 steps" in text


def test_given_token_figures_make_no_call_and_an_unpriced_model_makes_dollars_unknown(server):
    llms = models(server, prices=None)
    estimate = pipeline(llms).estimate(
        ExactMatchGuide(),
        questions(range(8), "q"),
        batch_size=4,
        tokens={"agent": (100, 5), "optimizer": (600, 80), "aggregator": (900, 120)},
    )
    assert server.chat_requests == []
    assert estimate.by_role["optimizer"].calls == 8 and estimate.by_role["optimizer"].prompt_tokens == 8 * 600
    assert estimate.usd is None and "unknown" in str(estimate)


def test_a_budget_the_estimate_exceeds_is_said_up_front(server):
    llms = models(server)
    estimate = pipeline(llms).estimate(ExactMatchGuide(), questions(range(8), "q"), batch_size=4,
                                       budget=Budget(max_calls=10, max_cost_usd=100.0))  # fmt: skip
    assert len(estimate.over_budget) == 1
    assert "10 calls left" in estimate.over_budget[0] and str(estimate.calls) in estimate.over_budget[0]


def test_bad_estimate_options_are_refused_with_what_to_pass():
    trainer = AggregatedUpdate(QuestionAgent(ScriptedModel(["no"])), Optimizer(ScriptedModel(["{}"])))
    with pytest.raises(OptoValueError, match="no option batchsize"):
        trainer.estimate(ExactMatchGuide(), questions(range(4), "q"), batchsize=4)
    with pytest.raises(OptoValueError, match="no role"):
        trainer.estimate(ExactMatchGuide(), questions(range(4), "q"), tokens={"judge": (1, 1)})
    with pytest.raises(OptoValueError, match="two ints"):
        trainer.estimate(ExactMatchGuide(), questions(range(4), "q"), tokens={"agent": (1.5, 1)})


def test_a_local_model_costs_nothing_and_a_crashing_agent_is_said_before_the_run():
    class Crashing(QuestionAgent):
        async def forward(self, question: str) -> str:
            raise RuntimeError("no such tool")

    scripted = ScriptedModel(lambda messages: "no")
    estimate = AggregatedUpdate(QuestionAgent(scripted), Optimizer(scripted)).estimate(
        ExactMatchGuide(), questions(range(8), "q"), batch_size=4
    )
    assert estimate.usd == 0.0 and estimate.calls > 0
    with pytest.raises(OptoValueError, match="failed on all 2 examples.*no such tool"):
        AggregatedUpdate(Crashing(scripted), Optimizer(scripted)).estimate(ExactMatchGuide(), questions(range(8), "q"))


def test_a_no_sends_nothing_more_and_a_yes_keeps_the_estimate_in_the_run_dir(server, tmp_path: Path):
    llms = models(server)
    seen = []

    def no(estimate: Any) -> bool:
        seen.append(estimate)
        return False

    with pytest.raises(RunNotConfirmed, match="not started"):
        pipeline(llms).train(ExactMatchGuide(), questions(range(8), "q"), batch_size=4, confirm=no,
                             run_dir=tmp_path / "no", progress=False)  # fmt: skip
    assert len(seen) == 1 and len(server.chat_requests) == 0 and seen[0].spent.calls == 0  # nothing sent
    assert seen[0].calls > 0 and seen[0].prompt_tokens > 0 and "no call was made" in seen[0].assumptions[0]
    assert not (tmp_path / "no").exists()

    result = pipeline(llms).train(ExactMatchGuide(), questions(range(8), "q"), batch_size=4, confirm=lambda e: True,
                                  run_dir=tmp_path / "yes", progress=False)  # fmt: skip
    kept = json.loads((tmp_path / "yes" / "estimate.json").read_text())
    assert result.steps == 2 and kept["steps"] == 2 and kept["calls"] > 0
    report = Path(write_report(tmp_path / "yes").markdown).read_text()
    spent = result.usage.calls
    assert f"| calls | {kept['calls']} | {spent} |" in report  # the estimate beside what the run spent
    page = Path(write_html_report(tmp_path / "yes").html).read_text()
    assert f'<td>calls</td><td class="num">{kept["calls"]}</td><td class="num">{spent}</td>' in page


def test_confirm_true_without_a_terminal_refuses_instead_of_waiting(server, monkeypatch):
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    with pytest.raises(RunNotConfirmed, match="not a terminal|stdin is not one"):
        pipeline(models(server)).train(ExactMatchGuide(), questions(range(8), "q"), batch_size=4, confirm=True,
                                       progress=False)  # fmt: skip


def test_a_logged_first_step_is_in_the_estimate(server):
    from opto import LoggedRollout

    llms = models(server)
    logged = [LoggedRollout(x=q["x"], output="no", info="yes", score=0.0, id=f"log{i}")
              for i, q in enumerate(questions(range(200, 212), "l"))]  # fmt: skip
    trainer = AggregatedUpdate(QuestionAgent(llms["agent"]), Optimizer(llms["optimizer"]), final_check=None)
    options = {"batch_size": 4, "progress": False}
    plain = trainer.estimate(ExactMatchGuide(), questions(range(8), "q"), **options)
    estimate = trainer.estimate(ExactMatchGuide(), questions(range(8), "q"), logged=logged, **options)
    assert estimate.steps == plain.steps + 1 and "a logged first step on 12 records" in str(estimate)
    screen = min(len(logged), trainer.logged_screen_size(4))  # a sample as large as the validation set
    assert 4 <= screen < len(logged) and f"each candidate runs on up to {trainer.logged_screen_size(4)}" in str(estimate)
    assert estimate.by_role["validation"].calls >= plain.by_role["validation"].calls + screen
    before = llms["agent"].usage.calls
    trainer.train(ExactMatchGuide(), questions(range(8), "q"), logged=logged, **options)
    spent = llms["agent"].usage.calls - before
    predicted = sum(estimate.by_role[role].calls for role in ("agent", "validation", "check"))
    assert spent <= predicted <= spent + len(logged)  # the replayed records counted as rollouts: an upper bound


@pytest.mark.parametrize("setting", ["accepted", "nothing accepted", "noisy agent", "raced validation set",
                                     "per instance"])  # fmt: skip
def test_the_estimates_range_holds_the_calls_made_accepted_or_not(setting):
    from test_final_check import GOOD, HARM, Adder, brain, sums

    from opto import DatasetValidation

    def trainer() -> AggregatedUpdate:
        agent = Adder(noise=0.3, seed=1) if setting == "noisy agent" else Adder()
        options: dict[str, Any] = {}
        if setting == "raced validation set":
            options["validation"] = DatasetValidation(sums(12, offset=200), race=4)
        if setting == "per instance":
            options["proposals"] = "per_instance"
        return AggregatedUpdate(agent, Optimizer(brain(HARM if setting == "nothing accepted" else GOOD)), **options)

    train = {"batch_size": 4, "test_dataset": sums(6, offset=300)}
    estimate = trainer().estimate(ExactMatchGuide(), sums(24), **train)
    result = trainer().train(ExactMatchGuide(), sums(24), progress=False, **train)
    assert (result.accepted > 0) == (setting != "nothing accepted")
    low, high = estimate.calls_at_fewest, estimate.calls_at_most
    assert low <= result.usage.calls <= high, (setting, low, result.usage.calls, high)
    assert low <= estimate.calls_if_nothing_accepted < estimate.calls <= high
    if setting == "nothing accepted":
        assert result.final_check.reason == "the search ended where it started"
        assert result.usage.calls == estimate.calls_if_nothing_accepted  # every step proposed; no check was made
    assert f"at most {high:,}" in str(estimate) and "depends on the outcome" in str(estimate)
