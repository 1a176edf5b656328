"""A damaged run directory is refused, naming the file and the field, and left exactly as it is.

Each case damages one file of a run stopped after step 3 of 6 (checkpoint, agent.json,
best.json, metrics, evaluations, ledger) and resumes it: the resume must fail with a
`RunDirError` that names the file and what is wrong, and every byte of the folder must
be as it was. The undamaged run resumes to its end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from opto import AggregatedUpdate, Aggregator, ExactMatchGuide, MaxCalls, Optimizer, RunDirError, ScriptedModel
from world import LevelAgent, agent_reply, dataset, make_brain

DATA = dataset([0, 1, 2, 3, 4, 5])
ARGS: dict[str, Any] = {"num_epochs": 2, "batch_size": 2, "seed": 3, "progress": False, "min_score": 0.0,
                        "test_dataset": dataset([0, 1, 2, 3]), "eval_frequency": 2}


def train(run_dir: Path, *, resume: bool = False, **kwargs: Any) -> Any:
    trainer = AggregatedUpdate(LevelAgent(ScriptedModel(agent_reply, name="agent-model")),
                               Optimizer(ScriptedModel(make_brain(), name="brain")),
                               aggregator=Aggregator(ScriptedModel(make_brain(), name="brain")), concurrency=1, proposals="per_instance", validation="minibatch")
    return trainer.train(ExactMatchGuide(), DATA, run_dir=run_dir, resume=resume, **{**ARGS, **kwargs})


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run stopped after step 3 (of 6), with every file written."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    result = train(run_dir, stop=MaxCalls(1))
    while result.steps < 3:
        result = train(run_dir, resume=True, stop=MaxCalls(result.usage.calls + 1))
    assert result.steps == 3 and result.stopped_reason
    assert {p.name for p in run_dir.iterdir()} >= {"checkpoint.json", "agent.json", "best.json", "ledger.jsonl",
                                                 "metrics.jsonl", "eval.jsonl"}
    return run_dir


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def edit_json(name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        value = json.loads((run_dir / name).read_text())
        change(value)
        (run_dir / name).write_text(json.dumps(value))
    return damage


def write(name: str, text: str) -> Callable[[Path], None]:
    return lambda run_dir: (run_dir / name).write_text(text)


def truncate(name: str) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        data = (run_dir / name).read_bytes()
        (run_dir / name).write_bytes(data[: len(data) // 2])
    return damage


def edit_line(name: str, index: int, change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        lines = (run_dir / name).read_text().splitlines()
        record = json.loads(lines[index])
        lines[index] = json.dumps(change(record))
        (run_dir / name).write_text("\n".join(lines) + "\n")
    return damage


def drop_lines(name: str, keep: int) -> Callable[[Path], None]:
    def damage(run_dir: Path) -> None:
        lines = (run_dir / name).read_text().splitlines(keepends=True)
        (run_dir / name).write_text("".join(lines[:keep]))
    return damage


CASES: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    # checkpoint.json
    "checkpoint truncated": (truncate("checkpoint.json"), ["checkpoint.json", "not valid JSON"]),
    "checkpoint empty object": (write("checkpoint.json", "{}"), ["checkpoint.json", "version", "step"]),
    "checkpoint a list": (write("checkpoint.json", "[]"), ["checkpoint.json", "list"]),
    "checkpoint negative step": (edit_json("checkpoint.json", lambda c: c.update(step=-3)),
                                 ["checkpoint.json", "step", "-3"]),
    "checkpoint step out of range": (edit_json("checkpoint.json", lambda c: c.update(step=40)),
                                     ["checkpoint.json", "step", "40"]),
    "checkpoint step as text": (edit_json("checkpoint.json", lambda c: c.update(step="three")),
                                ["checkpoint.json", "step", "three"]),
    "checkpoint parameter of the wrong type": (
        edit_json("checkpoint.json", lambda c: c["parameters"].update(system_prompt=42)),
        ["checkpoint.json", "parameters.system_prompt", "42"]),
    "checkpoint unknown parameter": (edit_json("checkpoint.json", lambda c: c["parameters"].update(other="x")),
                                     ["checkpoint.json", "parameters.other"]),
    "checkpoint config without batch_size": (edit_json("checkpoint.json", lambda c: c["config"].pop("batch_size")),
                                            ["checkpoint.json", "config", "batch_size"]),
    "checkpoint loader state damaged": (edit_json("checkpoint.json", lambda c: c["loader_state"].update(step=99)),
                                        ["checkpoint.json", "loader_state", "99"]),
    "checkpoint ledger count negative": (
        edit_json("checkpoint.json", lambda c: c.update(ledger_records=-1)), ["checkpoint.json", "ledger_records"]),
    "checkpoint from a newer opto": (edit_json("checkpoint.json", lambda c: c.update(version=99)),
                                     ["checkpoint.json", "version", "newer opto"]),
    # the ledger: a step the checkpoint counts is missing, or a line is garbage
    "ledger shorter than the checkpoint": (drop_lines("ledger.jsonl", 5), ["ledger.jsonl", "checkpoint.json counts"]),
    "ledger line not JSON": (lambda d: (d / "ledger.jsonl").write_text("{not json\n" + (d / "ledger.jsonl").read_text()),
                             ["ledger.jsonl", "line 1"]),
    "ledger negative step": (edit_line("ledger.jsonl", 0, lambda r: {**r, "step": -1}), ["ledger.jsonl", "step -1"]),
    # agent.json
    "agent.json truncated": (truncate("agent.json"), ["agent.json", "not valid JSON"]),
    "agent.json empty object": (write("agent.json", "{}"), ["agent.json", "system_prompt"]),
    "agent.json wrong type": (write("agent.json", '{"system_prompt": 42}'), ["agent.json", "system_prompt", "42"]),
    # best.json
    "best.json truncated": (truncate("best.json"), ["best.json", "not valid JSON"]),
    "best.json empty object": (write("best.json", "{}"), ["best.json", "step"]),
    "best.json negative step": (edit_json("best.json", lambda b: b.update(step=-2)), ["best.json", "step", "-2"]),
    "best.json step beyond the run": (edit_json("best.json", lambda b: b.update(step=30)), ["best.json", "30"]),
    "best.json score as text": (edit_json("best.json", lambda b: b.update(score="high")), ["best.json", "score"]),
    "best.json parameter of the wrong type": (edit_json("best.json", lambda b: b["parameters"].update(
        system_prompt=[1])), ["best.json", "parameters.system_prompt"]),
    # metrics.jsonl and eval.jsonl
    "metrics empty object": (edit_line("metrics.jsonl", 0, lambda r: {}), ["metrics.jsonl", "line 1", "step"]),
    "metrics step as text": (edit_line("metrics.jsonl", 1, lambda r: {**r, "step": "2"}),
                             ["metrics.jsonl", "line 2", "'2'"]),
    "metrics negative step": (edit_line("metrics.jsonl", 0, lambda r: {**r, "step": -4}), ["metrics.jsonl", "-4"]),
    "metrics step beyond the checkpoint": (edit_line("metrics.jsonl", 0, lambda r: {**r, "step": 9}),
                                           ["metrics.jsonl", "step 9", "beyond"]),
    "metrics line a list": (edit_line("metrics.jsonl", 0, lambda r: [1, 2]), ["metrics.jsonl", "line 1", "list"]),
    "eval step beyond the checkpoint": (edit_line("eval.jsonl", 0, lambda r: {**r, "step": 7}),
                                        ["eval.jsonl", "step 7"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_file_is_refused_by_name_and_nothing_is_changed(stopped_run, tmp_path, case):
    damage, expected_words = CASES[case]
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    damage(run_dir)
    before = snapshot(run_dir)
    with pytest.raises(RunDirError) as refused:
        train(run_dir, resume=True)
    message = str(refused.value)
    for word in expected_words:
        assert word in message, f"{case}: {word!r} not in {message!r}"
    assert "Nothing" in message and "changed" in message
    assert snapshot(run_dir) == before, f"{case}: the folder was changed"


def test_the_undamaged_copy_resumes_to_the_end(stopped_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    result = train(run_dir, resume=True)
    assert result.steps == 6 and result.stopped_reason is None


@pytest.mark.parametrize("resume", [True, False])
def test_run_files_without_a_checkpoint_are_neither_resumed_nor_overwritten(stopped_run, tmp_path, resume):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    (run_dir / "checkpoint.json").unlink()
    before = snapshot(run_dir)
    with pytest.raises(RunDirError, match="no checkpoint.json"):
        train(run_dir, resume=resume)
    assert snapshot(run_dir) == before


def test_resume_removes_temp_files_a_killed_write_left(stopped_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(stopped_run, run_dir)
    for name in ("checkpoint.json", "agent.json", "ledger.jsonl"):
        (run_dir / f".{name}.k1ll3d.tmp").write_text('{"half": ')
    (run_dir / "notes.tmp").write_text("the user's own file")
    train(run_dir, resume=True)
    assert sorted(p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")) == ["notes.tmp"]
