"""The final check knows whose evidence it reads: examples no step decided on ("held out"),
the search's examples run again by a noisy agent ("fresh rollouts"), or by a deterministic
one ("reused": the very answers the search chose on, so the test is held to alpha divided
by the candidates compared, and the search's own scores are read instead of bought
again). It says the smallest gain it could have shown; small budgets still search."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Example, FinalCheck, MaxMetricCalls, Optimizer, Parameter
from opto.core.stats import examples_needed, sign_test_mid_p, sign_test_power, smallest_shown_gain
from opto.executors.local import AsyncioExecutor
from opto.integrations._options import budgeted_final_check
from opto.trainer.final_check import Runner, check_final_values
from test_final_check import GOOD, Adder, brain, sums

REACH = {"start": 10, "better": 13}  # right on the examples numbered below it


class Reach(Agent):
    """Deterministic: under value v, right on example a when a < REACH[v]."""

    def __init__(self) -> None:
        self.prompt = Parameter("start")
        self.ran: list[str] = []

    async def forward(self, question: str) -> str:
        self.ran.append(question)
        a = int(question.split()[0])
        return str(2 * a) if a < REACH[self.prompt.value] else "?"


def check(agent: Agent, *, compared: int, recorded: dict[str, Any] | None = None, allowance: int | None = None,
          kind: str = "repeated rollouts", noisy: bool = False) -> Any:  # fmt: skip
    runner = Runner(agent=agent, guide=ExactMatchGuide(), executor=AsyncioExecutor(4))
    examples = [Example(e["x"], e["info"], id=e["id"]) for e in sums(24)]
    return asyncio.run(check_final_values(
        runner, FinalCheck(), examples=examples, kind=kind, start={"prompt": "start"}, final={"prompt": "better"},
        fallback=None, noisy=noisy, guard=None, search_score=None, compared=compared, recorded=recorded,
        allowance=allowance))  # fmt: skip


def test_reused_evidence_is_held_to_alpha_over_the_candidates_compared():
    assert sign_test_mid_p(3, 3) == 0.0625  # 3 won, none lost: passes alpha 0.1 alone
    alone, values, _ = check(Reach(), compared=1)
    assert alone.evidence == "reused" and alone.level == 0.1 and alone.returned == "final"
    assert values == {"prompt": "better"}
    picked, values, _ = check(Reach(), compared=4)  # the luckiest of 4 on the same answers
    assert picked.evidence == "reused" and picked.compared == 4 and picked.level == pytest.approx(0.025)
    assert picked.returned == "start" and values == {"prompt": "start"} and picked.p_value == 0.0625
    assert "alpha 0.1 / 4 candidates: reused evidence" in picked.summary()
    assert picked.min_gain == pytest.approx(5 / 24)  # 5 straight wins pass at 0.025
    assert "smallest gain it could show: 20.8 points" in picked.summary()


@pytest.mark.parametrize("kind,noisy,evidence", [("held-out", False, "held out"), ("unseen", False, "held out"),
                                                 ("repeated rollouts", True, "fresh rollouts")])  # fmt: skip
def test_fresh_evidence_keeps_alpha(kind, noisy, evidence):
    result, _, _ = check(Reach(), compared=50, kind=kind, noisy=noisy)
    assert result.evidence == evidence and result.compared == 1 and result.level == 0.1


def test_a_deterministic_check_reads_the_search_s_scores_and_runs_only_what_they_lack():
    from opto.core.rollout import digest_of

    start = {e["id"]: float(int(e["x"].split()[0]) < 10) for e in sums(24)}
    better = {e["id"]: float(int(e["x"].split()[0]) < 13) for e in sums(24)[:20]}  # 4 examples unmeasured
    recorded = {digest_of({"prompt": "start"}): start, digest_of({"prompt": "better"}): better}
    agent = Reach()
    result, _, made = check(agent, compared=1, recorded=recorded)
    assert len(made) == 4 and len(agent.ran) == 4  # only the final values' 4 missing examples
    assert result.returned == "final" and result.examples == 24
    none_left, _, made = check(Reach(), compared=1, recorded=recorded, allowance=0)
    assert made == [] and none_left.returned == "final"  # compared on the 20 both have
    assert none_left.start_score == pytest.approx(10 / 20)


def test_a_run_s_check_says_what_it_read():
    result = AggregatedUpdate(Adder(), Optimizer(brain(GOOD))).train(ExactMatchGuide(), sums(24), batch_size=4,
                                                                      progress=False)  # fmt: skip
    found = result.final_check
    assert found.kind == "repeated rollouts" and found.evidence == "reused" and found.noisy is False
    assert found.compared >= 1 and found.level == pytest.approx(0.1 / found.compared)
    assert found.returned == "final" and found.min_gain is not None
    held = AggregatedUpdate(Adder(), Optimizer(brain(GOOD))).train(ExactMatchGuide(), sums(120), batch_size=4,
                                                                    progress=False)  # fmt: skip
    assert held.final_check.evidence == "held out" and held.final_check.level == 0.1


def test_the_power_figures():
    assert smallest_shown_gain(24, 0.1) == pytest.approx(3 / 24)
    assert smallest_shown_gain(2, 0.1) is None  # two wins of two cannot pass
    assert examples_needed(0.05, 0.05) < examples_needed(0.05, 0.15) < examples_needed(0.03, 0.15)
    assert examples_needed(0.1, 0.1) == 42  # 3 wins are needed: 42 examples give them with chance 0.8
    assert sign_test_power(42, 0.1, 0.1, 0.1) >= 0.8 > sign_test_power(41, 0.1, 0.1, 0.1)
    with pytest.raises(ValueError, match="gain <= changed"):
        examples_needed(0.2, 0.1)


def test_a_small_metric_budget_searches_and_says_when_it_cannot(caplog):
    from test_compat_gepa import SEED, TRAIN, VAL, reflection_lm, task_lm

    from opto.integrations import gepa as bridge

    assert budgeted_final_check(20) == FinalCheck(probe=0, keep_calls=False, min_data=sys.maxsize)
    found = bridge.optimize(SEED, TRAIN, VAL, task_lm=task_lm, reflection_lm=reflection_lm, max_metric_calls=20)
    assert found.total_metric_calls <= 20 and "capital city" in found.best_candidate["system_prompt"]
    assert found.result.final_check.returned == "final" and found.result.final_check.evidence == "reused"
    with caplog.at_level(logging.WARNING):
        tiny = bridge.optimize(SEED, TRAIN, VAL, task_lm=task_lm, reflection_lm=reflection_lm, max_metric_calls=10)
    assert tiny.best_candidate == SEED and tiny.total_metric_calls <= 10
    said = [r.getMessage() for r in caplog.records if "leaves the search" in r.getMessage()]
    assert said and "takes at least 18" in said[0] and "max_metric_calls=18 or more" in said[0]


def test_the_check_takes_unseen_training_examples_when_a_budget_leaves_enough():
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), final_check=FinalCheck(rerun_size=4))
    result = trainer.train(ExactMatchGuide(), sums(40), batch_size=4, num_epochs=1, progress=False,
                           stop=MaxMetricCalls(40))  # fmt: skip
    found = result.final_check
    assert found.kind == "unseen" and found.evidence == "held out" and found.examples == 4
    decided = set(trainer.checker.decided)
    assert decided and not decided & set(found.example_ids)


def test_an_unseen_check_leaves_out_the_validation_set_when_it_is_the_training_set():
    trainer = AggregatedUpdate(Adder(), Optimizer(brain(GOOD)), final_check=FinalCheck(rerun_size=4))
    result = trainer.train(ExactMatchGuide(), sums(24), batch_size=4, num_epochs=1, progress=False,
                           stop=MaxMetricCalls(30))  # fmt: skip
    validation = {e.id for e in trainer.validation_examples()}
    assert validation  # the small-data default races candidates on the training examples
    found = result.final_check
    assert found.kind == "repeated rollouts" and found.evidence == "reused"  # not "unseen": all were raced on


def test_under_an_allowance_the_check_runs_what_the_other_side_can_be_compared_on():
    from opto.core.rollout import digest_of

    def right(a: int, reach: int) -> float:
        return float(a < reach)

    start = {f"s{a}": right(a, 10) for a in range(10)}
    better = {f"s{a}": right(a, 13) for a in [*range(10), *range(20, 24)]}
    recorded = {digest_of({"prompt": "start"}): start, digest_of({"prompt": "better"}): better}
    result, _, made = check(Reach(), compared=1, recorded=recorded, allowance=4)
    assert [r.example_id for r in made] == ["s20", "s21", "s22", "s23"]  # the start where "better" has scores
    assert result.p_value is not None  # compared on the examples both sides have
