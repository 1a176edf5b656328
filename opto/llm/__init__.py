"""The model layer: one async `Model` protocol and its backends.

- `OpenAIModel`: OpenAI or any OpenAI-compatible server (vLLM, Ollama, llama.cpp).
- `LocalModel`: a GGUF model in-process through llama-cpp-python (SmolLM2 by default).
- `ScriptedModel`: replies from a script, for tests and examples.
- `instrument(client)`: an OpenAI SDK client an agent calls directly, traced like a `Model`.
"""

from .base import Model
from .cache import ResponseCache
from .errors import BudgetExceeded, LLMError, LLMRequestError, LLMUnavailableError
from .instrument import Instrumented, instrument, uninstrument
from .local import LocalModel
from .openai_model import OpenAIModel
from .scripted import ScriptedModel
from .tracing import record_llm_calls
from .types import Completion, Message, TokenUsage
from .usage import Budget, Price, UsageStats

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Completion",
    "Instrumented",
    "LLMError",
    "LLMRequestError",
    "LLMUnavailableError",
    "LocalModel",
    "Message",
    "Model",
    "OpenAIModel",
    "Price",
    "ResponseCache",
    "ScriptedModel",
    "TokenUsage",
    "UsageStats",
    "instrument",
    "record_llm_calls",
    "uninstrument",
]
