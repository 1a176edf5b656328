"""A new user's first runs, as they meet them: small data, one script, no options.

The agent labels sentiment and is right only once its instruction carries the one clear
fix; the scripted optimizer offers that fix every step (and, as a second proposer,
`DemoProposer` offers demos that change nothing). Every small dataset and batch size
must end with the fix accepted; a harmful proposal must never be kept; crashes must
lower the score; bad data and bad options must be refused before any model call.
"""

from __future__ import annotations

import json

import pytest

from opto import (
    Agent,
    AggregatedUpdate,
    DemoProposer,
    Demos,
    ExactMatchGuide,
    MinibatchValidation,
    Optimizer,
    OptoError,
    Parameter,
    ScriptedModel,
    TooManyFailures,
)
from opto.cli import main
from opto.report.markdown import write_report

FIX = "Answer with one word: positive or negative."
WORDS = ["good", "great", "fine", "lovely", "bad", "awful", "poor", "sad"]


def sentiment_data(n: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        word = WORDS[i % len(WORDS)]
        rows.append({"x": f"review {i}: {word}", "info": "positive" if WORDS.index(word) < 4 else "negative"})
    return rows


class Sentiment(Agent):
    """Right on every example once its instruction is `FIX`; before, it writes a sentence."""

    def __init__(self, instruction: str = "Read the review.", crash_on: str | None = None) -> None:
        self.instruction = Parameter(instruction, description="the instruction")
        self.demos = Demos([], max_demos=2)
        self.crash_on = crash_on

    def forward(self, review: str) -> str:
        if self.crash_on is not None and self.crash_on in review:
            raise KeyError(self.crash_on)
        _ = self.demos.value  # read, but they change nothing here
        word = review.split(": ")[1]
        label = "positive" if WORDS.index(word) < 4 else "negative"
        if self.instruction.value == FIX:
            return label
        if self.instruction.value == "HARM":
            return "negative" if label == "positive" else "positive"
        return f"The review says {word}."


def brain(instruction: str = FIX) -> ScriptedModel:
    """The optimizer and aggregator: every reply suggests `instruction`."""
    return ScriptedModel(lambda messages: json.dumps({"suggestion": {"instruction": instruction}}), name="brain")


def proposers(count: int, model: ScriptedModel) -> list:
    return [Optimizer(model), DemoProposer()][:count]


@pytest.mark.parametrize("n", [8, 10, 12, 20, 31])
@pytest.mark.parametrize("batch_size", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("count", [1, 2])
def test_small_data_learns_the_one_clear_fix(n, batch_size, count):
    model = brain()
    agent = Sentiment()
    result = AggregatedUpdate(agent, proposers(count, model)).train(
        ExactMatchGuide(), sentiment_data(n), test_dataset=sentiment_data(8, offset=100), batch_size=batch_size,
        progress=False,
    )
    assert agent.instruction.value == FIX, result.diagnosis
    assert result.initial_test_score == 0.0 and result.final_test_score == 1.0
    assert result.accepted >= 1 and result.diagnosis is None


@pytest.mark.parametrize("n, batch_size", [(10, 4), (50, 8)])
def test_small_data_learns_with_a_held_out_split_too(n, batch_size):
    agent = Sentiment()
    result = AggregatedUpdate(agent, proposers(2, brain())).train(
        ExactMatchGuide(), sentiment_data(n), test_dataset=sentiment_data(8, offset=100), batch_size=batch_size,
        num_epochs=2, progress=False,
    )
    assert result.final_test_score == 1.0 and agent.instruction.value == FIX


@pytest.mark.parametrize("n, batch_size", [(8, 2), (10, 4), (20, 8), (50, 4)])
def test_a_harmful_proposal_is_never_kept(n, batch_size):
    agent = Sentiment(instruction=FIX)  # already right: every change the optimizer offers breaks it
    result = AggregatedUpdate(agent, proposers(2, brain("HARM"))).train(
        ExactMatchGuide(), sentiment_data(n), test_dataset=sentiment_data(8, offset=100), batch_size=batch_size,
        num_epochs=2, progress=False,
    )
    assert agent.instruction.value == FIX and result.final_test_score == 1.0


def test_a_crashed_example_lowers_the_reported_score(tmp_path):
    agent = Sentiment(instruction=FIX, crash_on="review 102")
    result = AggregatedUpdate(agent, Optimizer(brain())).train(
        ExactMatchGuide(), sentiment_data(8), test_dataset=sentiment_data(5, offset=100), batch_size=4,
        run_dir=tmp_path, progress=False,
    )
    assert result.final_test_score == pytest.approx(0.8)  # 4 of 5: the KeyError counts as wrong
    assert result.final_test_failed == 1 and result.initial_test_failed == 1
    report = write_report(tmp_path)
    assert report.last_test_score == pytest.approx(0.8)
    assert "step 2: 0.800" in (tmp_path / "report.md").read_text() and "(1 failed)" in (tmp_path / "report.md").read_text()


def test_failures_left_out_only_when_asked():
    agent = Sentiment(instruction=FIX, crash_on="review 102")
    result = AggregatedUpdate(agent, Optimizer(brain())).train(
        ExactMatchGuide(), sentiment_data(8), test_dataset=sentiment_data(5, offset=100), batch_size=4,
        min_score=None, progress=False,
    )
    assert result.final_test_score == 1.0 and result.final_test_failed == 1


def test_a_run_stopped_by_failures_raises_and_can_be_resumed(tmp_path):
    agent = Sentiment(crash_on="review")  # every rollout crashes
    trainer = AggregatedUpdate(agent, Optimizer(brain()))
    with pytest.raises(TooManyFailures, match="resume=True") as stopped:
        trainer.train(ExactMatchGuide(), sentiment_data(8), batch_size=4, run_dir=tmp_path, progress=False)
    assert isinstance(stopped.value, OptoError) and stopped.value.result.steps == 0
    agent.crash_on = None  # the user fixes the agent and resumes
    result = trainer.train(ExactMatchGuide(), sentiment_data(8), batch_size=4, run_dir=tmp_path, resume=True,
                           progress=False)
    assert result.steps == 2 and agent.instruction.value == FIX


@pytest.mark.parametrize("where", ["train_dataset", "test_dataset"])
def test_an_example_without_its_answer_is_refused_before_any_call(where):
    model = brain()
    data = sentiment_data(8)
    test = sentiment_data(4, offset=100)
    (data if where == "train_dataset" else test)[3] = {"x": "review 3: bad"}  # no info
    with pytest.raises(OptoError, match=f"{where}: example 3 .*ExactMatchGuide needs the expected answer"):
        AggregatedUpdate(Sentiment(), Optimizer(model)).train(
            ExactMatchGuide(), data, test_dataset=test, batch_size=4, progress=False
        )
    assert model.usage.calls == 0


@pytest.mark.parametrize(
    "option, value",
    [("num_epochs", "2"), ("batch_size", "4"), ("batch_size", 0), ("stepsize", "0.5"), ("eval_frequency", 1.5),
     ("seed", "0"), ("shuffle", "no"), ("min_score", "0")],
)
def test_a_bad_option_is_an_opto_error_naming_it(option, value):
    with pytest.raises(OptoError, match=f"{option} must be .*{value!r}"):
        AggregatedUpdate(Sentiment(), Optimizer(brain())).train(
            ExactMatchGuide(), sentiment_data(8), progress=False, **{option: value}
        )


def test_a_run_that_learns_nothing_says_why(tmp_path, caplog, capsys):
    # Batches of 8 where 2 examples are fixed and none broken: p = 1/4 > 0.1, so the
    # paired test on the batch rejects the win; the result says so and what would change it.
    class Partial(Sentiment):
        def forward(self, review: str) -> str:
            answer = super().forward(review)
            return answer if self.instruction.value != FIX or review.split(": ")[1] in ("good", "bad") else "?"

    agent = Partial()
    with caplog.at_level("WARNING"):
        result = AggregatedUpdate(agent, Optimizer(brain()), validation=MinibatchValidation(alpha=0.1)).train(
            ExactMatchGuide(), sentiment_data(16), batch_size=8, shuffle=False, run_dir=tmp_path, progress=False
        )
    assert result.accepted == 0 and result.rejected_wins == 2
    assert result.best_rejected_win["wins"] == 2 and result.best_rejected_win["losses"] == 0
    why = result.diagnosis
    assert why.startswith("No candidate was accepted in 2 steps.")
    assert "p <= 0.1" in why and "batch_size" in why and "validation=" in why and "alpha=" in why
    assert any(why in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert json.loads((tmp_path / "checkpoint.json").read_text())["best_rejected_win"]["wins"] == 2
    # opto report finds the same in the ledger
    assert main(["report", str(tmp_path)]) == 0
    assert f"why: {why}" in capsys.readouterr().out
    assert f"**Why:** {why}" in (tmp_path / "report.md").read_text()
    assert main(["report", str(tmp_path), "--html"]) == 0
    assert "<strong>Why:</strong> No candidate was accepted" in (tmp_path / "report.html").read_text()


def test_a_run_whose_proposals_do_not_help_says_so():
    result = AggregatedUpdate(Sentiment(), Optimizer(brain("Still wrong."))).train(
        ExactMatchGuide(), sentiment_data(8), batch_size=4, progress=False
    )
    assert result.accepted == 0 and result.rejected_wins == 0
    assert "the proposals did not help" in result.diagnosis


def test_the_command_names_its_options_not_python_arguments(tmp_path):
    from opto.cli import in_command_words
    from opto.errors import RunDirError

    trainer = AggregatedUpdate(Sentiment(), Optimizer(brain()))
    trainer.train(ExactMatchGuide(), sentiment_data(8), batch_size=4, run_dir=tmp_path, progress=False)
    with pytest.raises(RunDirError) as again:  # the library's words, for a script
        trainer.train(ExactMatchGuide(), sentiment_data(8), batch_size=4, run_dir=tmp_path, progress=False)
    assert "resume=True" in str(again.value)
    said = in_command_words(str(again.value))  # the command's words, for its user
    assert "add --resume" in said and "--run-dir" in said and "resume=True" not in said


def test_log_lines_of_the_command_name_its_options(caplog):
    import logging

    from opto.cli import command_words

    logger = logging.getLogger("opto.trainer.session")
    with caplog.at_level("WARNING"), command_words():
        logger.warning("training stopped by SIGTERM after step %d (saved; resume=True continues)", 2)
    logger.warning("after the command: resume=True")  # a script's own log lines keep the library's words
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "training stopped by SIGTERM after step 2 (saved; --resume continues)"
    assert said[1] == "after the command: resume=True"
