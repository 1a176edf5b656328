"""Few-shot demos: the `Demos` parameter, `DemoProposer`, rule merging, and training with them.

The world: an agent that answers a word's plural correctly only when its demos show
the answer for a word with the same ending, a stand-in for a model that follows
demonstrations; an exact-match guide.
"""

import json

import pytest

from opto import (
    Agent,
    AggregatedUpdate,
    Aggregator,
    DemoProposer,
    Demos,
    ExactMatchGuide,
    Optimizer,
    Parameter,
    ParameterError,
    Proposal,
    RunDir,
    assign,
)
from opto.search.demo_rules import add_demo, merge_demo_lists
from opto.llm import ScriptedModel
from opto.core.rollout import Rollout

# --------------------------------------------------------------------------- Demos


def test_demos_hold_input_output_pairs_and_become_chat_turns():
    demos = Demos([{"input": "cat", "output": "cats"}], max_demos=2, name="demos")
    assert demos.as_messages() == [{"role": "user", "content": "cat"}, {"role": "assistant", "content": "cats"}]
    assert demos.as_messages(format_input=lambda x: f"Word: {x}") [0]["content"] == "Word: cat"
    with assign({demos: [{"input": "box", "output": "boxes"}]}):  # per task, like any parameter
        assert demos.as_messages()[1]["content"] == "boxes"
    assert demos.value == [{"input": "cat", "output": "cats"}]


@pytest.mark.parametrize("bad, message", [
    ([{"input": "a"}], "exactly the keys 'input' and 'output'"),
    ([{"input": "a", "output": "b", "note": "c"}], "exactly the keys"),
    (["a -> b"], "got a str"),
    ([{"input": str(i), "output": "x"} for i in range(3)], "more than max_demos=2"),
])
def test_bad_demo_lists_are_refused_with_the_reason(bad, message):
    demos = Demos(max_demos=2, name="demos")
    with pytest.raises(ParameterError, match=message):
        demos.value = bad
    with pytest.raises(ParameterError, match=message):
        Demos(bad, max_demos=2)
    assert demos.value == []


def test_demos_arguments_are_checked():
    with pytest.raises(ParameterError, match="max_demos"):
        Demos(max_demos=0)
    with pytest.raises(ParameterError, match="list"):
        Demos({"input": "a", "output": "b"})


# ----------------------------------------------------------------------- the rules


def d(word, out=None):
    return {"input": word, "output": out if out is not None else word + "s"}


def test_add_demo_appends_until_full_and_skips_known_inputs():
    assert add_demo([d("cat")], d("dog"), 3) == [d("cat"), d("dog")]
    assert add_demo([d("cat")], d("cat", "cattle"), 3) is None


def test_a_full_list_drops_the_oldest_of_the_most_frequent_output_for_a_rarer_one():
    full = [d("a", "yes"), d("b", "no"), d("c", "yes"), d("e", "yes")]
    assert add_demo(full, d("f", "no"), 4) == [d("b", "no"), d("c", "yes"), d("e", "yes"), d("f", "no")]


def test_a_full_list_replaces_the_oldest_of_the_same_output_when_balance_would_not_improve():
    full = [d("a", "yes"), d("b", "no"), d("c", "yes"), d("e", "no")]
    assert add_demo(full, d("f", "no"), 4) == [d("a", "yes"), d("c", "yes"), d("e", "no"), d("f", "no")]


def test_a_new_output_replaces_the_oldest_most_frequent():
    full = [d("a", "x"), d("b", "y"), d("c", "z")]
    assert add_demo(full, d("e", "w"), 3) == [d("b", "y"), d("c", "z"), d("e", "w")]


def test_merge_prefers_what_more_proposals_added():
    current = [d("a")]
    proposed = [[d("a"), d("b")], [d("a"), d("c")], [d("a"), d("c")]]
    assert merge_demo_lists(current, proposed, 2) == [d("a"), d("c")]
    assert merge_demo_lists(current, proposed, 3) == [d("a"), d("b"), d("c")]
    # a full list gets at most half of it replaced, by the best supported
    full = [d("a"), d("e"), d("f"), d("g")]
    more = [[*full[1:], d("b")], [*full[1:], d("c")], [*full[1:], d("c")], [*full[1:], d("h")]]
    assert merge_demo_lists(full, more, 4) == [d("f"), d("g"), d("b"), d("c")]
    assert merge_demo_lists(current, [], 3) == [d("a")]


# ------------------------------------------------------------------- DemoProposer


