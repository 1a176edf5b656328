"""`train(logged=...)`: production's runs of the starting values, with their feedback, as
the first step's evidence: proposals from them with no agent call on them; candidates
validated as in any step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from opto import (
    Agent,
    AggregatedUpdate,
    ExactMatchGuide,
    LoggedRollout,
    OptoTypeError,
    OptoValueError,
    Optimizer,
    Parameter,
    RunDir,
    ScriptedModel,
    load_dataset,
)

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako"}  # fmt: skip
START = "Answer the question."
RULE = "Answer with the capital city, in one word."


class Capitals(Agent):
    """Answers with the capital only when its prompt asks for the capital city; keeps
    every (question, prompt) it ran with."""

    def __init__(self) -> None:
        self.prompt = Parameter(START, description="the system prompt")
        self.ran: list[tuple[str, str]] = []

    def forward(self, question: str) -> str:
        self.ran.append((question, str(self.prompt.value)))
        country = question.rsplit(" ", 1)[-1].rstrip("?")
        return CAPITALS[country] if "capital city" in str(self.prompt.value) else "It is a lovely place."


def question(country: str) -> str:
    return f"What is the capital of {country}?"


def optimizer_reply(messages: list[dict[str, Any]]) -> str:
    """Proposes the rule only when production's feedback is in the prompt."""
    text = messages[-1]["content"]
    update = RULE if "Recorded feedback: the user wanted the city" in text else "Answer politely."
    return json.dumps({"reasoning": "read the feedback", "suggestion": {"prompt": update}})


def production(countries: list[str]) -> list[LoggedRollout]:
    return [
        LoggedRollout(x=question(c), output="It is a lovely place.", score=0.0,
                      feedback="the user wanted the city", id=f"trace-{c}", time=1_700_000_000 + i)
        for i, c in enumerate(countries)
    ]  # fmt: skip


def test_the_first_proposals_come_from_logged_feedback_without_running_the_agent_on_it(tmp_path: Path) -> None:
    agent, optimizer = Capitals(), ScriptedModel(optimizer_reply, name="optimizer")
    logged_countries, train_countries = list(CAPITALS)[:4], list(CAPITALS)[4:]
    train = [(question(c), CAPITALS[c]) for c in train_countries]
    result = AggregatedUpdate(agent, Optimizer(optimizer)).train(
        ExactMatchGuide(), train, batch_size=4, logged=production(logged_countries), run_dir=tmp_path / "run",
        progress=False,
    )  # fmt: skip
    logged_inputs = {question(c) for c in logged_countries}
    assert not [q for q, prompt in agent.ran if q in logged_inputs and prompt == START]  # never re-run
    assert result.final_parameters["prompt"] == RULE and result.accepted >= 1
    ledger = RunDir(tmp_path / "run").ledger()
    first = [r for r in ledger if r["type"] == "rollout" and r["step"] == 1 and r["phase"] == "logged"]
    assert sorted(r["instance_id"] for r in first) == sorted(f"trace-{c}" for c in logged_countries)
    assert all(r["output"] == "It is a lovely place." and r["score"] == 0.0 for r in first)
    proposals = [r for r in ledger if r["type"] == "proposal" and r["step"] == 1]
    assert proposals and proposals[0]["update"] == {"prompt": RULE}  # production's feedback reached the optimizer


def test_an_expectation_is_judged_by_the_guide_and_the_recorded_output_is_never_a_target() -> None:
    agent = Capitals()
    record = LoggedRollout(x=question("Peru"), output="Lima", info="Lima", score=0.0, feedback="thumbs down by mistake")
    seen: list[str] = []

    def reply(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[-1]["content"])
        return json.dumps({"reasoning": "nothing to fix", "suggestion": {}})

    AggregatedUpdate(agent, Optimizer(ScriptedModel(reply))).train(
        ExactMatchGuide(), [(question("Chile"), "Santiago")], logged=[record, *production(["Cuba"])], progress=False
    )
    shown = "\n".join(seen)
    assert "thumbs down by mistake" in shown  # the recorded feedback is shown...
    assert "score: 1.0" in shown  # ...beside the guide's judgment of the output against the expectation


