"""opto: optimize the text parameters of LLM agents from feedback.

A trainer runs the agent on a minibatch, an LLM optimizer proposes an update per
instance, an LLM aggregator merges them into one candidate, the candidate is validated
and accepted or rolled back, and every decision is written to a ledger.
"""

from .agent import Agent, agent
from .callbacks import Callback
from .aggregation import Aggregator, Candidate, construct_update_dict, extract_llm_suggestion
from .collect import CollectResult, acollect, collect
from .data import DataLoader, DatasetError, Example, load_dataset
from ._version import __version__
from .errors import OptoError, RunDirError, RunDirWriteError
from .events import LEDGER_VERSION, LedgerEvent, StepRecord
from .guides import ExactMatchGuide, Feedback, Guide, LLMJudgeGuide
from .ledger import RunDir
from .llm import (
    Budget,
    BudgetExceeded,
    Completion,
    LLMError,
    LocalModel,
    Model,
    OpenAIModel,
    ResponseCache,
    ScriptedModel,
)
from .optimizers import BatchProposer, DemoProposer, Optimizer, Proposal, Proposer
from .parameters import Constraint, Demos, Parameter, ParameterError, assign
from .prompting import PromptTemplate
from .rollout import AsyncioExecutor, Rollout, RolloutExecutor
from .search.stopping import MaxCalls, MaxCost, MaxTime, NoImprovement, StopCondition, StopFile, TargetScore
from .tracking import MLflowCallback
from .trainer import (
    AggregatedUpdate,
    EvalResult,
    Minibatch,
    MinibatchFirst,
    TooManyFailures,
    TrainResult,
    aevaluate,
    evaluate,
)


__all__ = [
    "Agent",
    "AsyncioExecutor",
    "AggregatedUpdate",
    "Aggregator",
    "BatchProposer",
    "Budget",
    "Callback",
    "BudgetExceeded",
    "Candidate",
    "CollectResult",
    "Completion",
    "Constraint",
    "DataLoader",
    "DatasetError",
    "DemoProposer",
    "Demos",
    "EvalResult",
    "ExactMatchGuide",
    "Example",
    "Feedback",
    "Guide",
    "LLMError",
    "LEDGER_VERSION",
    "LLMJudgeGuide",
    "LedgerEvent",
    "LocalModel",
    "MLflowCallback",
    "MaxCalls",
    "MaxCost",
    "MaxTime",
    "NoImprovement",
    "Minibatch",
    "MinibatchFirst",
    "Model",
    "OpenAIModel",
    "OptoError",
    "RunDirError",
    "RunDirWriteError",
    "Optimizer",
    "Parameter",
    "ParameterError",
    "PromptTemplate",
    "Proposal",
    "Proposer",
    "ResponseCache",
    "Rollout",
    "RolloutExecutor",
    "RunDir",
    "ScriptedModel",
    "StepRecord",
    "StopCondition",
    "StopFile",
    "TargetScore",
    "TooManyFailures",
    "TrainResult",
    "acollect",
    "aevaluate",
    "agent",
    "assign",
    "collect",
    "construct_update_dict",
    "evaluate",
    "extract_llm_suggestion",
    "load_dataset",
]
