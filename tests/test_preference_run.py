"""End to end: a real training run with num_proposals=2 -> ledger -> preference files
(the run is `world.make_run`, shared with the fine-tuning tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opto import AggregatedUpdate, ExactMatchGuide, Optimizer, RunDir, ScriptedModel
from opto.cli import main
from opto.preference import (
    PreferencePairBuilder,
    export_run,
    read_turns,
    validate_jsonl,
)
from opto._util.files import json_key
from opto.trainer.proposal_scoring import check_score_proposals
from world import BAD, GOOD, WORDS, Counter, counting_reply, alternating, make_run

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("run")
    result = make_run(path)
    assert result["accepted"] == 1 and result["final_parameters"] == {"prompt": GOOD}
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------------------- the trainer hook


def test_each_proposal_is_scored_and_its_rollouts_recorded(run_dir: Path) -> None:
    ledger = RunDir(run_dir).ledger()
    proposals = [r for r in ledger if r["type"] == "proposal"]
    scores = {r["proposal_id"]: r for r in ledger if r["type"] == "proposal_score"}
    assert len(proposals) == 16 and set(scores) == {p["proposal_id"] for p in proposals}
    reruns = [r for r in ledger if r["type"] == "rollout" and r["phase"] == "proposal_validation"]
    for proposal in proposals:
        score = scores[proposal["proposal_id"]]
        assert score["instance_id"] == proposal["instance_id"] and score["mode"] == "instance"
        mine = [r for r in reruns if r["proposal_id"] == proposal["proposal_id"]]
        if proposal["update"]:
            # "instance": the instance the proposal was made for, re-run under its update
            assert [r["instance_id"] for r in mine] == [proposal["instance_id"]]
            assert score["score"] == mine[0]["score"] and score["num_rollouts"] == 1
        else:
            # no change asked: the current values' score on that instance, nothing re-run
            train = next(r for r in ledger if r["type"] == "rollout" and r["phase"] == "train"
                         and r["step"] == proposal["step"] and r["instance_id"] == proposal["instance_id"])
            assert mine == [] and score["score"] == train["score"] and "no change" in score["note"]
    good = [scores[p["proposal_id"]]["score"] for p in proposals if p["sample_index"] == 0]
    bad = [scores[p["proposal_id"]]["score"] for p in proposals if p["sample_index"] == 1]
    assert good == [1.0] * 8 and bad == [0.0] * 8


def test_minibatch_scoring_reruns_the_whole_batch(tmp_path: Path) -> None:
    make_run(tmp_path, examples=2, score_proposals="minibatch")
    ledger = RunDir(tmp_path).ledger()
    reruns = [r for r in ledger if r["type"] == "rollout" and r["phase"] == "proposal_validation"]
    scored = [r for r in ledger if r["type"] == "proposal_score"]
    assert len(scored) == 4 and all(s["mode"] == "minibatch" for s in scored)
    # two distinct updates, each run on both examples (identical updates share one run)
    assert sorted(r["instance_id"] for r in reruns) == ["q1", "q1", "q2", "q2"]
    assert all(s["num_rollouts"] == 2 for s in scored)


def test_score_proposals_setting_is_checked() -> None:
    assert check_score_proposals(None) is None and check_score_proposals("instance") == "instance"
    with pytest.raises(ValueError, match="'instance' or 'minibatch'"):
        check_score_proposals("all")


def test_without_scoring_optimizer_turns_have_no_scores(tmp_path: Path) -> None:
    data = [{"x": "Count: apple", "info": "1", "id": "q1"}]
    trainer = AggregatedUpdate(Counter(ScriptedModel(counting_reply)),
                               Optimizer(ScriptedModel(alternating(GOOD, BAD)), num_proposals=2), validation="minibatch", final_check=None)
    trainer.train(ExactMatchGuide(), data, run_dir=tmp_path, progress=False)
    reading = read_turns(tmp_path, "optimizer")
    assert [len(t.candidates) for t in reading.turns] == [0]
    assert reading.unscored == {"optimizer: proposal without a score": 2}
    with pytest.raises(ValueError, match="score_proposals='instance'"):
        export_run(tmp_path, tmp_path / "out.jsonl", source="optimizer")


# ---------------------------------------------------------------------------- the exports


def test_openai_dpo_export_of_a_real_run_is_valid(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "pairs.jsonl"
    report = export_run(run_dir, out, source="all", format="openai-dpo")
    assert report.records == validate_jsonl(out, "openai-dpo", min_examples=10) == report.stats.pairs
    # one pair per instance from the optimizer and from the agent; the aggregator's
    # identical prompts of later steps give duplicate pairs, which are dropped
    assert report.stats.by_source["optimizer"] == report.stats.by_source["agent"] == 8
    assert report.stats.by_source["aggregator"] >= 2
    for record in _records(out):
        assert record["input"]["messages"][-1]["role"] == "user"
        assert record["preferred_output"][0]["content"] != record["non_preferred_output"][0]["content"]


@pytest.mark.parametrize("source", ["optimizer", "aggregator", "agent", "all"])
def test_every_pair_has_chosen_score_above_rejected(run_dir: Path, tmp_path: Path, source: str) -> None:
    out = tmp_path / "pairs.jsonl"
    export_run(run_dir, out, source=source, format="trl-chat", validation_fraction=0.25, seed=3)
    records = _records(out) + _records(tmp_path / "pairs.validation.jsonl")
    expected = len(PreferencePairBuilder().build(read_turns(run_dir, source).turns))
    assert len(records) == expected >= {"optimizer": 8, "aggregator": 2, "agent": 8, "all": 18}[source]
    # Independent check: look each response up among its turn's scored candidates in the ledger.
    turns = {json_key(t.prompt): t for t in read_turns(run_dir, source).turns}
    for record in records:
        record = {"prompt": json_key(record["prompt"]), "chosen": record["chosen"][0]["content"],
                  "rejected": record["rejected"][0]["content"]}
        turn = turns[record["prompt"]]
        assert _score_in(turn, record["chosen"]) > _score_in(turn, record["rejected"])


def _score_in(turn: Any, text: str) -> float:
    """The mean score of the turn's candidates with this response (identical responses are merged)."""
    values = [c.score for c in turn.candidates if c.response == text]
    assert values, f"{text!r} is not a response of turn {turn.turn_id}"
    return sum(values) / len(values)


