"""Paired tests, intervals and Holm's correction (`opto.core.stats`), and validation with `alpha`."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

import world
from opto import ExactMatchGuide, RunDir, evaluate
from opto.core.stats import holm, paired_test, score_interval
from opto import DatasetValidation, MinibatchValidation


@pytest.mark.parametrize("accuracy", [0.1, 0.5, 0.8, 0.97])
def test_the_interval_of_a_0_1_score_covers_the_true_accuracy_in_at_least_93_percent_of_draws(accuracy):
    rng = np.random.default_rng(7)
    draws, n = 2000, 64
    covered = 0
    for _ in range(draws):
        interval = score_interval(list((rng.random(n) < accuracy).astype(float)))
        covered += interval.low <= accuracy <= interval.high
    assert covered / draws >= 0.93, covered / draws


def test_graded_scores_get_a_bootstrap_interval_around_their_mean():
    scores = [0.2, 0.4, 0.5, 0.7, 0.9, 0.3, 0.6, 0.8] * 4
    interval = score_interval(scores)
    assert interval.method == "bootstrap" and interval.low < float(np.mean(scores)) < interval.high
    assert score_interval([None, None]) is None
    assert score_interval([1.0, None, 0.0]).method == "wilson"


def test_the_exact_sign_test_counts_only_the_examples_where_the_two_differ():
    seven_wins = paired_test([0.0] * 7 + [1.0] * 10, [1.0] * 17)
    assert seven_wins.test.startswith("exact sign test") and seven_wins.p_value == pytest.approx(1 / 128)
    assert paired_test([1.0, 0.0], [1.0, 0.0]).p_value == 1.0  # nothing discordant: no evidence
    fourteen_twelve = paired_test([1.0] * 12 + [0.0] * 12, [0.0] * 10 + [1.0] * 14)  # 14 vs 12 of 24
    assert fourteen_twelve.p_value > 0.3 and fourteen_twelve.interval.low < 0 < fourteen_twelve.interval.high
    with pytest.raises(ValueError, match="same examples"):
        paired_test([1.0], [1.0, 0.0])


def test_the_paired_bootstrap_on_graded_scores():
    rng = np.random.default_rng(3)
    base = list(rng.random(40))
    better = paired_test(base, [b + 0.2 for b in base])
    same = paired_test(base, list(base))
    assert better.test == "paired bootstrap" and better.p_value < 0.01 and better.interval.low > 0
    assert same.p_value > 0.4


def test_holm_rejects_step_down():
    assert holm([0.01, 0.04, 0.03], 0.05) == [True, False, False]
    assert holm([0.01, 0.02, 0.03], 0.05) == [True, True, True]
    assert holm([], 0.05) == []


def test_with_alpha_null_candidates_are_accepted_at_most_alpha_of_the_time():
    """Candidates that are, by construction, fair coins like the current values, on 24
    examples: the exact rate at which each rule accepts one, over every outcome."""
    validation = DatasetValidation(world.dataset(range(1)), alpha=0.05)
    n = 24
    rate = plain = 0.0
    for discordant in range(n + 1):  # examples where the two differ; the others agree
        for wins in range(discordant + 1):
            chance = math.comb(n, discordant) * math.comb(discordant, wins) / 2**n / 2**discordant
            agree = n - discordant
            current = world_rollouts([1] * agree + [0] * wins + [1] * (discordant - wins))
            candidate = world_rollouts([1] * agree + [1] * wins + [0] * (discordant - wins))
            rate += chance * validation.compare("c", current, candidate, 0.0).accepted
            plain += chance * MinibatchValidation().compare("c", current, candidate, 0.0).accepted
    assert rate <= 0.05 and plain > 0.4  # the plain rule accepts any strict win: nearly half


def world_rollouts(correct: Any) -> list[Any]:
    from opto import Rollout

    return [Rollout(example_id=f"e{i}", score=float(c)) for i, c in enumerate(correct)]


def test_a_training_run_with_alpha_records_the_test_and_rejects_a_win_that_is_not_significant(tmp_path):
    # level 0 -> level 1 fixes one validation example of six: a win, but not a significant one
    trainer, *_ = world.make_level_trainer(level=0, validation=DatasetValidation(world.dataset(range(6)), alpha=0.05))
    trainer.train(ExactMatchGuide(), world.dataset([0, 1]), batch_size=2, run_dir=tmp_path, progress=False)
    decision = next(d for d in RunDir(tmp_path).events("decision") if d.candidate_id)
    assert decision.test.startswith("exact sign test") and decision.p_value == pytest.approx(0.5)
    assert not decision.accepted and "> alpha = 0.05" in decision.reason
    assert decision.difference == pytest.approx(1 / 6) and decision.difference_interval[0] <= 0


def test_with_several_candidates_holm_corrects_for_their_number(tmp_path):
    def each_level(messages: list[dict[str, Any]]) -> str:
        return json.dumps({"suggestion": {"system_prompt": "level 8"}})


    # two candidates, both level 8 on 8 validation examples: 8 wins of 8, p = 1/256 each
    trainer, *_ = world.make_level_trainer(level=0, validation=DatasetValidation(world.dataset(range(8)), alpha=0.05),
                                           brain_kwargs={"aggregator": each_level})
    trainer.aggregator.num_candidates = 2
    trainer.train(ExactMatchGuide(), world.dataset([0, 1]), batch_size=2, run_dir=tmp_path, progress=False)
    decisions = [d for d in RunDir(tmp_path).events("decision") if d.candidate_id]
    assert len(decisions) == 2 and all(d.accepted for d in decisions)  # 1/256 survives Holm for 2
    assert all(d.p_value == pytest.approx(1 / 256) for d in decisions)


def test_alpha_is_checked():
    for bad in (0, 1, 1.5, "0.05"):
        with pytest.raises(ValueError, match="alpha"):
            DatasetValidation(world.dataset(range(2)), alpha=bad)


def test_evaluate_gives_a_95_percent_interval():
    trainer, agent, *_ = world.make_level_trainer(level=5)
    result = evaluate(agent, ExactMatchGuide(), world.dataset(range(10)))
    assert result.mean == 0.5 and result.interval.method == "wilson"
    assert result.interval.low == pytest.approx(0.2366, abs=1e-3) and result.interval.high == pytest.approx(0.7634, abs=1e-3)