def test_bad_logged_records_are_refused_before_any_call() -> None:
    agent, model = Capitals(), ScriptedModel(optimizer_reply)
    trainer = AggregatedUpdate(agent, Optimizer(model))
    with pytest.raises(OptoTypeError, match=r"logged\[1\] must be a LoggedRollout"):
        trainer.train(ExactMatchGuide(), [("q", "a")], logged=[*production(["Peru"]), "a trace"], progress=False)
    with pytest.raises(OptoValueError, match="'trace-Peru' is repeated"):
        trainer.train(ExactMatchGuide(), [("q", "a")], logged=production(["Peru", "Peru"]), progress=False)
    with pytest.raises(ValidationError, match="outside"):
        LoggedRollout(x="q", output="a", score=5)
    assert agent.ran == [] and model.requests == []
    assert not LoggedRollout(x="q", output="a").has_signal and production(["Peru"])[0].has_signal


def expected(countries: list[str], start: int) -> list[LoggedRollout]:
    """Production records whose users gave the right answer (expectations), in time order."""
    return [
        LoggedRollout(x=question(c), output="It is a lovely place.", score=0.0, info=CAPITALS[c],
                      feedback="the user wanted the city", id=f"trace-{c}", time=start + i)
        for i, c in enumerate(countries)
    ]  # fmt: skip


def test_the_newest_traces_are_held_out_for_the_final_check(tmp_path: Path) -> None:
    from opto import FinalCheck
    from opto.core.logged import split_newest

    records = expected(list(CAPITALS)[:12], 1_700_000_000)
    older, newest = split_newest(records, 0.25)
    assert [r.id for r in newest] == ["trace-Nepal", "trace-Cuba", "trace-Fiji"] and len(older) == 9
    assert split_newest(records, at=1_700_000_009)[1] == newest  # a window by time
    agent = Capitals()
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer_reply)), final_check=FinalCheck(examples=newest))
    train = [(question(c), CAPITALS[c]) for c in list(CAPITALS)[12:]]
    result = trainer.train(ExactMatchGuide(), train, batch_size=3, logged=older, run_dir=tmp_path / "run",
                           progress=False)  # fmt: skip
    check = result.final_check
    assert check is not None and check.kind == "held-out" and check.example_ids == ["trace-Nepal", "trace-Cuba", "trace-Fiji"]
    assert check.returned == "final" and result.final_parameters["prompt"] == RULE
    newest_inputs = {question(c) for c in ("Nepal", "Cuba", "Fiji")}
    on_newest = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "rollout" and r["x"] in newest_inputs]
    assert on_newest and {r["phase"] for r in on_newest} == {"final_check"}  # the search never ran on them
    assert {q for q, _ in agent.ran} & newest_inputs  # the check did, on the record
    with pytest.raises(OptoValueError, match="share ids with the training data"):
        AggregatedUpdate(Capitals(), Optimizer(ScriptedModel(optimizer_reply)),
                         final_check=FinalCheck(examples=[(question("Peru"), "Lima")])).train(
            ExactMatchGuide(), [(question("Peru"), "Lima")], progress=False)  # fmt: skip


def screening(tmp_path: Path, step: int = 1) -> set[str]:
    """The instances a step's candidates were screened on."""
    ledger = RunDir(tmp_path).ledger()
    return {r["instance_id"] for r in ledger if r["type"] == "rollout" and r["step"] == step and r["phase"] == "screening"}


def test_candidates_are_screened_on_the_logged_inputs_the_guide_can_judge(tmp_path: Path) -> None:
    agent = Capitals()
    logged = expected(list(CAPITALS)[:6], 1_700_000_000)  # with their users' answers: the guide judges them
    train = [(question(c), CAPITALS[c]) for c in list(CAPITALS)[6:]]
    result = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer_reply))).train(
        ExactMatchGuide(), train, batch_size=2, logged=logged, run_dir=tmp_path / "run", progress=False
    )
    assert result.final_parameters["prompt"] == RULE
    assert screening(tmp_path / "run") == {r.id for r in logged}  # the evidence it was proposed from
    ran = [q for q, prompt in agent.ran if q in {r.x for r in logged}]
    assert len(ran) == len(logged) and all(prompt == RULE for q, prompt in agent.ran if q in ran)  # candidate only
    first = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "rollout" and r["step"] == 1]
    assert not [r for r in first if r["phase"] == "train"]  # the current values' side: the judged records

    unjudged = tmp_path / "unjudged"  # no answers: ExactMatchGuide cannot judge them
    AggregatedUpdate(Capitals(), Optimizer(ScriptedModel(optimizer_reply))).train(
        ExactMatchGuide(), train, batch_size=2, logged=production(list(CAPITALS)[:6]), run_dir=unjudged,
        shuffle=False, progress=False,
    )  # fmt: skip
    assert screening(unjudged) == {e.id for e in load_dataset(train)[:2]}  # the first training batch instead


