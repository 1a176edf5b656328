"""Killed at any write, resumed: nothing the run wrote is lost or doubled, the final evaluation included.

A child process (forked, so it starts in milliseconds) trains the level world and is
killed (`os._exit`, as `kill -9`: no cleanup runs) just before its k-th write to the run
directory, or half-way through it; the test then resumes the run and compares every file
with an uninterrupted run's. Every write point of the run is tried. Resuming a finished
run, any number of times, must leave its files exactly as they are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import opto
import opto.run.ledger
from opto import AggregatedUpdate, Aggregator, ExactMatchGuide, Optimizer, RunDir, ScriptedModel
from opto._util.files import to_json_line
from world import LevelAgent, agent_reply, dataset, make_brain

DATA = dataset([0, 1, 2, 3, 4, 5])
# 6 steps; the test set is evaluated before step 1, after step 4 and, finally, after step 6.
ARGS: dict[str, Any] = {"num_epochs": 2, "batch_size": 2, "seed": 3, "progress": False, "min_score": 0.0,
                        "test_dataset": dataset([0, 1, 2, 3, 4, 5, 6]), "eval_frequency": 4}
FILES = ("ledger.jsonl", "metrics.jsonl", "eval.jsonl", "checkpoint.json", "agent.json", "best.json")
WRITERS = ("append_jsonl", "atomic_write_json", "atomic_write_jsonl")


def train(run_dir: Path, *, resume: bool = False) -> Any:
    agent_model = ScriptedModel(agent_reply, name="agent-model")
    brain = ScriptedModel(make_brain(), name="brain")
    trainer = AggregatedUpdate(LevelAgent(agent_model), Optimizer(brain), aggregator=Aggregator(brain),
                               concurrency=1, proposals="per_instance", validation="minibatch")
    return trainer.train(ExactMatchGuide(), DATA, run_dir=run_dir, resume=resume, **ARGS)


@contextmanager
def writes_counted(kill_at: int | None = None, torn: bool = False) -> Iterator[list[str]]:
    """Count the run directory's writes; with `kill_at`, exit the process at that write
    (before it, or after writing half of an append's text when `torn`)."""
    seen: list[str] = []
    originals = {name: getattr(opto.run.ledger, name) for name in WRITERS}

    def counted(name: str) -> Any:
        def write(path: Any, value: Any) -> None:
            seen.append(f"{name} {Path(path).name}")
            if len(seen) == kill_at:
                if torn and name == "append_jsonl" and value:
                    text = "".join(to_json_line(r) + "\n" for r in value)
                    with open(path, "a", encoding="utf-8") as handle:
                        handle.write(text[: len(text) // 2])
                os._exit(137)
            originals[name](path, value)
        return write

    for name in WRITERS:
        setattr(opto.run.ledger, name, counted(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(opto.run.ledger, name, original)


def train_held_out(run_dir: Path, *, resume: bool = False) -> Any:
    """opto's defaults: a held-out split of the training data, reflective proposals, racing."""
    brain = ScriptedModel(make_brain(delta=2), name="brain")
    trainer = AggregatedUpdate(LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=3),
                               Optimizer(brain), llm=brain, concurrency=1)
    return trainer.train(ExactMatchGuide(), dataset(list(range(32))), run_dir=run_dir, resume=resume,
                         num_epochs=1, batch_size=4, seed=1, progress=False, min_score=0.0,
                         test_dataset=dataset([0, 5, 9, 14]))


def killed_run(run_dir: Path, kill_at: int, torn: bool, run: Any = None) -> None:
    pid = os.fork()
    if pid == 0:  # the child: train until killed; never return into pytest
        code = 1
        try:
            with writes_counted(kill_at, torn):
                (run or train)(run_dir)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 137, "the child was to be killed part-way"


def contents(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in FILES if (run_dir / name).exists()}


def what_happened(run_dir: Path) -> dict[str, Any]:
    """Each file's records without ids, times and counters that a resume may differ in."""
    run = RunDir(run_dir)
    checkpoint = json.loads(run.checkpoint_path.read_text())
    return {
        "ledger": [(r["step"], r["type"], r.get("instance_id"), r.get("phase"), r.get("candidate_id") is not None,
                    r.get("accepted"), json.dumps(r.get("update"), sort_keys=True), r.get("score"))
                   for r in run.ledger()],
        "metrics": [tuple(m.get(k) for k in ("step", "final", "score", "accepted", "candidate_score", "test_score"))
                    for m in run.metrics()],
        "eval": [tuple(r.get(k) for k in ("step", "final", "example_id", "output", "score")) for r in run.evaluations()],
        "checkpoint": {k: checkpoint.get(k) for k in ("step", "epoch", "finished", "parameters", "train_scores",
                                                  "test_scores", "final_evaluations", "accepted", "rejected",
                                                  "no_update", "pending_metrics", "best", "loader_state")},
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An uninterrupted run and the list of its writes."""
    run_dir = tmp_path_factory.mktemp("reference")
    with writes_counted() as writes:
        result = train(run_dir)
    assert result.steps == 6 and result.accepted > 0 and result.rejected > 0  # not a trivial run
    assert [s for s, _ in result.test_scores] == [0, 4, 6]
    finals = [m for m in RunDir(run_dir).metrics() if m.get("final")]
    assert finals == [{"step": 6, "final": True, "test_score": result.final_test_score,
                       "test_interval": list(result.final_test_interval)}]
    return run_dir, list(writes)


def test_resuming_a_finished_run_changes_nothing(reference, tmp_path):
    run_dir = tmp_path / "run"
    train(run_dir)
    before = contents(run_dir)
    assert json.loads(before["metrics.jsonl"].splitlines()[-1])["final"] is True
    for _ in range(3):  # a script that is simply run again, and again
        result = train(run_dir, resume=True)
        assert result.steps == 6 and result.stopped_reason is None
        assert contents(run_dir) == before
    assert what_happened(run_dir) == what_happened(reference[0])


def test_the_final_evaluation_is_marked_in_eval_jsonl(reference):
    rows = RunDir(reference[0]).evaluations()
    assert {(r["step"], r.get("final", False)) for r in rows} == {(0, False), (4, False), (6, True)}
    assert sum(1 for r in rows if r.get("final")) == len(ARGS["test_dataset"])


@pytest.mark.parametrize("torn", [False, True], ids=["before-a-write", "half-way-through-a-write"])
def test_killed_at_any_write_and_resumed_loses_and_doubles_nothing(reference, tmp_path, torn):
    reference_dir, writes = reference
    expected = what_happened(reference_dir)
    points = [k for k, write in enumerate(writes, start=1) if not torn or write.startswith("append_jsonl")]
    assert len(points) > (12 if torn else 40)
    for kill_at in points:
        run_dir = tmp_path / f"kill-{kill_at}"
        killed_run(run_dir, kill_at, torn)
        result = train(run_dir, resume=True)
        where = f"killed at write {kill_at} ({writes[kill_at - 1]})"
        assert result.stopped_reason is None, where
        assert what_happened(run_dir) == expected, where
        finished = contents(run_dir)
        train(run_dir, resume=True)  # and once more: a finished run stays as it is
        assert contents(run_dir) == finished, where


@contextmanager
def write_fails(at: int, fraction: float, lasting: bool = False) -> Iterator[list[int]]:
    """The `at`-th write of a run file (append or whole-file) writes `fraction` of its bytes
    and then fails as a full disk does (at 1.0: all bytes, then fsync fails with EIO); the
    writes before it succeed, and those after it too unless the failure is `lasting`."""
    import errno

    import opto._util.files

    original = opto._util.files._write
    count = [0]

    def write(fd: int, data: bytes) -> None:
        count[0] += 1
        if count[0] < at or (count[0] > at and not lasting):
            return original(fd, data)
        os.write(fd, data[: int(len(data) * fraction)])
        if fraction >= 1.0:
            raise OSError(errno.EIO, "Input/output error")
        raise OSError(errno.ENOSPC, "No space left on device")

    opto._util.files._write = write
    try:
        yield count
    finally:
        opto._util.files._write = original


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0], ids=["at-its-first-byte", "half-way", "at-fsync"])
def test_a_failed_write_at_any_point_leaves_the_step_owed_and_resume_equals_an_uninterrupted_run(
        reference, tmp_path, fraction):
    expected = what_happened(reference[0])
    with write_fails(at=0, fraction=0.0) as counted:
        train(tmp_path / "count")
    total = counted[0]
    assert total > 40
    for at in range(1, total + 1):
        run_dir = tmp_path / f"fail-{at}"
        with write_fails(at, fraction), pytest.raises(opto.RunDirWriteError) as failed:
            train(run_dir)
        assert run_dir.name in str(failed.value) and "resume=True" in str(failed.value)
        result = train(run_dir, resume=True)
        where = f"write {at} of {total} failed ({fraction:.0%} written)"
        assert result.stopped_reason is None, where
        assert what_happened(run_dir) == expected, where


def test_a_disk_that_stays_full_stops_the_run_and_resume_after_it_is_freed_equals_an_uninterrupted_run(
        reference, tmp_path):
    expected = what_happened(reference[0])
    for at in range(1, 66, 4):
        run_dir = tmp_path / f"full-{at}"
        with write_fails(at, 0.5, lasting=True), pytest.raises(opto.RunDirWriteError):
            train(run_dir)
        if (run_dir / "checkpoint.json").exists():
            saved = json.loads((run_dir / "checkpoint.json").read_text())
            covered = [r for r in RunDir(run_dir).ledger() if r["step"] <= saved["step"]]
            # Only an unfinished final check's rollouts may be beyond the count (resume drops them).
            surplus = covered[saved["ledger_records"]:]
            assert not surplus or (saved["final_check"] is None
                                   and {r.get("phase") for r in surplus} == {"final_check"}), at
        result = train(run_dir, resume=True)
        assert result.stopped_reason is None, at
        assert what_happened(run_dir) == expected, f"the disk filled at write {at}"


@pytest.fixture(scope="module")
def held_out_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    run_dir = tmp_path_factory.mktemp("held-out")
    with writes_counted() as writes:
        result = train_held_out(run_dir)
    config = json.loads((run_dir / "checkpoint.json").read_text())["config"]
    assert len(config["validation_ids"]) == 16 and result.steps == 4 and result.accepted > 0
    return run_dir, list(writes)


@pytest.mark.parametrize("torn", [False, True], ids=["before-a-write", "half-way-through-a-write"])
def test_a_run_on_a_held_out_split_killed_at_any_write_resumes_to_the_same_files(held_out_reference, tmp_path,
                                                                                 torn):
    reference_dir, writes = held_out_reference
    expected = what_happened(reference_dir)
    points = [k for k, write in enumerate(writes, start=1) if not torn or write.startswith("append_jsonl")]
    for kill_at in points:
        run_dir = tmp_path / f"kill-{kill_at}"
        killed_run(run_dir, kill_at, torn, run=train_held_out)
        result = train_held_out(run_dir, resume=True)
        where = f"killed at write {kill_at} ({writes[kill_at - 1]})"
        assert result.stopped_reason is None, where
        assert what_happened(run_dir) == expected, where
