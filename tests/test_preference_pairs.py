"""PreferencePairBuilder and the split, on hand-made turns."""

from __future__ import annotations

import logging

import pytest

from opto.preference import PreferencePairBuilder, Turn, TurnCandidate, train_validation_split

PROMPT = [{"role": "user", "content": "q"}]


def turn(*scores: float, example: str = "e1", responses: list[str] | None = None, tid: str | None = None) -> Turn:
    texts = responses or [f"r{s:g}" for s in scores]
    return Turn(turn_id=tid or f"t-{example}-{'-'.join(texts)}", source="optimizer", step=1, example_id=example,
                prompt=[{"role": "user", "content": f"prompt of {example}"}],
                candidates=[TurnCandidate(response=t, score=s, ref=f"p{i}") for i, (t, s) in
                            enumerate(zip(texts, scores, strict=True))])


def scores_of(pairs: list) -> list[tuple[float, float]]:
    return [(p.chosen_score, p.rejected_score) for p in pairs]


def test_exhaustive_pairs_sorted_by_difference() -> None:
    builder = PreferencePairBuilder()
    pairs = builder.build([turn(0.5, 1.0, 0.0)])
    assert scores_of(pairs) == [(1.0, 0.0), (1.0, 0.5), (0.5, 0.0)]
    assert [(p.chosen, p.rejected) for p in pairs][0] == ("r1", "r0")
    assert all(p.reward == pytest.approx(p.score_diff) for p in pairs)
    assert builder.stats.turns == 1 and builder.stats.candidates == 3 and builder.stats.pairs == 3


def test_a_tie_never_makes_a_pair() -> None:
    builder = PreferencePairBuilder()
    pairs = builder.build([turn(1.0, 1.0, 0.0, responses=["a", "b", "c"])])
    assert scores_of(pairs) == [(1.0, 0.0), (1.0, 0.0)]
    assert {(p.chosen, p.rejected) for p in pairs} == {("a", "c"), ("b", "c")}
    assert builder.stats.pairs_skipped_small_diff == 1
    assert PreferencePairBuilder().build([turn(0.7, 0.7, responses=["a", "b"])]) == []


def test_min_score_diff_is_inclusive_and_counts_what_it_skips() -> None:
    builder = PreferencePairBuilder(min_score_diff=0.5)
    pairs = builder.build([turn(1.0, 0.5, 0.25, 0.0)])
    # differences: 1.0, 0.75, 0.5 (1.0 vs 0.5) and 0.5 (0.5 vs 0.0) are kept; 0.25 twice is not
    assert scores_of(pairs) == [(1.0, 0.0), (1.0, 0.25), (1.0, 0.5), (0.5, 0.0)]
    assert builder.stats.pairs_skipped_small_diff == 2


def test_min_score_diff_equal_to_the_difference_keeps_the_pair() -> None:
    pairs = PreferencePairBuilder(min_score_diff=0.5).build([turn(1.0, 0.5)])
    assert scores_of(pairs) == [(1.0, 0.5)]


def test_max_pairs_per_turn_keeps_the_widest() -> None:
    builder = PreferencePairBuilder(max_pairs_per_turn=2)
    pairs = builder.build([turn(0.0, 0.3, 0.6, 1.0), turn(1.0, 0.0, example="e2")])
    assert scores_of(pairs) == [(1.0, 0.0), (1.0, 0.3), (1.0, 0.0)]
    assert builder.stats.pairs_cut_by_max == 4 and builder.stats.pairs == 3


def test_best_vs_worst() -> None:
    builder = PreferencePairBuilder(exhaustive_pairs=False)
    pairs = builder.build([turn(0.4, 0.9, 0.1, 0.6)])
    assert scores_of(pairs) == [(0.9, 0.1)] and (pairs[0].chosen, pairs[0].rejected) == ("r0.9", "r0.1")
    all_tied = PreferencePairBuilder(exhaustive_pairs=False)
    assert all_tied.build([turn(0.5, 0.5, responses=["a", "b"])]) == []
    assert all_tied.stats.pairs_skipped_small_diff == 1


def test_single_candidate_turns_are_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    builder = PreferencePairBuilder()
    with caplog.at_level(logging.INFO, logger="opto.preference.pairs"):
        pairs = builder.build([turn(1.0), turn(1.0, 0.0, example="e2"), turn()])
    assert len(pairs) == 1
    assert builder.stats.turns == 2 and builder.stats.turns_skipped_single_candidate == 1
    assert "1 turns skipped (single candidate)" in caplog.text and "1 pairs" in caplog.text


