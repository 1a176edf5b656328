"""The model layer: one async `Model` protocol and its backends.

- `OpenAIModel`: OpenAI or any OpenAI-compatible server (vLLM, Ollama, llama.cpp).
- `LocalModel`: a GGUF model in-process through llama-cpp-python (SmolLM2 by default).
- `LiteLLMModel`: any provider LiteLLM reaches (extra ``litellm``).
- `TransformersModel`: any Hugging Face causal LM in-process, a LoRA adapter on its base
  too, with concurrent calls batched (extra ``trl``).
- `ScriptedModel`: replies from a script, for tests and examples.
- `instrument(client)` / `instrument_litellm()`: an OpenAI SDK client or LiteLLM that an
  agent calls directly, traced like a `Model`.
- `tool_result(call, result)`: records a tool's result in the trace and makes its message.
- `trace_otel()`: OpenTelemetry LLM spans (any framework's instrumentor) as rollout calls
  (extra ``otel``).
"""

from .base import Model
from .cache import ResponseCache
from .errors import (
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
from .instrument import Instrumented, instrument, instrument_litellm, uninstrument, uninstrument_litellm
from .litellm_model import LiteLLMModel
from .local import LocalModel
from .openai_model import OpenAIModel
from .otel import OtelTracing, trace_otel
from .sampling import sampling
from .scripted import ScriptedModel
from .tracing import record_llm_calls, tool_result
from .transformers_model import TransformersModel
from .types import Completion, Message, TokenUsage, ToolCall
from .usage import Budget, Price, UsageStats

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "ConnectionFailedError",
    "ContextWindowExceededError",
    "EndpointNotFoundError",
    "LLMTimeoutError",
    "ModelNotFoundError",
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "UnsupportedRequestError",
    "Budget",
    "BudgetExceeded",
    "Completion",
    "Instrumented",
    "LLMError",
    "LLMRequestError",
    "LLMUnavailableError",
    "LiteLLMModel",
    "LocalModel",
    "Message",
    "Model",
    "OpenAIModel",
    "OtelTracing",
    "Price",
    "ResponseCache",
    "ScriptedModel",
    "sampling",
    "TokenUsage",
    "ToolCall",
    "TransformersModel",
    "UsageStats",
    "instrument",
    "instrument_litellm",
    "record_llm_calls",
    "tool_result",
    "trace_otel",
    "uninstrument",
    "uninstrument_litellm",
]
