"""Preference data from training runs: turns -> pairs -> JSONL for a fine-tuning backend.

Every training run's ledger records what was proposed, how it scored and what was
accepted. This package reads it back as *turns* (one prompt, several scored responses;
see `opto.preference.turns` for the three sources: optimizer, aggregator, agent), makes
preference pairs with `PreferencePairBuilder`, and writes them in the format a backend
takes (`get_writer`): OpenAI DPO or supervised, TRL standard or conversational, NeMo
Customizer. For RL, `read_groups` reads the rollouts as trajectory groups with rewards
(OpenPipe ART's shape, the "art" format; see `opto.preference.trajectories`). `export_run` does all of it; `opto export` is its command line::

    from opto.preference import export_run
    report = export_run("runs/demo", "pairs.jsonl", source="all", format="openai-dpo")
"""

from .export import ExportReport, export_run, validation_path
from .pairs import BuilderStats, PreferencePair, PreferencePairBuilder, SupervisedExample
from .schemas import FORMATS, DatasetFormatError, validate_jsonl, validate_record
from .split import train_validation_split
from .trajectories import GroupReading, GroupStats, Trajectory, TrajectoryGroup, episode_problem, read_groups
from .turns import SOURCES, Turn, TurnCandidate, TurnReading, read_turns
from .writers import (
    ARTWriter,
    NeMoWriter,
    OpenAIDPOWriter,
    OpenAISFTWriter,
    TRLChatWriter,
    TRLWriter,
    Writer,
    get_writer,
)

__all__ = [
    "ARTWriter",
    "FORMATS",
    "GroupReading",
    "GroupStats",
    "Trajectory",
    "TrajectoryGroup",
    "episode_problem",
    "read_groups",
    "SOURCES",
    "BuilderStats",
    "DatasetFormatError",
    "ExportReport",
    "NeMoWriter",
    "OpenAIDPOWriter",
    "OpenAISFTWriter",
    "PreferencePair",
    "PreferencePairBuilder",
    "SupervisedExample",
    "TRLChatWriter",
    "TRLWriter",
    "Turn",
    "TurnCandidate",
    "TurnReading",
    "Writer",
    "export_run",
    "get_writer",
    "read_turns",
    "train_validation_split",
    "validate_jsonl",
    "validate_record",
    "validation_path",
]