def test_a_candidate_quoting_a_logged_answer_gets_no_credit_for_it(tmp_path: Path) -> None:
    def copier(messages: list[dict[str, Any]]) -> str:
        return json.dumps({"reasoning": "r", "suggestion": {"prompt": "Say Nairobi. Answer with the capital city."}})

    logged = expected(["Kenya", "Egypt"], 1_700_000_000)
    AggregatedUpdate(Capitals(), Optimizer(ScriptedModel(copier)), final_check=None).train(
        ExactMatchGuide(), [(question("Chile"), "Santiago"), (question("Cuba"), "Havana")], batch_size=2,
        logged=logged, run_dir=tmp_path, progress=False,
    )  # fmt: skip
    decisions = [r for r in RunDir(tmp_path).ledger() if r["type"] == "decision" and r["step"] == 1]
    assert decisions[0]["quoted"] == {"trace-Kenya": "its answer 'nairobi'"}


def judge_reply(messages: list[dict[str, Any]]) -> str:
    """A judge that reads the output: a capital city scores 10, anything else 0."""
    text = messages[-1]["content"]
    output = text.split("Output", 1)[-1] if "Output" in text else text
    right = any(city in output.split("Reference", 1)[0] for city in CAPITALS.values())
    return "The users wanted the city.\nScore: " + ("10" if right else "0")


def test_a_feedback_guide_judges_from_the_users_words_after_checking_its_judge() -> None:
    from opto import FeedbackGuide

    records = [*production(list(CAPITALS)[:3]),
               LoggedRollout(x=question("Cuba"), output="Havana", score=1.0, feedback="thanks", id="trace-ok")]  # fmt: skip
    guide = FeedbackGuide(ScriptedModel(judge_reply, name="judge"), records)
    agreement = guide.check_agreement()
    assert (agreement.agreed, agreement.compared) == (4, 4) and "4 of 4" in agreement.summary()
    agent = Capitals()
    result = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer_reply))).train(
        guide, [(question(c), None) for c in list(CAPITALS)[:3]] + [(question("Chile"), "Santiago")],
        batch_size=2, logged=records, progress=False,
    )  # fmt: skip
    assert result.final_parameters["prompt"] == RULE  # judged by the users' words where no answer was given

    flatterer = FeedbackGuide(ScriptedModel(lambda messages: "Lovely.\nScore: 10", name="judge"), records)
    with pytest.raises(OptoValueError, match=r"refuses its judge: the judge agreed .* on 1 of 4 logged outputs \(25%"):
        flatterer.check_agreement()
    assert FeedbackGuide(ScriptedModel(judge_reply), records).check_example("an input never logged", None)


def test_a_metric_call_limit_leaves_the_logged_step_room_to_decide() -> None:
    from opto import MaxMetricCalls

    logged = [LoggedRollout(x=question(c), output="It is a lovely place.", score=0.0, info=CAPITALS[c],
                            feedback="the user wanted the city", id=f"t{i}")
              for i, c in enumerate(list(CAPITALS) * 3)]  # fmt: skip
    result = AggregatedUpdate(Capitals(), Optimizer(ScriptedModel(optimizer_reply)), final_check=None).train(
        ExactMatchGuide(), [(question(c), CAPITALS[c]) for c in CAPITALS], batch_size=4, logged=logged,
        stop=MaxMetricCalls(80), progress=False,
    )  # fmt: skip
    assert result.final_parameters["prompt"] == RULE and result.metric_calls <= 80  # 42 of them replayed


def test_a_record_the_guide_cannot_judge_leaves_its_judged_twin_in_the_screen(tmp_path: Path) -> None:
    unjudged = LoggedRollout(x=question("France"), output="It is a lovely place.", score=0.0, id="no-answer")
    logged = [*expected(list(CAPITALS)[:4], 1_700_000_000), unjudged]
    AggregatedUpdate(Capitals(), Optimizer(ScriptedModel(optimizer_reply))).train(
        ExactMatchGuide(), [(question(c), CAPITALS[c]) for c in list(CAPITALS)[4:]], batch_size=4, logged=logged,
        run_dir=tmp_path, progress=False,
    )  # fmt: skip
    assert screening(tmp_path) == {f"trace-{c}" for c in list(CAPITALS)[:4]}  # France's answered record kept
