"""`LiteLLMModel`: any provider LiteLLM reaches (Anthropic, Gemini, Bedrock, Ollama, ...).

Needs the ``litellm`` extra (``pip install 'opto-agents[litellm]'``). Requests go through
`litellm.acompletion` with LiteLLM's own retries off: opto's concurrency cap, rate
limits, retries and 429 patience apply, exactly as for `OpenAIModel`, because LiteLLM
raises subclasses of the OpenAI SDK's error classes for every provider (a status it has no
class for is given one here).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx2 as httpx  # the OpenAI SDK's HTTP client, installed with it
import openai

from .._util.redaction import remember_secret
from ..errors import OptoValueError
from .errors import LLMError
from .remote import RemoteChatModel

__all__ = ["LiteLLMModel", "import_litellm"]

_INSTALL = "LiteLLMModel needs LiteLLM: pip install 'opto-agents[litellm]'"

# LiteLLM fetches its price map from GitHub when imported, retrying for seconds without a
# network; the copy in the installed package is used instead (unless the user chose).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def import_litellm() -> Any:
    """The litellm module, with its debugging banners off."""
    try:
        import litellm
    except ImportError as exc:
        raise LLMError(_INSTALL) from exc
    litellm.suppress_debug_info = True
    return litellm


def _as_status_error(exc: openai.APIError) -> openai.APIError:
    """LiteLLM reports a status it has no class for (403, say) as a bare `APIError`, which
    is not an `openai.APIStatusError`: give it one, so it is sorted by its status like the rest."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return exc
    headers = getattr(getattr(exc, "response", None), "headers", None)
    response = httpx.Response(status, headers=headers, request=httpx.Request("POST", "http://litellm.invalid"))
    return openai.APIStatusError(exc.message, response=response, body=getattr(exc, "body", None))


class _LiteLLMPoster:
    """Posts one request through `litellm.acompletion` and returns the reply as a dict."""

    def __init__(self, litellm: Any, options: dict[str, Any], timeout: float) -> None:
        self._litellm = litellm
        self._options = options
        self._timeout = timeout

    async def post(self, body: dict[str, Any]) -> Any:
        try:
            response = await self._litellm.acompletion(
                **body, **self._options, timeout=self._timeout, num_retries=0, max_retries=0
            )
        except (openai.APIStatusError, openai.APIConnectionError):  # timeouts are connection errors
            raise
        except openai.APIError as exc:
            raise _as_status_error(exc) from exc
        return response.model_dump()

    async def close(self) -> None:
        """Stop LiteLLM's logging worker if it runs on this (the model's private) loop, which
        is about to stop: a task left pending there is reported as destroyed at exit.
        LiteLLM's HTTP clients are its own, shared, and stay open."""
        try:
            from litellm.litellm_core_utils.logging_worker import GLOBAL_LOGGING_WORKER as worker
        except ImportError:  # another LiteLLM version: nothing known to stop
            return
        if getattr(worker, "_bound_loop", None) is asyncio.get_running_loop():
            await worker.stop(timeout=1.0)


class LiteLLMModel(RemoteChatModel):
    """A chat model reached through LiteLLM.

    Args:
        model: LiteLLM's model name, e.g. "anthropic/claude-3-5-haiku-latest",
            "gemini/gemini-2.0-flash", "ollama/llama3.2" or "openai/gpt-4o-mini".
        max_concurrency: requests in flight at once.
        requests_per_minute: a client-side request rate limit (None: none).
        tokens_per_minute: a client-side token rate limit (None: none).
        timeout: seconds one request may take.
        max_retries: retries of a failed request (429s within `rate_limit_patience` are not counted).
        rate_limit_patience: seconds to keep waiting out 429s before they count as failures.
        cache: a `ResponseCache` (None: no caching).
        budget: a `Budget` every call is checked against before it is sent.
        prices: {model name: {"input": usd_per_1m_tokens, "output": usd_per_1m_tokens}}, over
            the maintained price table's (see `Model`).
        **litellm_kwargs: passed to every `litellm.acompletion` call, e.g.
            `api_base=...`, `api_key=...` (never logged: it is redacted from errors and
            files), `custom_llm_provider=...`, or provider settings.

    Keys come from the providers' usual environment variables unless `api_key` is given.
    Prices come from `prices=`, then opto's table of well-known models
    (`opto.llm.prices`), matched on the name without its provider prefix.
    """

    _thread_label = "litellm"
    # LiteLLM keeps its own HTTP clients, shared by the process and bound to the loop that
    # made them: its requests stay on the model's private loop, whatever loop calls.
    _requests_on_caller_loop = False

    def __init__(
        self,
        model: str,
        *,
        max_concurrency: int = 16,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        rate_limit_patience: float = 300.0,
        cache: Any = None,
        budget: Any = None,
        prices: Any = None,
        **litellm_kwargs: Any,
    ) -> None:
        reserved = {"model", "messages", "num_retries", "max_retries", "timeout"} & set(litellm_kwargs)
        if reserved:
            raise OptoValueError(
                f"LiteLLMModel sets {sorted(reserved)} itself; pass timeout= and max_retries= as LiteLLMModel arguments"
            )
        self._litellm = import_litellm()
        remember_secret(litellm_kwargs.get("api_key"))
        self._options = litellm_kwargs
        super().__init__(
            model,
            max_concurrency=max_concurrency,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            timeout=timeout,
            max_retries=max_retries,
            rate_limit_patience=rate_limit_patience,
            cache=cache,
            budget=budget,
            prices=prices,
        )

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        base = self._options.get("api_base") or self._options.get("base_url")
        return f"LiteLLMModel({self.name!r}" + (f", api_base={base!r})" if base else ")")

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # A key never travels: LiteLLM reads the provider's variable in the other process.
        state["_options"] = {k: v for k, v in self._options.items() if k != "api_key"}
        state.pop("_litellm", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._litellm = import_litellm()

    def _keep_secrets_of(self, other: RemoteChatModel) -> None:
        self._options = dict(other._options)  # type: ignore[attr-defined]

    def _new_poster(self) -> _LiteLLMPoster:
        return _LiteLLMPoster(self._litellm, self._options, self.timeout)