def test_agent_pairs_teach_what_the_optimized_prompt_taught(run_dir: Path) -> None:
    pairs = PreferencePairBuilder().build(read_turns(run_dir, "agent").turns)
    assert len(pairs) == 8
    for pair in pairs:
        # the system prompts differ between the runs, so the prompt is the visible input
        assert [m["role"] for m in pair.prompt] == ["user"]
        count = len(pair.prompt[0]["content"].split(":", 1)[1].split())
        assert (pair.chosen, pair.rejected) == (str(count), f"{WORDS[count]} items")


def test_cli_export_prints_what_it_wrote_and_the_counts(run_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dpo.jsonl"
    code = main(["export", str(run_dir), "--source", "all", "--format", "openai-dpo", "--out", str(out),
                 "--validation-fraction", "0.2", "--min-score-diff", "0.5"])
    printed = capsys.readouterr().out
    assert code == 0
    train, validation = _records(out), _records(tmp_path / "dpo.validation.jsonl")
    total = len(PreferencePairBuilder().build(read_turns(run_dir).turns))
    assert len(train) + len(validation) == total and validation
    assert f"wrote {len(train)} openai-dpo records to {out}" in printed
    assert "(validation)" in printed and f"pairs: {total}" in printed
    assert "skipped turns (single candidate): 0" in printed


def test_cli_export_explains_an_empty_result(run_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(run_dir), "--source", "agent", "--out", str(tmp_path / "x.jsonl"),
                 "--min-score-diff", "2"])
    assert code == 1 and not (tmp_path / "x.jsonl").exists()
    assert "differed by less than --min-score-diff" in capsys.readouterr().err


def test_export_of_a_missing_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no ledger.jsonl"):
        export_run(tmp_path / "nope", tmp_path / "out.jsonl")


def test_export_cli_takes_the_ledger_path_refuses_a_missing_folder_and_writes_nemo_strings(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "nemo.jsonl"
    assert main(["export", str(run_dir / "ledger.jsonl"), "--format", "nemo", "--nemo-prompt", "string",
                 "--out", str(out)]) == 0
    records = _records(out)
    assert records and all(isinstance(r["prompt"], str) for r in records)
    prompts = {json_key(t.prompt): t.prompt[-1]["content"] for t in read_turns(run_dir, "all").turns}
    assert {r["prompt"] for r in records} <= set(prompts.values())  # the last message's text
    capsys.readouterr()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "missing" / "pairs.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "does not exist; create it first" in err and not (tmp_path / "missing").exists()


def test_the_nothing_to_export_hint_counts_what_it_says(run_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(run_dir), "--min-score-diff", "5", "--out", str(tmp_path / "p.jsonl")]) == 1
    err = capsys.readouterr().err
    builder = PreferencePairBuilder(min_score_diff=5)
    builder.build(read_turns(run_dir, "all").turns)
    assert builder.stats.turns_skipped_single_candidate == 0 and builder.stats.pairs_skipped_small_diff > 0
    assert "had a single candidate" not in err  # the old hint said every turn had one
    assert f"{builder.stats.pairs_skipped_small_diff} candidate pairs tied or differed by less than" in err


# ------------------------------------------------------------- supervised data from single replies


@pytest.fixture(scope="module")
def single_reply_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run in which every agent prompt was answered once (one proposal, one candidate)."""
    from world import dataset, make_level_trainer

    path = tmp_path_factory.mktemp("single")
    trainer, *_ = make_level_trainer(level=2, validation="none")  # the level rises each step: 2 right, 2 wrong
    trainer.train(ExactMatchGuide(), dataset([0, 5, 1, 6]), run_dir=path, progress=False, shuffle=False)
    return path


def test_supervised_export_of_single_replies_needs_min_score_and_says_so(single_reply_run: Path,
                                                                          tmp_path: Path) -> None:
    turns = read_turns(single_reply_run, "agent").turns
    assert len(turns) == 4 and all(len(t.candidates) == 1 for t in turns)
    with pytest.raises(ValueError, match=r"every turn had a single candidate.*--min-score X \(min_score=X\)"):
        export_run(single_reply_run, tmp_path / "sft.jsonl", source="agent", format="openai-sft")
    report = export_run(single_reply_run, tmp_path / "sft.jsonl", source="agent", format="openai-sft", min_score=1.0)
    good = {json_key([*t.prompt, {"role": "assistant", "content": c.response}])
            for t in turns for c in t.candidates if c.score >= 1.0}
    assert len(good) == 2 and report.records == 2
    assert {json_key(r["messages"]) for r in _records(tmp_path / "sft.jsonl")} == good
    assert report.stats.candidates_below_min_score == 2


def test_min_score_is_for_supervised_formats_and_the_cli_counts_what_it_left_out(
        single_reply_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--min-score picks replies for supervised data"):
        export_run(single_reply_run, tmp_path / "p.jsonl", source="agent", format="openai-dpo", min_score=1.0)
    out = tmp_path / "sft.jsonl"
    assert main(["export", str(single_reply_run), "--source", "agent", "--format", "openai-sft",
                 "--min-score", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {len(_records(out))} openai-sft records" in printed and "replies below --min-score 1.0: " in printed
