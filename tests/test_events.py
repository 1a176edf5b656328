"""The typed ledger and the callbacks: every ledger line is a `LedgerEvent`, every step a
`StepRecord`, and observers see exactly what the ledger holds."""

import json
from pathlib import Path

import pytest

from opto import AggregatedUpdate, Aggregator, Callback, ExactMatchGuide, Optimizer, RunDir
from opto.run.events import LEDGER_VERSION, DecisionEvent, ProposalEvent, RolloutEvent, StepRecord, parse_event
from opto.llm import ScriptedModel
from opto.preference import export_run

from world import LevelAgent, agent_reply, dataset, make_brain

FIXTURE = Path(__file__).parent / "fixtures" / "ledger_f6b2917"


def make_trainer(**kwargs):
    brain = ScriptedModel(make_brain(), name="brain")
    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"))
    return AggregatedUpdate(agent, Optimizer(brain, num_proposals=2), aggregator=Aggregator(brain, num_candidates=2),
                            score_proposals="instance", concurrency=1, **{"validation": "minibatch", "proposals": "per_instance", **kwargs})


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_train_start(self, trainer, config):
        self.calls.append(("start", config["batch_size"]))

    def on_event(self, event):
        self.calls.append(("event", event))

    def on_step_end(self, record):
        self.calls.append(("step", record))

    def on_evaluate_end(self, step, result):
        self.calls.append(("evaluate", step, result.mean))

    def on_train_end(self, result):
        self.calls.append(("end", result.steps))


class Broken(Callback):
    def on_event(self, event):
        raise RuntimeError("a tracker that is down")


def test_every_ledger_line_is_a_typed_event_and_callbacks_see_them_in_order(tmp_path, caplog):
    recorder, broken = Recorder(), Broken()
    result = make_trainer().train(ExactMatchGuide(), dataset(range(6)), batch_size=2, run_dir=tmp_path,
                                  test_dataset=dataset([0, 1]), eval_frequency=2, progress=False, shuffle=False,
                                  callbacks=[recorder, broken])
    assert result.steps == 3 and result.stopped_reason is None  # the broken callback did not stop it
    assert any("Broken raised in on_event" in r.getMessage() for r in caplog.records)

    lines = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    events = [parse_event(line) for line in lines]  # raises if any line is not a LedgerEvent
    assert all(e.v == LEDGER_VERSION for e in events)
    assert {type(e).__name__ for e in events} >= {"RolloutEvent", "ProposalEvent", "ProposalScoreEvent",
                                                  "CandidateEvent", "DecisionEvent"}
    assert RunDir(tmp_path).events() == events
    assert RunDir(tmp_path).events("decision") == [e for e in events if isinstance(e, DecisionEvent)]

    seen = [call[1] for call in recorder.calls if call[0] == "event"]
    assert [e.model_dump() for e in seen] == [e.model_dump() for e in events]  # every event, in order
    records = [call[1] for call in recorder.calls if call[0] == "step"]
    assert [r.step for r in records] == [1, 2, 3]
    for record in records:
        mine = [e for e in events if e.step == record.step and getattr(e, "phase", None) != "final_check"]
        assert [e.model_dump() for e in record.events] == [e.model_dump() for e in mine]
        assert record.rollouts and all(isinstance(e, RolloutEvent) for e in record.rollouts)
        assert len(record.proposals) == 4 and all(isinstance(e, ProposalEvent) for e in record.proposals)
        assert len(record.proposal_scores) == 4 and record.decisions
        assert (record.applied is not None) == bool(record.accepted)
    assert [r.score for r in records] == result.train_scores
    assert recorder.calls[0] == ("start", 2) and recorder.calls[-1] == ("end", 3)
    assert [c[1] for c in recorder.calls if c[0] == "evaluate"] == [0, 2, 3]
    # a step's events reach the callbacks before its on_step_end
    first_step = next(i for i, c in enumerate(recorder.calls) if c[0] == "step")
    assert all(c[1].step == 1 for c in recorder.calls[:first_step] if c[0] == "event")


def test_callbacks_must_be_callback_objects():
    with pytest.raises(TypeError, match="opto.Callback"):
        make_trainer().train(ExactMatchGuide(), dataset([0]), callbacks=[print], progress=False)


def test_a_ledger_written_before_typed_events_still_reads_and_exports_the_same_pairs(tmp_path):
    events = RunDir(FIXTURE / "run").events()
    assert len(events) == 60 and all(e.v == 1 for e in events)
    assert {e.proposer for e in events if isinstance(e, ProposalEvent)} == {"optimizer"}
    for fmt in ("openai-dpo", "trl-chat"):
        report = export_run(FIXTURE / "run", tmp_path / f"{fmt}.jsonl", source="all", format=fmt)
        ours = (tmp_path / f"{fmt}.jsonl").read_text().splitlines()
        theirs = (FIXTURE / f"pairs.{fmt}.jsonl").read_text().splitlines()
        assert report.records == len(theirs) == 12
        assert sorted(map(json.loads, ours), key=json.dumps) == sorted(map(json.loads, theirs), key=json.dumps)


def test_an_unknown_record_is_refused():
    with pytest.raises(ValueError):
        parse_event({"type": "gossip", "step": 1, "time": 0.0})
    with pytest.raises(ValueError):
        parse_event({"type": "decision", "step": 1, "time": 0.0, "surprise": True})


def test_a_step_record_views():
    record = StepRecord(step=4)
    record.add(RolloutEvent(step=4, phase="train", instance_id="a"))
    record.add(DecisionEvent(step=4, reason="no candidate"))
    assert [e.instance_id for e in record.rollouts] == ["a"] and record.decisions[0].reason == "no candidate"
    assert record.applied is None and record.proposals == []


def test_the_counting_run_ledger_is_all_typed_events(counting_run):
    events = RunDir(counting_run).events()
    kinds = {e.type for e in events}
    assert {"rollout", "proposal", "proposal_score", "candidate", "decision", "applied"} <= kinds
    phases = {e.phase for e in events if isinstance(e, RolloutEvent)}
    assert phases == {"train", "validation", "proposal_validation"}


def test_a_level_trainer_run_reports_its_steps_to_a_callback(level_trainer):
    trainer, agent, agent_model, brain = level_trainer()
    recorder = Recorder()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), progress=False, shuffle=False, callbacks=[recorder])
    steps = [c[1] for c in recorder.calls if c[0] == "step"]
    assert [s.step for s in steps] == [1, 2, 3] and [s.accepted for s in steps] == [True, True, True]
    assert sum(s.accepted is True for s in steps) == result.accepted