class Plurals(Agent):
    """Right only when a demo shows a word with the same last letter (else it guesses "s")."""

    def __init__(self, with_prompt=False):
        self.demos = Demos(max_demos=2)
        if with_prompt:
            self.prompt = Parameter("Give the plural.")

    def forward(self, word):
        if getattr(self, "prompt", None) is not None:
            self.prompt.value  # read, so it is not flagged as unused
        for demo in self.demos.value:
            if demo["input"][-1] == word[-1]:
                stem, ending = _rule(demo["input"], demo["output"])
                return word[: len(word) - len(stem)] + ending if stem else word + ending
        return word + "s"


def _rule(word, plural):
    """The (suffix removed, suffix added) that turns `word` into `plural`."""
    common = 0
    while common < min(len(word), len(plural)) and word[common] == plural[common]:
        common += 1
    return word[common:], plural[common:]


def rollout(word, plural, output=None, score=0.0, error=None):
    return Rollout(example_id=word, x=word, info=[plural], output=output, score=score, error=error)


async def test_demo_proposer_sources():
    agent = Plurals()
    params = agent.parameters()
    labels = await DemoProposer().propose(params, rollout("box", "boxes", output="boxs", score=0.0))
    assert labels[0].update == {"demos": [{"input": "box", "output": "boxes"}]}
    assert labels[0].proposer == "demos" and labels[0].instance_id == "box"
    assert await DemoProposer(source="successes").propose(params, rollout("box", "boxes", "boxs", 0.0)) == []
    won = await DemoProposer(source="successes").propose(params, rollout("cat", "cats", "cats", 1.0))
    assert won[0].update == {"demos": [{"input": "cat", "output": "cats"}]}
    both = await DemoProposer(source="both", label=lambda x, info: info[0].upper()).propose(
        params, rollout("box", "boxes", "boxs", 0.0))
    assert both[0].update == {"demos": [{"input": "box", "output": "BOXES"}]}


async def test_demo_proposer_skips_shown_examples_and_failed_successes():
    agent = Plurals()
    agent.demos.value = [{"input": "box", "output": "boxes"}]
    assert await DemoProposer().propose(agent.parameters(), rollout("box", "boxes")) == []
    failed = rollout("cat", "cats", output=None, score=1.0, error="agent: boom")
    assert await DemoProposer(source="successes").propose(agent.parameters(), failed) == []


async def test_demo_proposer_errors_are_clear():
    with pytest.raises(ValueError, match="source must be"):
        DemoProposer(source="all")
    with pytest.raises(ValueError, match="no trainable Demos of that name"):
        await DemoProposer(target="shots").propose(Plurals().parameters(), rollout("box", "boxes"))
    with pytest.raises(ValueError, match="label=lambda"):
        await DemoProposer().propose(Plurals().parameters(), Rollout(example_id="1", x="a", info={"y": 1}))


async def test_the_llm_optimizer_leaves_demos_alone():
    agent = Plurals()
    model = ScriptedModel([])  # any call would fail: there is nothing it may change
    assert await Optimizer(model).propose(agent.parameters(), rollout("box", "boxes")) == []
    with_prompt = Plurals(with_prompt=True)
    model = ScriptedModel([json.dumps({"reasoning": "r", "suggestion": {
        "prompt": "Plural, please.", "demos": [{"input": "x", "output": "y"}]}})])
    [proposal] = await Optimizer(model).propose(with_prompt.parameters(), rollout("box", "boxes"))
    assert proposal.update == {"prompt": "Plural, please."}
    schema = model.requests[0]["response_format"]["json_schema"]["schema"]["properties"]["suggestion"]
    assert list(schema["properties"]) == ["prompt"]


async def test_demo_only_proposals_are_merged_by_rule_without_a_model():
    agent = Plurals()
    proposals = [Proposal(proposer="demos", update={"demos": [d("box", "boxes")]}),
                 Proposal(proposer="demos", update={"demos": [d("city", "cities")]}),
                 Proposal(proposer="demos", update={"demos": [d("box", "boxes")]})]
    [candidate] = await Aggregator(None).aggregate(agent.parameters(), proposals, 0.5)
    assert candidate.extraction_method == "rule"
    assert candidate.update == {"demos": [d("city", "cities"), d("box", "boxes")]}
    assert len(candidate.source_proposals) == 3


async def test_mixed_proposals_give_a_rule_candidate_and_an_llm_candidate():
    agent = Plurals(with_prompt=True)
    llm = ScriptedModel([json.dumps({"reasoning_prompt": "r", "suggestion": {"prompt": "Plural!"}})])
    proposals = [Proposal(proposer="demos", update={"demos": [d("box", "boxes")]}),
                 Proposal(proposer="optimizer", update={"prompt": "Plural!"})]
    rule, merged = await Aggregator(llm).aggregate(agent.parameters(), proposals, 0.5)
    assert rule.update == {"demos": [d("box", "boxes")]} and merged.update == {"prompt": "Plural!"}
    assert "demos" not in llm.requests[0]["messages"][-1]["content"].split("# Suggestion 0")[1]
    with pytest.raises(ValueError, match="no model"):
        await Aggregator(None).aggregate(agent.parameters(), proposals, 0.5)


