"""What `train()` returns is checked against the start on evidence no decision used
(`opto.search.FinalCheck`), a noisy agent is found and met with repeated rollouts, and a
value that copies an example gets no credit for it (`opto.search.CopyGuard`)."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

import pytest

from opto import (
    Agent,
    AggregatedUpdate,
    Budget,
    DatasetValidation,
    Demos,
    ExactMatchGuide,
    Example,
    FinalCheck,
    MaxCalls,
    Optimizer,
    OptoError,
    Parameter,
    RunDir,
    ScriptedModel,
)
from opto.cli import main
from opto.search import CopyGuard
from opto.trainer.final_check import Runner, check_final_values

GOOD, HARM = "Answer in digits.", "Answer in words, backwards."


def sums(n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [{"x": f"{i} plus {i}", "info": str(2 * i), "id": f"s{i}"} for i in range(offset, offset + n)]


class Adder(Agent):
    """Right on every example under GOOD, under HARM on a sixth of them, else on a third
    (one model call a run, so budgets see it). With `noise`, each answer is wrong with that
    chance."""

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        self.prompt = Parameter("Answer.", description="the instruction")
        self.model = ScriptedModel(lambda messages: "ok", name="agent-model")
        self.noise, self.rng = noise, random.Random(seed)

    async def forward(self, question: str) -> str:
        await self.model.complete([{"role": "user", "content": question}])
        a = int(question.split()[0])
        right = {GOOD: True, HARM: a % 6 == 0}.get(self.prompt.value, a % 3 == 0)
        if self.noise and self.rng.random() < self.noise:
            right = False
        return str(2 * a) if right else "?"


def brain(value: str) -> ScriptedModel:
    return ScriptedModel(lambda messages: json.dumps({"reasoning": "r", "suggestion": {"prompt": value}}), name="brain")


def ledger_ids(run_dir, phases: set[str]) -> set[str]:
    return {r["instance_id"] for r in RunDir(run_dir).ledger() if r["type"] == "rollout" and r["phase"] in phases}


# ------------------------------------------------------------------ what is returned


def test_a_real_gain_is_returned_and_checked_on_examples_no_decision_used(tmp_path):
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)))
    result = trainer.train(ExactMatchGuide(), sums(120), batch_size=4, run_dir=tmp_path, progress=False)
    check = result.final_check
    assert result.final_parameters == {"prompt": GOOD} and check.returned == "final"
    assert check.kind == "held-out" and check.examples == 60 and check.p_value <= 0.1  # half: power_size
    assert check.start_score < check.final_score == 1.0 and check.difference > 0.5
    assert check.interval[0] > 0 and check.noisy is False and check.repeats == 1
    # never proposed from, validated on or screened on
    used = ledger_ids(tmp_path, {"train", "validation", "screening", "probe"})
    assert used and not used & set(check.example_ids)
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert saved["config"]["final_check_ids"] == check.example_ids
    assert saved["final_check"]["returned"] == "final"


def test_a_search_that_made_things_worse_returns_the_start_and_says_so(tmp_path, caplog):
    # validation="none" accepts the harmful proposal; the final check does not return it.
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(HARM)), validation="none")
    with caplog.at_level(logging.WARNING):
        result = trainer.train(ExactMatchGuide(), sums(120), batch_size=4, run_dir=tmp_path, progress=False)
    check = result.final_check
    assert result.accepted > 0 and check.search_parameters == {"prompt": HARM}
    assert result.final_parameters == {"prompt": "Answer."} and trainer.agent.prompt.value == "Answer."
    assert check.returned == "start" and check.p_value > 0.1
    assert any("returned the start" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    # the report and the command say what was returned
    assert main(["report", str(tmp_path)]) == 0
    assert "**What was returned:** final check (held-out" in (tmp_path / "report.md").read_text()
    assert main(["report", str(tmp_path), "--html"]) == 0
    assert "<strong>What was returned:</strong>" in (tmp_path / "report.html").read_text()


def test_small_data_is_checked_by_running_the_training_examples_again():
    result = AggregatedUpdate(Adder(), Optimizer(brain(GOOD))).train(
        ExactMatchGuide(), sums(12), batch_size=4, progress=False
    )
    check = result.final_check
    assert check.kind == "repeated rollouts" and check.examples == 12 and check.returned == "final"
    assert result.final_parameters == {"prompt": GOOD}
    # the gap between the search's own score and the check's is shown
    assert check.search_score == 1.0 and check.gap == pytest.approx(0.0)


def test_a_noisy_agent_is_found_and_checked_with_repeated_rollouts():
    trainer = AggregatedUpdate(Adder(noise=0.3, seed=1), Optimizer(brain(GOOD)))
    result = trainer.train(ExactMatchGuide(), sums(12), batch_size=4, progress=False)
    check = result.final_check
    assert check.noisy is True and trainer.checker.noise.disagreed > 0
    assert check.repeats >= 3 or check.p_value <= 0.05  # a second look, unless the first was conclusive
    assert trainer.validation.repeats == 2  # candidates that win are measured again


def test_without_a_final_check_the_search_values_are_returned():
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(HARM)), validation="none", final_check=None)
    result = trainer.train(ExactMatchGuide(), sums(16), batch_size=4, progress=False)
    assert result.final_check is None and result.final_parameters == {"prompt": HARM}


def test_the_run_best_validated_values_are_returned_when_the_final_are_not_shown_better():
    agent = Adder()
    runner = Runner(agent=agent, guide=ExactMatchGuide(), executor=trainer_executor())
    examples = [Example(e["x"], e["info"], id=e["id"]) for e in sums(30)]
    import asyncio

    result, values, made = asyncio.run(
        check_final_values(runner, FinalCheck(), examples=examples, kind="held-out", start={"prompt": "Answer."},
                           final={"prompt": "Other."}, fallback={"prompt": GOOD}, noisy=False, guard=None,
                           search_score=None)
    )  # fmt: skip
    assert values == {"prompt": GOOD} and result.returned == "fallback"
    assert result.fallback["shown"] and result.fallback["alpha"] == 0.05
    assert len(made) == 90  # start, final and fallback on the 30 examples


def trainer_executor():
    from opto import AsyncioExecutor

    return AsyncioExecutor(4)


def test_the_pool_pick_of_pareto_is_checked_too():
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), selection="pareto",
                               validation=DatasetValidation(sums(8, offset=200)))  # fmt: skip
    result = trainer.train(ExactMatchGuide(), sums(16), batch_size=4, progress=False)
    check = result.final_check
    assert check.search_parameters == trainer.pool.best().values == {"prompt": GOOD}
    assert check.returned == "final" and check.examples == 24  # the training and validation examples


# ------------------------------------------------------------ stops, budgets, resume


def test_a_run_stopped_by_a_budget_returns_the_start_and_keeps_the_search_for_resume(tmp_path):
    budget = Budget(max_calls=100)  # the first step (and its acceptance) fits, not the run
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)))
    result = trainer.train(ExactMatchGuide(), sums(24), batch_size=4, run_dir=tmp_path, budget=budget,
                           progress=False)  # fmt: skip
    assert result.stopped_reason and "budget" in result.stopped_reason
    check = result.final_check
    assert check.kind == "not run" and check.returned == "start" and "resume=True" in check.reason
    assert result.final_parameters == {"prompt": "Answer."}
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert saved["parameters"] == check.search_parameters  # what resume continues from
    resumed = AggregatedUpdate(Adder(), Optimizer(brain(GOOD))).train(
        ExactMatchGuide(), sums(24), batch_size=4, run_dir=tmp_path, resume=True, progress=False
    )
    assert resumed.final_check.kind == "repeated rollouts" and resumed.final_parameters == {"prompt": GOOD}


def test_a_finished_run_resumed_keeps_its_check(tmp_path):
    first = AggregatedUpdate(Adder(), Optimizer(brain(GOOD))).train(
        ExactMatchGuide(), sums(12), batch_size=4, run_dir=tmp_path, progress=False
    )
    agent = Adder()
    again = AggregatedUpdate(agent, Optimizer(brain(GOOD))).train(
        ExactMatchGuide(), sums(12), batch_size=4, run_dir=tmp_path, resume=True, progress=False
    )
    assert again.final_check == first.final_check and agent.prompt.value == GOOD


def test_max_calls_keeps_the_final_checks_first_look_inside_the_limit():
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(HARM)), validation="none")
    result = trainer.train(ExactMatchGuide(), sums(120), batch_size=4, num_epochs=5, stop=MaxCalls(150),
                           progress=False)  # fmt: skip
    assert "kept for the final check" in result.stopped_reason
    assert result.final_check.kind == "held-out"


def test_final_check_settings_are_checked():
    for bad in ({"fraction": 1.5}, {"min_size": 0}, {"alpha": 0}, {"repeats": 0}, {"min_data": 10}):
        with pytest.raises(OptoError):
            FinalCheck(**bad)
    with pytest.raises(OptoError, match="final_check"):
        AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), final_check="yes")


# ------------------------------------------------------------------------- copies


def test_the_copy_guard_finds_quoted_inputs_and_specific_answers():
    examples = [Example("the quick brown fox jumps over the dog", "jumped-fox", id="a"),
                Example("what is two plus two", "positive", id="b"),
                Example("what is three plus one", "positive", id="c")]  # fmt: skip
    guard = CopyGuard(examples)
    assert guard.quoted({"p": "Remember: the quick brown fox jumps."}) == {"a": "its input"}
    assert guard.quoted({"p": "Say jumped-fox when asked."}) == {"a": "its answer 'jumped-fox'"}
    assert guard.quoted({"p": "Say positive or negative."}) == {}  # an answer two examples share
    repeated = CopyGuard([*examples, Example("the quick brown fox jumps over the dog", "jumped-fox", id="a2")])
    assert repeated.quoted({"p": "Say jumped-fox."}) == {"a": "its answer 'jumped-fox'", "a2": "its answer 'jumped-fox'"}
    assert guard.quoted({"p": "quick brown fox jumps"}) == {}  # four words are no quote
    assert guard.quoted({"demos": [{"input": "the quick brown fox jumps over the dog"}]}) == {}  # not text


class Lookup(Agent):
    """Right on an example only when its prompt quotes that example's answer (a copy)."""

    def __init__(self) -> None:
        self.prompt = Parameter("Answer.", description="the instruction")
        self.demos = Demos([], max_demos=2)

    def forward(self, question: str) -> str:
        _ = self.demos.value
        answer = "answer-" + question.split()[-1]
        return answer if answer in self.prompt.value else "?"


