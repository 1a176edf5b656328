"""Tests of opto.core.guides: Feedback, exact match, score parsing and the LLM judge."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from opto.core.guides import ExactMatchGuide, Feedback, Guide, LLMJudgeGuide, parse_score
from opto.llm.errors import BudgetExceeded, LLMUnavailableError
from opto.llm.scripted import ScriptedModel

# --- Feedback --------------------------------------------------------------------------


def test_feedback_construction_and_validation() -> None:
    assert Feedback(0.5, "ok") == Feedback(score=0.5, feedback="ok")
    assert Feedback(None).score is None
    assert Feedback(1).score == 1.0 and isinstance(Feedback(1).score, float)
    for bad in (math.nan, math.inf, "0.5", True):
        with pytest.raises(ValueError, match="score must be"):
            Feedback(bad)


# --- ExactMatchGuide -------------------------------------------------------------------


async def test_exact_match_single_and_list_targets() -> None:
    guide = ExactMatchGuide()
    assert guide.get_feedback("q", "three", ["three", "3"]) == Feedback(1.0, "Correct.")
    assert guide.get_feedback("q", "3", ["three", "3"]).score == 1.0
    assert guide.get_feedback("q", "gelatine stick", "gelatine stick").score == 1.0
    wrong = guide.get_feedback("q", "four", ["three", "3"])
    assert wrong == Feedback(0.0, 'Expected "three" (or "3"), got "four".')
    assert (await guide.aget_feedback("q", "four", "three")).feedback == 'Expected "three", got "four".'


@pytest.mark.parametrize(
    "output",
    ["Three", "  three ", "three.", '"three"', "'Three.'", '"three".', "“three”", "`three`"],
)
def test_exact_match_normalisation_accepts(output: str) -> None:
    assert ExactMatchGuide().get_feedback("q", output, ["three", "3"]).score == 1.0


def test_exact_match_normalisation_collapses_whitespace_on_both_sides() -> None:
    guide = ExactMatchGuide()
    assert guide.get_feedback("q", "Gelatine \n  stick", "gelatine stick").score == 1.0
    assert guide.get_feedback("q", "the black book is the leftmost", ["The black book is the leftmost."]).score == 1.0


@pytest.mark.parametrize("output", ["The answer is three", "three apples", "thre", "", None])
def test_exact_match_needs_the_whole_output_to_match(output: str | None) -> None:
    assert ExactMatchGuide().get_feedback("q", output, ["three", "3"]).score == 0.0


def test_exact_match_without_normalisation_is_strict() -> None:
    guide = ExactMatchGuide(normalize=False)
    assert guide.get_feedback("q", "three", "three").score == 1.0
    assert guide.get_feedback("q", "Three", "three").score == 0.0
    assert guide.get_feedback("q", "three ", "three").score == 0.0


def test_exact_match_compares_non_strings_as_text() -> None:
    assert ExactMatchGuide().get_feedback("q", "3", 3).score == 1.0
    assert ExactMatchGuide().get_feedback("q", 3, ["3"]).score == 1.0


def test_exact_match_needs_info() -> None:
    with pytest.raises(ValueError, match="needs the example's info"):
        ExactMatchGuide().get_feedback("q", "a", None)
    with pytest.raises(ValueError, match="empty list"):
        ExactMatchGuide().get_feedback("q", "a", [])


# --- parse_score -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7", 7.0),
        ("7/10", 7.0),
        ("7 / 10", 7.0),
        ("7 out of 10", 7.0),
        ("Score: 7", 7.0),
        ("score = 7.5", 7.5),
        ("**Score:** 7", 7.0),
        ("**Score: 7**", 7.0),
        ("### Final score: 9/10", 9.0),
        ("- Score: 6", 6.0),
        ("seven", 7.0),
        ("Seven.", 7.0),
        ("Score: ten", 10.0),
        ("0", 0.0),
        ("10", 10.0),
        ("Rating: 5", 5.0),
        ("The answer is correct.\nScore: 8", 8.0),
        ("I would give it a score of 4.", 4.0),
        ("Score: 7\nA score of 10 would need a perfect answer.", 7.0),  # the Score line wins
        ("It lists 3 of 4 items.\nScore: 6", 6.0),  # not the last number of the text
        ("Score: 3\n\n7", 3.0),
    ],
)
def test_parse_score_accepts(text: str, expected: float) -> None:
    assert parse_score(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "11",
        "-1",
        "Score: 11",
        "Score: -1",
        "Score: 17",
        "7/5",  # the denominator is not out_of
        "Score: 7/100",
        "eleven",
        "Score: N/A",
        "no score here",
        "",
        "The 3 items are correct.",  # a number in the reasoning is not a score
        "Score: 11\n5",  # a bad Score line is rejected, not replaced by another number
        "1.5.2",
    ],
)
def test_parse_score_rejects(text: str) -> None:
    assert parse_score(text) is None


def test_parse_score_other_scales() -> None:
    assert parse_score("Score: 4/5", out_of=5) == 4.0
    assert parse_score("Score: 7", out_of=5) is None
    assert parse_score("Score: 80", out_of=100) == 80.0


# --- LLMJudgeGuide ---------------------------------------------------------------------

QUESTION = "Is the number of objects counted correctly?"


async def test_judge_good_reply() -> None:
    model = ScriptedModel(["The output counts all three objects.\nScore: 8"])
    guide = LLMJudgeGuide(model, QUESTION)
    feedback = await guide.aget_feedback("I have a cat, a dog and a fish. How many?", "three", ["three", "3"])
    assert feedback == Feedback(0.8, "The output counts all three objects.")
    (request,) = model.requests
    system, user = request["messages"]
    assert system["role"] == "system" and "Score: N" in system["content"]
    assert user["role"] == "user"
    for shown in (QUESTION, '"three"', '"I have a cat, a dog and a fish. How many?"', '"3"'):
        assert shown in user["content"]


async def test_judge_prompt_leaves_out_missing_info() -> None:
    model = ScriptedModel(["Score: 5"])
    await LLMJudgeGuide(model, QUESTION).aget_feedback("x-text", "out-text", None)
    user = model.requests[0]["messages"][-1]["content"]
    assert "Reference" not in user and '"out-text"' in user and QUESTION in user


async def test_judge_retries_an_unparsable_reply_and_shows_it() -> None:
    model = ScriptedModel(["The output looks right to me.", "Score: 9"])
    feedback = await LLMJudgeGuide(model, QUESTION).aget_feedback("x", "y", None)
    assert feedback.score == 0.9
    assert feedback.feedback == "The output looks right to me."  # the reasoning of the first reply
    assert len(model.requests) == 2
    retry = model.requests[1]["messages"]
    assert retry[:2] == model.requests[0]["messages"]
    assert retry[2] == {"role": "assistant", "content": "The output looks right to me."}
    assert retry[3]["role"] == "user" and "Score: N" in retry[3]["content"]


async def test_judge_gives_up_after_max_generation_retries() -> None:
    model = ScriptedModel(["no idea"] * 10)
    feedback = await LLMJudgeGuide(model, QUESTION, max_generation_retries=2).aget_feedback("x", "y", None)
    assert feedback.score is None
    assert "no readable score in 3 replies" in feedback.feedback and "no idea" in feedback.feedback
    assert len(model.requests) == 3
    assert model.remaining == 7


async def test_judge_out_of_range_score_is_retried() -> None:
    model = ScriptedModel(["Great.\nScore: 12", "Score: 4"])
    feedback = await LLMJudgeGuide(model, QUESTION, out_of=5).aget_feedback("x", "y", None)
    assert feedback.score == pytest.approx(0.8)
    assert "0 to 5" in model.requests[1]["messages"][-1]["content"]


async def test_judge_model_error_gives_no_score() -> None:
    model = ScriptedModel([LLMUnavailableError("server down", attempts=3)])
    feedback = await LLMJudgeGuide(model, QUESTION).aget_feedback("x", "y", None)
    assert feedback.score is None
    assert "LLMUnavailableError" in feedback.feedback and "server down" in feedback.feedback


async def test_judge_budget_exceeded_stops_the_run() -> None:
    model = ScriptedModel([BudgetExceeded("over budget")])
    with pytest.raises(BudgetExceeded):
        await LLMJudgeGuide(model, QUESTION).aget_feedback("x", "y", None)


async def test_judge_custom_user_template() -> None:
    model = ScriptedModel(["Score: 10"])
    guide = LLMJudgeGuide(model, QUESTION, template="Q={{ question }} O={{ output | json }} /{{ out_of }}")
    await guide.aget_feedback("x", "y", None)
    assert model.requests[0]["messages"][-1]["content"] == f'Q={QUESTION} O="y" /10'


def test_judge_argument_checks() -> None:
    model = ScriptedModel([])
    with pytest.raises(ValueError, match="question must be a non-empty str"):
        LLMJudgeGuide(model, " ")
    with pytest.raises(ValueError, match="max_generation_retries"):
        LLMJudgeGuide(model, QUESTION, max_generation_retries=-1)
    with pytest.raises(ValueError, match="out_of"):
        LLMJudgeGuide(model, QUESTION, out_of=0)
    with pytest.raises(ValueError, match="variable that was not given"):
        LLMJudgeGuide(model, QUESTION, template="{{ rubric }}")


# --- Guide.aget_feedback ---------------------------------------------------------------


class SyncGuide(Guide):
    def __init__(self, result: object) -> None:
        self.result = result
        self.thread: int | None = None

    def get_feedback(self, x, output, info):  # type: ignore[no-untyped-def]
        self.thread = threading.get_ident()
        return self.result


class AsyncGuide(Guide):
    async def get_feedback(self, x, output, info):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return (1.0 if output == info else 0.0, f"compared {output!r}")


async def test_sync_guide_runs_in_a_worker_thread() -> None:
    guide = SyncGuide(Feedback(0.25, "meh"))
    assert await guide.aget_feedback("x", "y", None) == Feedback(0.25, "meh")
    assert guide.thread is not None and guide.thread != threading.get_ident()


async def test_async_guide_and_tuple_result() -> None:
    assert await AsyncGuide().aget_feedback("x", "a", "a") == Feedback(1.0, "compared 'a'")


@pytest.mark.parametrize(
    ("result", "expected"),
    [(0.5, Feedback(0.5)), (1, Feedback(1.0)), ((None, "unsure"), Feedback(None, "unsure")), ((0, None), Feedback(0.0))],
)
async def test_returned_values_are_normalized(result: object, expected: Feedback) -> None:
    assert await SyncGuide(result).aget_feedback("x", "y", None) == expected


@pytest.mark.parametrize("result", [None, "good", [1.0, "x"], True])
async def test_unsupported_return_values_are_clear_errors(result: object) -> None:
    with pytest.raises(TypeError, match="return a Feedback, a \\(score, feedback\\) tuple or a number"):
        await SyncGuide(result).aget_feedback("x", "y", None)


async def test_base_guide_must_be_subclassed() -> None:
    with pytest.raises(NotImplementedError, match="must implement get_feedback"):
        await Guide().aget_feedback("x", "y", None)