# ------------------------------------------------------------------------ training

WORDS = [("box", "boxes"), ("city", "cities"), ("cat", "cats"), ("fox", "foxes"), ("party", "parties"),
         ("dog", "dogs"), ("tax", "taxes"), ("baby", "babies")]


def plural_data(pairs):
    return [{"x": w, "info": [p], "id": w} for w, p in pairs]


def test_training_with_the_demo_proposer_alone_learns_the_demos(tmp_path):
    agent = Plurals()
    trainer = AggregatedUpdate(agent, DemoProposer(), validation=plural_data(WORDS[4:]), proposals="per_instance")
    result = trainer.train(ExactMatchGuide(), plural_data(WORDS[:4]), batch_size=2, run_dir=tmp_path,
                           test_dataset=plural_data(WORDS[4:]), progress=False, shuffle=False)
    assert result.initial_test_score == 0.25  # only "dog" right without demos
    assert result.final_test_score == 1.0 and result.accepted >= 1
    assert {demo["input"][-1] for demo in agent.demos.stored_value} == {"x", "y"}
    proposals = [r for r in RunDir(tmp_path).ledger() if r["type"] == "proposal"]
    assert proposals and all(r["proposer"] == "demos" for r in proposals)


def test_training_with_the_llm_optimizer_and_the_demo_proposer(tmp_path):
    agent = Plurals(with_prompt=True)
    brain = ScriptedModel(lambda messages: json.dumps(
        {"reasoning": "r", "reasoning_prompt": "r", "suggestion": {"prompt": "Give the plural form."}}))
    trainer = AggregatedUpdate(agent, [Optimizer(brain), DemoProposer()], validation=plural_data(WORDS[4:]), proposals="per_instance")
    result = trainer.train(ExactMatchGuide(), plural_data(WORDS[:4]), batch_size=2, run_dir=tmp_path,
                           progress=False, shuffle=False)
    ledger = RunDir(tmp_path).ledger()
    assert {r["proposer"] for r in ledger if r["type"] == "proposal"} == {"optimizer", "demos"}
    methods = {r["extraction_method"] for r in ledger if r["type"] == "candidate"}
    assert "rule" in methods and len(methods) == 2
    assert agent.demos.stored_value and result.accepted >= 1


def test_proposer_lists_are_checked():
    with pytest.raises(ValueError, match="at least one proposer"):
        AggregatedUpdate(Plurals(), [], proposals="per_instance", validation="minibatch")
    with pytest.raises(TypeError, match="is not a proposer"):
        AggregatedUpdate(Plurals(), [object()], proposals="per_instance", validation="minibatch")
    with pytest.raises(ValueError, match="distinct names"):
        AggregatedUpdate(Plurals(), [DemoProposer(), DemoProposer()], proposals="per_instance", validation="minibatch")


# ------------------------------------------------------------ additions: edges and paths


@pytest.mark.parametrize("bad", [None, 5, "cat -> cats"])
def test_demos_refuse_a_value_that_is_not_a_list_of_demos(bad):
    with pytest.raises(ParameterError, match="Demos takes a list"):
        Demos(bad)


def test_demos_survive_apply_save_and_load(tmp_path):
    agent = Plurals(with_prompt=True)
    agent.apply({"demos": [d("box", "boxes"), {"input": {"word": "cat", "n": 2}, "output": ["cats"]}]})
    agent.save(tmp_path / "agent.json")
    restored = Plurals(with_prompt=True)
    restored.load(tmp_path / "agent.json")
    assert restored.demos.stored_value == agent.demos.stored_value
    assert restored.forward("fox") == "foxes"  # the restored demo is used
    # a checkpoint with more demos than max_demos is refused and changes nothing
    (tmp_path / "bad.json").write_text(json.dumps({"demos": [d("a"), d("b"), d("c")], "prompt": "new"}))
    with pytest.raises(ParameterError, match="more than max_demos=2"):
        restored.load(tmp_path / "bad.json")
    assert restored.prompt.value == "Give the plural." and len(restored.demos.value) == 2


def test_as_messages_formats_inputs_and_reads_the_agent_assignment():
    agent = Plurals()
    with agent.assign({"demos": [{"input": {"q": "2+2"}, "output": 4}]}):
        assert agent.demos.as_messages(format_input=lambda x: x["q"]) == [
            {"role": "user", "content": "2+2"}, {"role": "assistant", "content": "4"}]
    assert agent.demos.as_messages() == []