def test_a_candidate_that_copies_an_example_gets_no_credit_and_the_optimizer_is_told():
    seen: list[str] = []

    def copier(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[-1]["content"])
        return json.dumps({"reasoning": "r", "suggestion": {"prompt": "Say answer-q0 and answer-q1."}})

    data = [{"x": f"question q{i}", "info": f"answer-q{i}", "id": f"q{i}"} for i in range(8)]
    trainer = AggregatedUpdate(Lookup(), Optimizer(ScriptedModel(copier, name="brain")), final_check=None)
    result = trainer.train(ExactMatchGuide(), data, batch_size=4, shuffle=False, progress=False)
    assert result.accepted == 0
    assert trainer.agent.prompt.value == "Answer."
    assert "copied training examples" in seen[-1] and "q0" in seen[-1]
    assert "copied training examples" not in seen[0]


def test_decisions_record_what_was_quoted(tmp_path):
    data = [{"x": f"question q{i}", "info": f"answer-q{i}", "id": f"q{i}"} for i in range(8)]
    trainer = AggregatedUpdate(Lookup(), Optimizer(brain("Say answer-q0.")), final_check=None)
    trainer.train(ExactMatchGuide(), data, batch_size=4, shuffle=False, run_dir=tmp_path, progress=False)
    quoted = [r["quoted"] for r in RunDir(tmp_path).ledger() if r["type"] == "decision" and r.get("quoted")]
    assert quoted and quoted[0] == {"q0": "its answer 'answer-q0'"}


def test_a_checked_run_resumed_for_more_epochs_goes_on_from_the_search_values_and_checks_again(tmp_path):
    calls = iter(range(10**6))

    def once(messages: list[dict[str, Any]]) -> str:  # HARM on the first call, then no change
        suggestion = {"prompt": HARM} if next(calls) == 0 else {}
        return json.dumps({"reasoning": "r", "suggestion": suggestion})

    def trainer() -> AggregatedUpdate:
        return AggregatedUpdate(Adder(), Optimizer(ScriptedModel(once, name="brain")), validation="none")

    first = trainer().train(ExactMatchGuide(), sums(16), batch_size=4, run_dir=tmp_path, progress=False)
    assert first.final_check.returned == "start" and first.final_check.step == 4
    assert json.loads((tmp_path / "agent.json").read_text()) == {"prompt": "Answer."}  # what a user loads
    again = trainer().train(ExactMatchGuide(), sums(16), batch_size=4, run_dir=tmp_path, resume=True,
                            num_epochs=2, progress=False)  # fmt: skip
    assert again.steps == 8 and again.final_check.step == 8
    assert again.final_check.search_parameters == {"prompt": HARM}  # not restarted from the returned start
    assert again.final_parameters == {"prompt": "Answer."}
