"""Agents: parameter discovery, the @agent decorator, input spreading, save/load/apply, traces."""

import asyncio
import json

import pytest

from opto import Agent, Constraint, Example, Feedback, Guide, Parameter, ParameterError, agent
from opto.llm import ScriptedModel
from opto.core.rollout import run_rollout, run_rollouts, values_digest


class Retriever(Agent):
    def __init__(self):
        self.template = Parameter("Find: {q}", description="query template")
        self.k = Parameter(3, constraint=Constraint(min=1, max=10))


class Pipeline(Agent):
    def __init__(self):
        self.prompt = Parameter("Answer.")
        self.retriever = Retriever()
        self.examples = [Parameter("ex one"), Parameter("ex two")]
        self.knobs = {"temperature": Parameter(0.2), "style": Parameter("short", trainable=False)}
        self.not_a_param = "plain attribute"
        self._hidden = Parameter("private")

    def forward(self, x):
        return f"{self.prompt.value}|{x}"


class ExactGuide(Guide):
    def get_feedback(self, x, output, info):
        return Feedback(score=1.0 if output == info else 0.0, feedback="ok" if output == info else "wrong")


# ----------------------------------------------------------------------- discovery


def test_parameters_are_found_in_nested_agents_lists_and_dicts_with_attribute_paths():
    pipeline = Pipeline()
    names = [p.name for p in pipeline.parameters()]
    assert names == [
        "prompt",
        "retriever.template",
        "retriever.k",
        "examples.0",
        "examples.1",
        "knobs.temperature",
        "knobs.style",
    ]
    assert "_hidden" not in names and "private" not in [p.value for p in pipeline.parameters()]
    assert pipeline.named_parameters()["retriever.k"] is pipeline.retriever.k


def test_trainable_only_leaves_out_fixed_parameters():
    pipeline = Pipeline()
    names = [p.name for p in pipeline.parameters(trainable_only=True)]
    assert "knobs.style" not in names
    assert len(names) == 6


def test_explicit_names_are_kept():
    class Named(Agent):
        def __init__(self):
            self.a = Parameter("x", name="system_prompt")

    assert [p.name for p in Named().parameters()] == ["system_prompt"]


def test_a_parameter_shared_twice_is_listed_once():
    shared = Parameter("shared")

    class Twice(Agent):
        def __init__(self):
            self.first = shared
            self.again = [shared]

    assert Twice().parameters() == [shared]


def test_duplicate_names_are_an_error_naming_both_places():
    class Clash(Agent):
        def __init__(self):
            self.a = Parameter("x", name="prompt")
            self.b = Parameter("y", name="prompt")

    with pytest.raises(ValueError, match=r"two parameters are named 'prompt' \(at 'a' and 'b'\)"):
        Clash().parameters()


def test_parameter_values_resolve_and_unknown_names():
    pipeline = Pipeline()
    values = pipeline.parameter_values()
    assert values["retriever.k"] == 3 and values["knobs.style"] == "short"
    resolved = pipeline.resolve({"prompt": "new", pipeline.retriever.k: 4})
    assert resolved == {pipeline.prompt: "new", pipeline.retriever.k: 4}
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        pipeline.resolve({"nope": 1})


def test_agent_assign_resolves_names_within_the_agent():
    pipeline = Pipeline()
    with pipeline.assign({"retriever.template": "Look up: {q}"}):
        assert pipeline.retriever.template.value == "Look up: {q}"
    assert pipeline.retriever.template.value == "Find: {q}"


# ------------------------------------------------------------------ @agent decorator


def test_agent_decorator_with_a_dict_of_values_sync():
    @agent(params={"prompt": "Be brief.", "k": 2})
    def qa(question, prompt, k):
        return f"{prompt}:{question}:{k}"

    assert isinstance(qa, Agent)
    params = qa.parameters()
    assert [p.name for p in params] == ["prompt", "k"]
    assert asyncio.run(qa.arun("why")) == "Be brief.:why:2"
    assert qa("why") == "Be brief.:why:2"
    with qa.assign({"k": 5}):
        assert asyncio.run(qa.arun("why")) == "Be brief.:why:5"


async def test_agent_decorator_with_a_list_of_parameters_async():
    prompt = Parameter("Hi", name="prompt", description="greeting")
    k = Parameter(1, name="k")

    @agent(params=[prompt, k])
    async def greet(name, prompt, k):
        await asyncio.sleep(0)
        return f"{prompt} {name}" * k

    assert greet.parameters() == [prompt, k]
    assert await greet.arun("Bob") == "Hi Bob"
    with greet.assign({prompt: "Yo", "k": 2}):
        assert await greet.arun("Al") == "Yo AlYo Al"
    assert greet.__name__ == "greet"