async def test_demo_proposer_on_a_full_list_keeps_the_outputs_balanced():
    agent = Plurals()
    agent.demos.max_demos = 3
    agent.demos.value = [d("a", "yes"), d("b", "yes"), d("c", "no")]

    def yes_no(word, plural):
        return Rollout(example_id=word, x=word, info=[plural], output="?", score=0.0)

    [rarer] = await DemoProposer().propose(agent.parameters(), yes_no("e", "no"))
    assert rarer.update["demos"] == [d("b", "yes"), d("c", "no"), d("e", "no")]  # oldest "yes" goes
    [same] = await DemoProposer().propose(agent.parameters(), yes_no("f", "yes"))
    assert same.update["demos"] == [d("b", "yes"), d("c", "no"), d("f", "yes")]  # its own oldest output goes
    assert await DemoProposer().propose(agent.parameters(), yes_no("c", "yes")) == []  # input shown


def test_merge_fills_free_places_with_balanced_outputs():
    batch = [[d(f"y{i}", "yes")] for i in range(5)] + [[d("n0", "no")]]
    merged = merge_demo_lists([], batch, 4)
    assert [demo["output"] for demo in merged].count("no") == 1 and len(merged) == 4
    assert merged == [d("y2", "yes"), d("y1", "yes"), d("n0", "no"), d("y0", "yes")]
    # the current list counts too: with two "yes" shown, a "no" goes in first
    assert merge_demo_lists([d("a", "yes"), d("b", "yes")], [[d("y9", "yes")], [d("n1", "no")]], 3) == [
        d("a", "yes"), d("b", "yes"), d("n1", "no")]


async def test_the_rule_merge_makes_no_model_call_even_with_a_model():
    agent = Plurals()
    model = ScriptedModel([])  # no replies: any call would fail
    proposals = [Proposal(proposer="demos", update={"demos": [d("box", "boxes")]}),
                 Proposal(proposer="demos", update={}, terminate=True)]
    [candidate] = await Aggregator(model, num_candidates=3).aggregate(agent.parameters(), proposals, 0.5)
    assert candidate.update == {"demos": [d("box", "boxes")]} and model.requests == []
    assert candidate.source_proposals == [proposals[0].proposal_id]


async def test_a_proposal_changing_demos_and_a_prompt_is_split():
    agent = Plurals(with_prompt=True)
    llm = ScriptedModel([json.dumps({"reasoning_prompt": "r", "suggestion": {
        "prompt": "Plural!", "demos": [d("zzz", "invented")]}})])
    mixed = Proposal(proposer="custom", update={"prompt": "Plural!", "demos": [d("quiz", "quizzes")]})
    rule, merged = await Aggregator(llm).aggregate(agent.parameters(), [mixed], 0.5)
    assert rule.update == {"demos": [d("quiz", "quizzes")]} and rule.source_proposals == [mixed.proposal_id]
    assert merged.update == {"prompt": "Plural!"}  # the LLM's demo list is not read
    assert merged.source_proposals == [mixed.proposal_id]
    request = llm.requests[0]
    assert "quiz" not in json.dumps(request["messages"])
    assert list(request["response_format"]["json_schema"]["schema"]["properties"]["suggestion"]["properties"]) == [
        "prompt"]


def test_demo_only_training_needs_no_model_and_exports_no_rule_turns(tmp_path):
    from opto.preference import PreferencePairBuilder, read_turns

    agent = Plurals()
    trainer = AggregatedUpdate(agent, DemoProposer(), validation=plural_data(WORDS[4:]), score_proposals="instance",
                               proposals="per_instance")
    result = trainer.train(ExactMatchGuide(), plural_data(WORDS[:4]), batch_size=2, run_dir=tmp_path,
                           progress=False, shuffle=False)
    assert result.accepted >= 1
    ledger = RunDir(tmp_path).ledger()
    assert any(r["type"] == "proposal_score" for r in ledger)
    assert {r["extraction_method"] for r in ledger if r["type"] == "candidate"} == {"rule"}
    # rule-made proposals and candidates have no prompt: they are no preference data
    reading = read_turns(tmp_path, "all")
    assert not [t for t in reading.turns if t.source != "agent"]
    assert reading.unscored["optimizer: made by rule, not by a model"] == 4
    supervised = PreferencePairBuilder(require_multiple_candidates=False).best_responses(reading.turns)
    assert all(example.prompt for example in supervised)


async def test_a_lower_proposer_limit_never_proposes_an_input_already_shown():
    agent = Plurals()
    agent.demos.max_demos = 3
    agent.demos.value = [d("a"), d("b"), d("box", "boxes")]
    assert await DemoProposer(max_demos=2).propose(agent.parameters(), rollout("box", "boxes")) == []
    [proposal] = await DemoProposer(max_demos=2).propose(agent.parameters(), rollout("cat", "cats"))
    assert proposal.update == {"demos": [d("b"), d("cat", "cats")]}
