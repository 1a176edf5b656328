"""The shared machinery of every model: cache, budget, usage, tracing, ScriptedModel."""

import asyncio

import pytest

from opto.core.data import Example
from opto.llm import (
    Budget,
    BudgetExceeded,
    Completion,
    LLMError,
    ResponseCache,
    ScriptedModel,
    record_llm_calls,
)
from opto.llm.retry import backoff_delay, retry_after_seconds

MSG = [{"role": "user", "content": "hello there"}]


async def test_scripted_model_replies_in_order_and_records_requests():
    model = ScriptedModel(["one", "two"])
    first = await model.complete(MSG, temperature=0.3)
    second = await model.complete(MSG)
    assert (first.text, second.text) == ("one", "two")
    assert model.requests[0]["temperature"] == 0.3
    assert model.requests[1]["messages"] == MSG
    with pytest.raises(LLMError, match="ran out of replies"):
        await model.complete(MSG)


async def test_scripted_model_callable_is_called_once_per_sample():
    seen = []

    def reply(messages):
        seen.append(messages[-1]["content"])
        return f"reply {len(seen)}"

    completion = await ScriptedModel(reply).complete(MSG, n=3)
    assert completion.texts == ["reply 1", "reply 2", "reply 3"]
    assert len(seen) == 3


async def test_scripted_exception_and_truncation_items():
    model = ScriptedModel([RuntimeError("boom"), Completion(texts=['{"a": '], finish_reason="length")])
    with pytest.raises(RuntimeError, match="boom"):
        await model.complete(MSG)
    cut = await model.complete(MSG)
    assert cut.truncated and cut.text == '{"a": '


async def test_bad_messages_are_rejected_before_any_call():
    model = ScriptedModel(["never"])
    for bad in ([], [{"content": "no role"}], [{"role": "wizard", "content": "x"}], "just text"):
        with pytest.raises(ValueError):
            await model.complete(bad)
    with pytest.raises(ValueError, match="n must be"):
        await model.complete(MSG, n=0)
    assert model.requests == []


async def test_usage_counts_calls_tokens_and_cost():
    model = ScriptedModel(["x" * 400], prices={"scripted": {"input": 1.0, "output": 2.0}})
    await model.complete([{"role": "user", "content": "y" * 800}])
    usage = model.usage
    assert usage.calls == 1 and usage.cached_calls == 0
    assert usage.prompt_tokens == 200 and usage.completion_tokens == 100
    assert usage.cost_usd == pytest.approx((200 * 1.0 + 100 * 2.0) / 1e6)


async def test_cache_hit_costs_nothing_and_keeps_samples_apart(tmp_path):
    cache = ResponseCache(tmp_path / "cache.sqlite")
    model = ScriptedModel(["a", "b", "c", "d"], cache=cache)
    first = await model.complete(MSG, n=2, temperature=1.0)
    again = await model.complete(MSG, n=2, temperature=1.0)
    assert first.texts == ["a", "b"] and not first.cached
    assert again.texts == ["a", "b"] and again.cached
    assert model.usage.calls == 1 and model.usage.cached_calls == 1
    # Each sample has its own entry (the sample index is in the key).
    assert len(cache) == 2
    # Any change in the request is a miss: here the temperature.
    other = await model.complete(MSG, n=1, temperature=0.0)
    assert other.texts == ["c"] and not other.cached


async def test_cache_survives_a_new_process_worth_of_objects(tmp_path):
    path = tmp_path / "cache.sqlite"
    await ScriptedModel(["paid for"], cache=ResponseCache(path)).complete(MSG)
    replay = ScriptedModel([], cache=ResponseCache(path))
    assert (await replay.complete(MSG)).text == "paid for"
    assert replay.usage.calls == 0


async def test_budget_refuses_before_the_call_and_is_shared():
    budget = Budget(max_calls=2)
    a = ScriptedModel(["1", "2", "3"], budget=budget)
    b = ScriptedModel(["x"], name="other", budget=budget)
    await a.complete(MSG)
    await b.complete(MSG)
    with pytest.raises(BudgetExceeded, match="2 calls"):
        await a.complete(MSG)
    assert a.remaining == 2  # the refused call never reached the backend


