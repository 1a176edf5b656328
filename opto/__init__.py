"""opto: optimize the text parameters of LLM agents from feedback.

A trainer runs the agent on a minibatch, an LLM optimizer proposes an update per
instance, an LLM aggregator merges them into one candidate, the candidate is validated
and accepted or rolled back, and every decision is written to a ledger.

The names here are grouped as on the docs site's API reference: core (agents and
parameters), training, search, models, data and guides, errors. Subpackages hold the
rest: `opto.llm` (every model backend and tracing helper), `opto.search`, `opto.finetune`,
`opto.executors` (Ray), `opto.datasets`, `opto.testing` (offline fakes).
"""

from ._version import __version__ as __version__

# Core: agents and their parameters.
from .core.agent import Agent, agent
from .core.parameters import Constraint, Demos, Parameter, ParameterError, assign
from .core.prompting import PromptTemplate

# Training: the trainers, evaluation, collection, run directories and callbacks.
from .core.rollout import Rollout
from .executors.local import AsyncioExecutor, RolloutExecutor
from .report.tracking import MLflowCallback
from .run.callbacks import Callback
from .run.events import LEDGER_VERSION, LedgerEvent, StepRecord
from .run.ledger import RunDir
from .run.results import EvalResult, FinalCheckResult, TrainResult
from .trainer.aggregated import AggregatedUpdate
from .trainer.collection import CollectResult, acollect, collect
from .trainer.estimate import Estimate, RoleEstimate, RunNotConfirmed
from .trainer.evaluation import aevaluate, evaluate
from .trainer.failures import TooManyFailures
from .trainer.minibatch import Minibatch

# Search: proposers, the aggregator, candidate selection, validation, stopping, and the
# registry that turns their names into objects.
from .search.aggregation import Aggregator, Candidate, construct_update_dict, extract_llm_suggestion
from .search.final_check import FinalCheck
from .search.holdout import HoldOut
from .search.proposers import BatchProposer, DemoProposer, Optimizer, Proposal, Proposer
from .search.registry import register
from .search.selection import EpsilonGreedy, Greedy, Pareto, TopK
from .search.stopping import (
    AllOf,
    AnyOf,
    MaxCalls,
    MaxCost,
    MaxMetricCalls,
    MaxTime,
    NoImprovement,
    StopCondition,
    StopFile,
    TargetScore,
)
from .search.tpe import TPEProposer
from .search.validation import DatasetValidation, MinibatchFirst, MinibatchValidation, NoValidation, Validation

# Models: the backends most runs use (the rest are in opto.llm).
from .llm import (
    Budget,
    Completion,
    LiteLLMModel,
    LocalModel,
    Model,
    OpenAIModel,
    ResponseCache,
    ScriptedModel,
    TransformersModel,
)

# Data and guides.
from .core.data import DataLoader, DatasetError, Example, load_dataset
from .core.feedback_guide import FeedbackGuide
from .core.logged import LoggedRollout
from .core.guides import ExactMatchGuide, Feedback, Guide, LLMJudgeGuide

# Errors: the root, the argument errors, and the model layer's tree.
from .errors import (
    MissingDependencyError,
    MissingFileError,
    OptoError,
    OptoKeyError,
    OptoTypeError,
    OptoValueError,
    RunDirError,
    RunDirWriteError,
    UsageError,
)
from .llm.errors import (
    AuthenticationError,
    BadRequestError,
    BudgetExceeded,
    ConnectionFailedError,
    ContextWindowExceededError,
    EndpointNotFoundError,
    LLMError,
    LLMRequestError,
    LLMTimeoutError,
    LLMUnavailableError,
    ModelNotFoundError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
    UnsupportedRequestError,
)

__all__ = [
    # Core
    "Agent",
    "Constraint",
    "Demos",
    "Parameter",
    "PromptTemplate",
    "agent",
    "assign",
    # Training
    "AggregatedUpdate",
    "Estimate",
    "RoleEstimate",
    "AsyncioExecutor",
    "Callback",
    "CollectResult",
    "EvalResult",
    "LEDGER_VERSION",
    "LedgerEvent",
    "MLflowCallback",
    "Minibatch",
    "Rollout",
    "RolloutExecutor",
    "RunDir",
    "StepRecord",
    "TrainResult",
    "FinalCheckResult",
    "acollect",
    "aevaluate",
    "collect",
    "evaluate",
    # Search
    "Aggregator",
    "AllOf",
    "AnyOf",
    "BatchProposer",
    "Candidate",
    "DatasetValidation",
    "DemoProposer",
    "EpsilonGreedy",
    "Greedy",
    "FinalCheck",
    "HoldOut",
    "MaxCalls",
    "MaxCost",
    "MaxMetricCalls",
    "MaxTime",
    "MinibatchFirst",
    "MinibatchValidation",
    "NoImprovement",
    "NoValidation",
    "Optimizer",
    "Pareto",
    "Proposal",
    "Proposer",
    "StopCondition",
    "StopFile",
    "TPEProposer",
    "TargetScore",
    "TopK",
    "Validation",
    "construct_update_dict",
    "extract_llm_suggestion",
    "register",
    # Models
    "Budget",
    "Completion",
    "LiteLLMModel",
    "LocalModel",
    "Model",
    "OpenAIModel",
    "ResponseCache",
    "ScriptedModel",
    "TransformersModel",
    # Data and guides
    "DataLoader",
    "Example",
    "ExactMatchGuide",
    "Feedback",
    "FeedbackGuide",
    "Guide",
    "LLMJudgeGuide",
    "LoggedRollout",
    "load_dataset",
    # Errors
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceeded",
    "ConnectionFailedError",
    "ContextWindowExceededError",
    "DatasetError",
    "EndpointNotFoundError",
    "LLMError",
    "LLMRequestError",
    "LLMTimeoutError",
    "LLMUnavailableError",
    "MissingDependencyError",
    "MissingFileError",
    "ModelNotFoundError",
    "OptoError",
    "OptoKeyError",
    "OptoTypeError",
    "OptoValueError",
    "ParameterError",
    "QuotaExceededError",
    "RateLimitError",
    "RunDirError",
    "RunDirWriteError",
    "ServerError",
    "RunNotConfirmed",
    "TooManyFailures",
    "UnsupportedRequestError",
    "UsageError",
]