def test_agent_decorator_dict_with_parameter_objects_keeps_their_settings():
    @agent(params={"prompt": Parameter("x", description="the prompt", trainable=False), "n": 1})
    def f(x, prompt, n):
        return x

    by_name = f.named_parameters()
    assert by_name["prompt"].description == "the prompt"
    assert [p.name for p in f.parameters(trainable_only=True)] == ["n"]


def test_agent_decorator_list_needs_named_parameters():
    with pytest.raises(ValueError, match="named Parameter"):
        agent(params=[Parameter("x")])
    with pytest.raises(ValueError, match="named Parameter"):
        agent(params=["not a parameter"])


# ------------------------------------------------------------------- input spreading


async def test_tuple_and_dict_inputs_are_spread_over_several_arguments():
    class Adder(Agent):
        def __init__(self):
            self.offset = Parameter(10)

        def forward(self, a, b):
            return a + b + self.offset.value

    adder = Adder()
    assert await adder.arun((1, 2)) == 13
    assert await adder.arun({"b": 5, "a": 1}) == 16


async def test_a_single_argument_gets_the_tuple_as_is():
    class Echo(Agent):
        def __init__(self):
            self.p = Parameter("p")

        async def forward(self, x):
            return x

    assert await Echo().arun((1, 2)) == (1, 2)
    assert await Echo().arun({"a": 1}) == {"a": 1}


async def test_decorated_function_spreads_inputs_but_not_over_its_parameters():
    @agent(params={"sep": "-"})
    def join(a, b, sep):
        return f"{a}{sep}{b}"

    @agent(params={"sep": "+"})
    async def ajoin(a, b, *, sep):
        return f"{a}{sep}{b}"

    assert await join.arun(("x", "y")) == "x-y"
    assert await join.arun({"a": "x", "b": "y"}) == "x-y"
    assert await ajoin.arun(("x", "y")) == "x+y"


# ------------------------------------------------------------------ save/load/apply


def test_save_load_round_trip(tmp_path):
    source = Pipeline()
    source.apply({"prompt": "Trained.", "retriever.k": 7, "examples.1": "new ex", "knobs.temperature": 0.9})
    path = tmp_path / "params.json"
    source.save(path)
    saved = json.loads(path.read_text())
    assert saved["prompt"] == "Trained." and saved["retriever.k"] == 7
    target = Pipeline()
    target.load(path)
    assert target.parameter_values() == source.parameter_values()


def test_save_writes_stored_values_not_assigned_ones(tmp_path):
    pipeline = Pipeline()
    path = tmp_path / "p.json"
    with pipeline.assign({"prompt": "temporary"}):
        pipeline.save(path)
    assert json.loads(path.read_text())["prompt"] == "Answer."


def test_load_with_an_unknown_name_changes_nothing(tmp_path):
    pipeline = Pipeline()
    before = pipeline.parameter_values()
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"prompt": "changed", "no_such_param": 1}))
    with pytest.raises(KeyError, match="no_such_param"):
        pipeline.load(path)
    assert pipeline.parameter_values() == before


def test_load_with_a_bad_value_changes_nothing(tmp_path):
    pipeline = Pipeline()
    before = pipeline.parameter_values()
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"prompt": "changed", "retriever.k": 99}))
    with pytest.raises(ParameterError, match="retriever.k: 99 is above the maximum 10"):
        pipeline.load(path)
    assert pipeline.parameter_values() == before
    path.write_text(json.dumps({"prompt": "changed", "retriever.k": "three"}))
    with pytest.raises(ParameterError, match="retriever.k"):
        pipeline.load(path)
    assert pipeline.parameter_values() == before


def test_load_rejects_files_that_are_not_a_json_object(tmp_path):
    pipeline = Pipeline()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        pipeline.load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        pipeline.load(bad)


def test_apply_validates_everything_before_writing_anything():
    pipeline = Pipeline()
    with pytest.raises(ParameterError, match="retriever.k"):
        pipeline.apply({"prompt": "first is fine", "examples.0": "fine too", "retriever.k": 0})
    assert pipeline.prompt.value == "Answer."
    assert pipeline.examples[0].value == "ex one"
    pipeline.apply({"prompt": "ok", pipeline.retriever.k: 4})
    assert pipeline.prompt.stored_value == "ok" and pipeline.retriever.k.stored_value == 4


# -------------------------------------------------------------------------- traces


