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
from .agent import Agent, agent
from .parameters import Constraint, Demos, Parameter, ParameterError, assign
from .prompting import PromptTemplate

# Training: the trainers, evaluation, collection, run directories and callbacks.
from .callbacks import Callback
from .collect import CollectResult, acollect, collect
from .events import LEDGER_VERSION, LedgerEvent, StepRecord
from .ledger import RunDir
from .rollout import AsyncioExecutor, Rollout, RolloutExecutor
from .tracking import MLflowCallback
from .trainer import (
    AggregatedUpdate,
    EvalResult,
    Minibatch,
    TooManyFailures,
    TrainResult,
    aevaluate,
    evaluate,
)

# Search: proposers, the aggregator, candidate selection, validation and stopping.
from .aggregation import Aggregator, Candidate, construct_update_dict, extract_llm_suggestion
from .optimizers import BatchProposer, DemoProposer, Optimizer, Proposal, Proposer
from .search import (
    DatasetValidation,
    EpsilonGreedy,
    Greedy,
    HoldOut,
    MinibatchFirst,
    MinibatchValidation,
    NoValidation,
    Pareto,
    TopK,
    TPEProposer,
    Validation,
)
from .search.stopping import (
    AllOf,
    AnyOf,
    MaxCalls,
    MaxCost,
    MaxTime,
    NoImprovement,
    StopCondition,
    StopFile,
    TargetScore,
)

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
from .data import DataLoader, DatasetError, Example, load_dataset
from .guides import ExactMatchGuide, Feedback, Guide, LLMJudgeGuide

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
    "HoldOut",
    "MaxCalls",
    "MaxCost",
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
    "Guide",
    "LLMJudgeGuide",
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
    "TooManyFailures",
    "UnsupportedRequestError",
    "UsageError",
]