async def test_budget_holds_under_concurrency():
    budget = Budget(max_calls=5)

    async def slow(messages):
        await asyncio.sleep(0.01)
        return "ok"

    model = ScriptedModel(slow, budget=budget)
    results = await asyncio.gather(*(model.complete(MSG) for _ in range(12)), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 5
    assert sum(isinstance(r, BudgetExceeded) for r in results) == 7


async def test_budget_tokens_and_failed_calls_are_not_charged():
    budget = Budget(max_tokens=50)
    model = ScriptedModel([RuntimeError("down"), "fine"], budget=budget)
    with pytest.raises(RuntimeError):
        await model.complete(MSG)
    assert budget.calls == 0 and budget.tokens == 0
    await model.complete(MSG)
    assert budget.tokens > 0
    with pytest.raises(BudgetExceeded, match="tokens"):
        await model.complete([{"role": "user", "content": "z" * 400}])


def test_budget_rejects_negative_limits():
    with pytest.raises(ValueError, match="max_calls"):
        Budget(max_calls=-1)


async def test_trace_records_calls_made_inside_the_block_only():
    model = ScriptedModel(["inside", "outside"])
    with record_llm_calls() as calls:
        await model.complete(MSG)
    await model.complete(MSG)
    assert [c["response"] for c in calls] == ["inside"]
    assert calls[0]["messages"] == MSG


async def test_traces_of_concurrent_tasks_do_not_mix():
    async def echo(messages):
        await asyncio.sleep(0.01)
        return messages[-1]["content"]

    model = ScriptedModel(echo)

    async def run(tag):
        with record_llm_calls() as calls:
            for _ in range(3):
                await model.complete([{"role": "user", "content": tag}])
        return calls

    traces = await asyncio.gather(*(run(f"task{i}") for i in range(5)))
    for i, calls in enumerate(traces):
        assert [c["response"] for c in calls] == [f"task{i}"] * 3


async def test_records_nest_the_innermost_trace_and_reads_win_and_every_meter_counts():
    from opto import Agent, ExactMatchGuide, Parameter
    from opto.llm.usage import meter_usage
    from opto.core.parameters import track_reads
    from opto.core.rollout import run_rollout

    class Echo(Agent):
        def __init__(self) -> None:
            self.model = ScriptedModel(lambda messages: messages[-1]["content"])
            self.prompt = Parameter("say", name="prompt")

        async def forward(self, x):
            return (await self.model.complete([{"role": "user", "content": self.prompt.value + str(x)}])).text

    agent = Echo()
    with meter_usage() as outer_meter, record_llm_calls() as outer, track_reads() as outer_reads:
        await agent.model.complete(MSG)
        with meter_usage() as inner_meter, record_llm_calls() as inner, track_reads() as inner_reads:
            await agent.model.complete(MSG)
            agent.prompt.value  # noqa: B018  # a read
        rollout = await run_rollout(agent, ExactMatchGuide(), Example("1", "say1"))
        await agent.model.complete(MSG)
    assert [c["messages"] for c in outer] == [MSG, MSG] and [c["messages"] for c in inner] == [MSG]
    assert inner_reads == {"prompt"} and not outer_reads  # the rollout's reads are its own
    assert rollout.parameters_read == ["prompt"] and [c["response"] for c in rollout.trace] == ["say1"]
    assert outer_meter.total.calls == 4 and inner_meter.total.calls == 1  # the rollout's call counts outside too
    await agent.model.complete(MSG)  # outside every block: recorded nowhere
    assert outer_meter.total.calls == 4 and len(outer) == 2


def test_retry_after_parsing_and_backoff_growth():
    assert retry_after_seconds({"retry-after": "2"}) == 2.0
    assert retry_after_seconds({"retry-after-ms": "250"}) == 0.25
    assert retry_after_seconds({"retry-after": "nonsense"}) is None
    assert retry_after_seconds({}) is None
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    delays = [backoff_delay(a) for a in range(6)]
    assert all(0.25 <= d for d in delays) and delays[-1] > delays[0]
    assert max(backoff_delay(50) for _ in range(20)) <= 30.0


def test_a_llama_cpp_python_without_the_sampler_internals_gets_its_own_grammar_sampler() -> None:
    from types import ModuleType, SimpleNamespace

    from opto.llm.lazy_grammar import lazy_grammar_llama

    class StockLlama:
        def _init_sampler(self, top_k: int = 40, grammar: object = None, logits_processor: object = None) -> tuple:
            return ("stock chain", top_k, grammar)

    # bindings without llama_sampler_init_grammar: another release of llama-cpp-python
    module = ModuleType("another_llama")
    module.Llama, module.llama_cpp = StockLlama, ModuleType("bindings")  # type: ignore[attr-defined]
    llama = lazy_grammar_llama(module)()
    grammar = SimpleNamespace(_grammar="root ::= x", _root="root")
    assert llama._init_sampler(top_k=5, grammar=grammar) == ("stock chain", 5, grammar)  # grammar applied eagerly
    assert llama._init_sampler(top_k=5) == ("stock chain", 5, None)
    assert type(llama).__name__ == "LazyGrammarLlama" and isinstance(llama, StockLlama)