class ChatAgent(Agent):
    def __init__(self, model):
        self.model = model
        self.system_prompt = Parameter("You add numbers.")

    async def forward(self, question):
        first = await self.model.complete(
            [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": question}]
        )
        second = await self.model.complete([{"role": "user", "content": f"check {first.text}"}])
        return second.text


class SyncChatAgent(ChatAgent):
    def forward(self, question):  # a sync agent runs in a thread; its calls are still traced
        return asyncio.run(ChatAgent.forward(self, question))


async def test_model_calls_inside_an_agent_run_are_recorded_in_the_rollout_trace():
    model = ScriptedModel(lambda messages: "4" if messages[-1]["content"] == "2+2?" else "checked")
    chat = ChatAgent(model)
    rollout = await run_rollout(chat, ExactGuide(), Example("2+2?", "checked", id="q1"))
    assert rollout.output == "checked" and rollout.score == 1.0 and rollout.example_id == "q1"
    assert [call["response"] for call in rollout.trace] == ["4", "checked"]
    assert rollout.trace[0]["messages"][0] == {"role": "system", "content": "You add numbers."}
    assert rollout.trace[1]["messages"] == [{"role": "user", "content": "check 4"}]
    assert rollout.trace[0]["model"] == "scripted"


async def test_traces_of_concurrent_rollouts_with_different_values_stay_apart():
    def reply(messages):
        if messages[0]["role"] == "system":
            return f"{messages[0]['content']}/{messages[1]['content']}"
        return messages[-1]["content"]

    chat = SyncChatAgent(ScriptedModel(reply))
    examples = [Example(f"q{i}", None, id=str(i)) for i in range(8)]

    class Echo(Guide):
        def get_feedback(self, x, output, info):
            return 1.0

    results = await asyncio.gather(
        *(
            run_rollout(chat, Echo(), e, values={chat.system_prompt: f"sys{i}"})
            for i, e in enumerate(examples)
        )
    )
    for i, rollout in enumerate(results):
        assert len(rollout.trace) == 2
        assert rollout.trace[0]["messages"][0]["content"] == f"sys{i}"
        assert rollout.trace[0]["response"] == f"sys{i}/q{i}"
        assert rollout.output == f"check sys{i}/q{i}"
    assert chat.system_prompt.value == "You add numbers."


async def test_a_failing_agent_gives_a_failed_rollout_with_its_partial_trace():
    model = ScriptedModel(["partial", RuntimeError("backend down")])
    rollout = await run_rollout(ChatAgent(model), ExactGuide(), Example("q", "a", id="x"), min_score=-1.0)
    assert rollout.failed and rollout.score == -1.0
    assert "RuntimeError: backend down" in rollout.error and "backend down" in rollout.feedback
    assert [c["response"] for c in rollout.trace] == ["partial"]


class SameGuide(Guide):
    """1.0 when the output is the input."""

    def get_feedback(self, x, output, info):
        return float(output == x)


async def test_run_rollouts_keeps_input_order_and_checks_concurrency():
    @agent(params={"p": "x"})
    async def slow(x, p):
        await asyncio.sleep(0.001 * (5 - x))
        return x

    examples = [Example(i, None, id=str(i)) for i in range(5)]
    rollouts = await run_rollouts(slow, SameGuide(), examples, concurrency=2)
    assert [r.output for r in rollouts] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="concurrency"):
        await run_rollouts(slow, SameGuide(), examples, concurrency=0)


async def test_run_rollouts_keeps_at_most_concurrency_going_with_no_task_per_example():
    running, peak, tasks_seen = 0, 0, 0

    @agent(params={"p": "x"})
    async def slow(x, p):
        nonlocal running, peak, tasks_seen
        running += 1
        peak = max(peak, running)
        tasks_seen = max(tasks_seen, len(asyncio.all_tasks()))
        await asyncio.sleep(0.001)
        running -= 1
        return x

    examples = [Example(i, None, id=str(i)) for i in range(300)]
    rollouts = await run_rollouts(slow, SameGuide(), examples, concurrency=4)
    assert [r.output for r in rollouts] == list(range(300)) and peak == 4
    assert tasks_seen <= 4 + 2  # the workers, this test and the loop's own: not one per example


async def test_a_batch_digest_follows_a_value_stored_while_the_batch_runs():
    seen: list[str] = []

    @agent(params={"p": "first"})
    async def writer(x, p):
        if x == 1:  # the stored value changes between the batch's rollouts
            writer.named_parameters()["p"].value = "second"
        return p

    class Any_(Guide):
        def get_feedback(self, x, output, info):
            return 1.0

    rollouts = await run_rollouts(writer, Any_(), [Example(i, None, id=str(i)) for i in range(3)], concurrency=1)
    seen = [r.values_hash for r in rollouts]
    assert [r.output for r in rollouts] == ["first", "first", "second"]
    assert seen[0] == seen[1] != seen[2]
    assert seen[2] == values_digest(writer)  # what a rollout on its own would record