def test_identical_responses_are_merged_with_their_mean_score() -> None:
    builder = PreferencePairBuilder()
    pairs = builder.build([turn(1.0, 0.0, 0.5, responses=["same", "same", "other"])])
    assert builder.stats.duplicate_candidates_merged == 1
    assert scores_of(pairs) == []  # "same" (mean 0.5) ties "other"
    kept = PreferencePairBuilder(deduplicate=False).build([turn(1.0, 0.0, 0.5, responses=["same", "same", "other"])])
    assert len(kept) == 3 and sum(p.chosen == p.rejected for p in kept) == 1


def test_duplicate_pairs_across_turns_are_removed() -> None:
    builder = PreferencePairBuilder()
    pairs = builder.build([turn(1.0, 0.0, tid="a"), turn(1.0, 0.0, tid="b")])
    assert len(pairs) == 1 and builder.stats.duplicate_pairs_removed == 1


def test_reward_is_one_when_not_from_the_score_difference() -> None:
    pairs = PreferencePairBuilder(reward_from_score_diff=False).build([turn(0.75, 0.25)])
    assert pairs[0].reward == 1.0 and pairs[0].score_diff == 0.5


def test_pairs_are_grouped_by_example() -> None:
    turns = [turn(1.0, 0.0, example="a"), turn(1.0, 0.0, example="b", responses=["x", "y"]),
             turn(0.9, 0.1, example="a", responses=["u", "v"])]
    pairs = PreferencePairBuilder().build(turns)
    assert [p.example_id for p in pairs] == ["a", "a", "b"]


def test_best_responses() -> None:
    turns = [turn(0.2, 0.9, 0.5), turn(1.0, example="single"), turn(0.5, 0.5, example="tie", responses=["a", "b"])]
    builder = PreferencePairBuilder()
    best = builder.best_responses(turns)
    assert [(b.response, b.score) for b in best] == [("r0.9", 0.9)]
    assert builder.stats.turns_skipped_single_candidate == 1 and builder.stats.pairs_skipped_small_diff == 1
    loose = PreferencePairBuilder(require_multiple_candidates=False).best_responses(turns)
    assert [b.response for b in loose] == ["r0.9", "r1", "a"]


def test_with_min_score_every_complete_reply_at_or_above_it_is_kept() -> None:
    truncated = turn(1.0, 0.9, example="cut", responses=["whole?", "ok"])
    truncated.candidates[0].truncated = True
    turns = [turn(0.2, 0.9, 0.5), turn(1.0, example="single"), turn(0.5, 0.5, example="tie", responses=["a", "b"]),
             truncated, turn(0.9, 0.9, example="same", responses=["dup", "dup"])]
    builder = PreferencePairBuilder()
    kept = builder.best_responses(turns, min_score=0.5)
    assert [(b.example_id, b.response) for b in kept] == [
        ("e1", "r0.9"), ("e1", "r0.5"), ("single", "r1"), ("tie", "a"), ("tie", "b"), ("cut", "ok"), ("same", "dup")]
    assert builder.stats.candidates_below_min_score == 1  # r0.2; the truncated reply is never kept
    assert builder.stats.turns_skipped_single_candidate == 0
    assert "1 responses below min_score" in builder.stats.summary()


def test_builder_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_score_diff"):
        PreferencePairBuilder(min_score_diff=-1)
    with pytest.raises(ValueError, match="max_pairs_per_turn"):
        PreferencePairBuilder(max_pairs_per_turn=0)


def test_split_is_seeded_and_keeps_examples_on_one_side() -> None:
    turns = [turn(1.0, 0.5, 0.0, example=f"e{i}") for i in range(10)]
    pairs = PreferencePairBuilder().build(turns)
    train, validation = train_validation_split(pairs, 0.2, seed=7)
    assert len(train) + len(validation) == 30 and len(validation) == 6
    assert not {p.example_id for p in train} & {p.example_id for p in validation}
    again = train_validation_split(pairs, 0.2, seed=7)
    assert (train, validation) == again
    other = train_validation_split(pairs, 0.2, seed=8)
    assert (train, validation) != other
    assert train != sorted(train, key=lambda p: p.example_id)  # shuffled


def test_split_edges() -> None:
    pairs = PreferencePairBuilder().build([turn(1.0, 0.0, example="a"), turn(1.0, 0.0, example="b")])
    train, validation = train_validation_split(pairs, 0.0)
    assert validation == [] and sorted(p.example_id for p in train) == ["a", "b"]
    train, validation = train_validation_split(pairs, 0.01)
    assert len(train) == 1 and len(validation) == 1  # at least one example, never all
    one = PreferencePairBuilder().build([turn(1.0, 0.0, example="a")])
    assert train_validation_split(one, 0.5) == (one, [])
    with pytest.raises(ValueError, match="validation_fraction"):
        train_validation_split(pairs, 1.0)
