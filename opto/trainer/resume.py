"""Opening a run directory to start or resume a run: every file checked before any is changed.

A damaged file (truncated, the wrong shape, a step out of range, a ledger shorter than
its checkpoint says) is refused with a `RunDirError` naming the file and the field; the
folder is then left exactly as it was. Only once everything checks out are the lines a
resumed run writes again discarded, and stale temp files of a killed process removed.
"""

from __future__ import annotations

import logging
import numbers
from pathlib import Path
from typing import Any

from .._util.files import read_jsonl
from ..core.agent import Agent
from ..core.data import DataLoader
from ..errors import RunDirError
from ..run.ledger import Checkpoint, RunDir, damaged, read_json_object
from ..run.switches import apply_switches, recorded_switches

__all__ = ["RESUME_KEYS", "open_run"]

logger = logging.getLogger(__name__)

# Settings a resumed run must share with the run it continues.
RESUME_KEYS = ("batch_size", "seed", "shuffle", "num_examples")


def open_run(
    run: RunDir,
    agent: Agent,
    loader: DataLoader,
    config: dict[str, Any],
    resume: bool,
    extra_keys: tuple[str, ...] = (),
) -> Checkpoint:
    """The state to start from: a new checkpoint, or the saved one with the agent's values
    and the loader's position restored and the unsaved lines discarded. `extra_keys`:
    more settings of `config` the resumed run must share (a trainer's own)."""
    saved = run.load_checkpoint()
    if saved is None:
        if run.holds_a_run():
            found = ", ".join(p.name for p in run.files if p.exists() and p.stat().st_size > 0)
            raise RunDirError(
                f"{run.path} holds the files of a run ({found}) but no checkpoint.json, so it can be neither "
                "resumed nor overwritten safely. Nothing was changed: restore checkpoint.json from a backup, "
                "or choose another run_dir"
            )
        if resume:
            logger.info("nothing to resume in %s; starting a new run", run.path)
        run.reset()
        run.remove_stale_temp_files()
        return Checkpoint(config=config)
    if not resume:
        raise RunDirError(
            f"{run.path} already holds a run (step {saved.step}); pass resume=True to continue it, "
            "or choose another run_dir"
        )
    for key in RESUME_KEYS:
        if key not in saved.config:
            raise damaged(run.checkpoint_path, f"config: it has no {key}")
    for key in (*RESUME_KEYS, *extra_keys):
        if saved.config.get(key) != config.get(key):
            raise RunDirError(
                f"cannot resume {run.path}: it was started with {key}={_short(saved.config.get(key))}, "
                f"this call has {key}={_short(config.get(key))}"
            )
    _check_values(agent, saved.parameters, run.checkpoint_path, "parameters")
    try:
        if saved.loader_state:
            loader.load_state_dict(saved.loader_state)
    except ValueError as exc:
        raise damaged(run.checkpoint_path, f"loader_state: {exc}") from None
    _check_run_files(run, saved, agent)
    switches = recorded_switches(run.path, agent)  # read and checked before anything changes

    # Everything checks out: from here on the folder may change.
    apply_switches(agent, switches)
    run.remove_stale_temp_files()
    agent.apply(saved.parameters)
    if saved.finished and not saved.final_evaluations and saved.test_scores:
        saved.final_evaluations = [saved.step]  # a checkpoint written before the field existed
    run.discard_unsaved(saved)
    saved.finished = False
    saved.config = config
    logger.info("resuming %s after step %d", run.path, saved.step)
    return saved


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _check_run_files(run: RunDir, saved: Checkpoint, agent: Agent) -> None:
    """The ledger, metrics, evaluations, agent.json and best.json against the checkpoint."""
    ledger = _records(run.ledger_path)
    for number, record in enumerate(ledger, start=1):
        _step_of(record, run.ledger_path, number, None)
    covered = sum(1 for record in ledger if record["step"] <= saved.step)
    if saved.ledger_records is not None and covered != saved.ledger_records and not _check_cut_short(ledger, saved):
        raise damaged(
            run.ledger_path,
            f"it holds {covered} records of steps up to {saved.step}, and "
            f"checkpoint.json counts {saved.ledger_records} (ledger_records)",
        )
    for path in (run.metrics_path, run.eval_path):
        for number, record in enumerate(_records(path), start=1):
            _step_of(record, path, number, saved.step)
    if run.agent_path.exists():
        values = read_json_object(run.agent_path)
        missing = sorted(set(saved.parameters) - set(values))
        if missing:
            raise damaged(run.agent_path, f"it has no value for {', '.join(missing)}")
        _check_values(agent, values, run.agent_path, "")
    if run.best_path.exists():
        best = read_json_object(run.best_path)
        step = best.get("step")
        latest = saved.step + 1  # written just before the checkpoint, it may be a step ahead of it
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= latest:
            raise damaged(run.best_path, f"step: {step!r} is not a step within 0..{latest}")
        if not isinstance(best.get("score"), numbers.Real) or isinstance(best.get("score"), bool):
            raise damaged(run.best_path, f"score: {best.get('score')!r} is not a number")
        if not isinstance(best.get("parameters"), dict):
            raise damaged(run.best_path, "parameters: not an object of parameter values")
        _check_values(agent, best["parameters"], run.best_path, "parameters")


def _check_cut_short(ledger: list[dict[str, Any]], saved: Checkpoint) -> bool:
    """Whether the records the checkpoint does not count are the final check's rollouts,
    written before a stop that came ahead of the checkpoint: resume drops them
    (`RunDir.discard_unsaved`) and checks again."""
    covered = [record for record in ledger if record["step"] <= saved.step]
    surplus = len(covered) - (saved.ledger_records or 0)
    return (
        surplus > 0
        and saved.final_check is None
        and all(r.get("type") == "rollout" and r.get("phase") == "final_check" for r in covered[-surplus:])
    )


def _records(path: Path) -> list[Any]:
    try:
        return read_jsonl(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise damaged(path, str(exc).replace(f"{path}:", "line ")) from None


def _step_of(record: Any, path: Path, number: int, most: int | None) -> int:
    if not isinstance(record, dict):
        raise damaged(path, f"line {number} is a JSON {type(record).__name__}, not a record")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise damaged(path, f"line {number}: step {step!r} is not a whole number >= 0")
    if most is not None and step > most:
        raise damaged(path, f"line {number}: step {step} is beyond the checkpoint's step {most}")
    return step


def _check_values(agent: Agent, values: Any, path: Path, field: str) -> None:
    """Every value valid for the agent's parameter of that name."""
    named = agent.named_parameters()
    prefix = f"{field}." if field else ""
    for name, value in values.items():
        if name not in named:
            raise damaged(
                path, f"{prefix}{name}: {type(agent).__name__} has no such parameter (it has {sorted(named)})"
            )
        try:
            named[name].validate(value)
        except (ValueError, TypeError) as exc:
            raise damaged(path, f"{prefix}{name}: {str(exc).removeprefix(f'{name}: ')}") from None
