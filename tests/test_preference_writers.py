"""Writers against their schemas, file validation, and reading turns from hand-made ledgers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opto.preference import (
    FORMATS,
    DatasetFormatError,
    NeMoWriter,
    PreferencePair,
    PreferencePairBuilder,
    SupervisedExample,
    get_writer,
    read_turns,
    validate_jsonl,
    validate_record,
)

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def pair(**changes: Any) -> PreferencePair:
    fields = dict(turn_id="t1", source="agent", step=1, example_id="e1", prompt=PROMPT, chosen="4",
                  rejected="five", chosen_score=1.0, rejected_score=0.0, reward=1.0)
    return PreferencePair(**{**fields, **changes})


def best(**changes: Any) -> SupervisedExample:
    fields = dict(turn_id="t1", source="agent", step=1, example_id="e1", prompt=PROMPT, response="4", score=1.0)
    return SupervisedExample(**{**fields, **changes})


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------------------ writers


def test_openai_dpo_record(tmp_path: Path) -> None:
    out = tmp_path / "dpo.jsonl"
    assert get_writer("openai-dpo").write([pair()], out) == 1
    assert read(out) == [{
        "input": {"messages": PROMPT},
        "preferred_output": [{"role": "assistant", "content": "4"}],
        "non_preferred_output": [{"role": "assistant", "content": "five"}],
    }]
    assert validate_jsonl(out, "openai-dpo") == 1


def test_openai_sft_record(tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    get_writer("openai-sft").write([best()], out)
    assert read(out) == [{"messages": [*PROMPT, {"role": "assistant", "content": "4"}]}]
    assert validate_jsonl(out, "openai-sft") == 1


class TemplateTokenizer:
    """Stands in for a Hugging Face tokenizer: a chat template rendered with jinja2, as
    `apply_chat_template(..., tokenize=False)` does."""

    chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
                     "{% if tools %}<|tools|>{{ tools | map(attribute='function.name') | join(',') }}{% endif %}"
                     "{% if add_generation_prompt %}<|assistant|>{% endif %}")

    def apply_chat_template(self, messages, tools=None, tokenize=True, add_generation_prompt=False):
        import jinja2

        assert tokenize is False
        return jinja2.Template(self.chat_template).render(messages=messages, tools=tools,
                                                          add_generation_prompt=add_generation_prompt)


def test_trl_standard_record_is_rendered_with_the_models_chat_template(tmp_path: Path) -> None:
    out = tmp_path / "trl.jsonl"
    get_writer("trl", tokenizer=TemplateTokenizer()).write([pair()], out)
    [record] = read(out)
    assert record == {"prompt": "<|system|>Be brief.<|end|><|user|>2+2?<|end|><|assistant|>", "chosen": "4",
                      "rejected": "five"}
    assert validate_jsonl(out, "trl") == 1
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    [with_tools] = get_writer("trl", tokenizer=TemplateTokenizer()).records([pair(tools=tools)])
    assert "<|tools|>calculator<|assistant|>" in with_tools["prompt"]


def test_trl_standard_without_a_tokenizer_is_refused_and_points_to_trl_chat() -> None:
    with pytest.raises(ValueError, match="trl-chat"):
        get_writer("trl")

    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        get_writer("trl", tokenizer=NoTemplate())
    with pytest.raises(ValueError, match="takes no option"):
        get_writer("openai-dpo", tokenizer=TemplateTokenizer())


def test_trl_conversational_record(tmp_path: Path) -> None:
    out = tmp_path / "chat.jsonl"
    get_writer("trl-chat").write([pair()], out)
    assert read(out) == [{"prompt": PROMPT, "chosen": [{"role": "assistant", "content": "4"}],
                          "rejected": [{"role": "assistant", "content": "five"}]}]
    assert validate_jsonl(out, "trl-chat") == 1


def test_nemo_record_with_messages_or_string(tmp_path: Path) -> None:
    out = tmp_path / "nemo.jsonl"
    get_writer("nemo").write([pair()], out)
    assert read(out) == [{"prompt": PROMPT, "chosen_response": "4", "rejected_response": "five"}]
    NeMoWriter(prompt="string").write([pair()], out)
    assert read(out)[0]["prompt"] == "2+2?"  # the last message's content, as NeMo Agent Toolkit's string mode
    assert validate_jsonl(out, "nemo") == 1
    with pytest.raises(ValueError, match="'messages' or 'string'"):
        get_writer("nemo", prompt="text")


TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
TOOL_PROMPT = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "4"}]


def test_tools_and_tool_messages_are_exported_where_the_format_allows() -> None:
    [dpo] = get_writer("openai-dpo").records([pair(prompt=TOOL_PROMPT, tools=TOOLS)])
    assert dpo["input"]["tools"] == TOOLS and dpo["input"]["messages"][2]["tool_call_id"] == "c1"
    [sft] = get_writer("openai-sft").records([best(prompt=TOOL_PROMPT, tools=TOOLS)])
    assert sft["tools"] == TOOLS and sft["messages"][1]["tool_calls"][0]["id"] == "c1"
    [chat] = get_writer("trl-chat").records([pair(prompt=TOOL_PROMPT, tools=TOOLS)])
    assert chat["tools"] == TOOLS and chat["prompt"][2]["role"] == "tool"
    [plain] = get_writer("openai-dpo").records([pair()])
    assert "tools" not in plain["input"]  # no tools offered, no tools key


def test_roles_are_checked_per_format() -> None:
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert get_writer("openai-dpo").records([pair(prompt=developer)])
    with pytest.raises(DatasetFormatError, match="'developer' is not accepted by TRL"):
        get_writer("trl-chat").records([pair(prompt=developer)])
    with pytest.raises(DatasetFormatError, match="not accepted by NeMo Customizer"):
        get_writer("nemo").records([pair(prompt=TOOL_PROMPT)])
    no_id = [{"role": "user", "content": "2+2?"}, {"role": "tool", "content": "4"}]
    with pytest.raises(DatasetFormatError, match="tool_call_id"):
        get_writer("openai-dpo").records([pair(prompt=no_id)])
    assert get_writer("trl-chat").records([pair(prompt=no_id)])  # TRL's templates need no id


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_writer_refuses_what_its_schema_refuses(fmt: str) -> None:
    writer = get_writer(fmt, tokenizer=TemplateTokenizer() if fmt == "trl" else None)
    if writer.kind == "groups":
        from opto.preference import Trajectory, TrajectoryGroup

        out_of_order = Trajectory(messages_and_choices=[{"role": "assistant", "content": "a"}], reward=1.0,
                                  metadata={"example_id": "e1"})
        with pytest.raises(DatasetFormatError, match="group of example e1.*the first message is assistant"):
            writer.records([TrajectoryGroup(trajectories=[out_of_order])])
        with pytest.raises(TypeError, match="writes TrajectoryGroup"):
            writer.records([pair()])
        return
    item = best(response=" ") if writer.kind == "supervised" else pair(rejected="4")
    with pytest.raises(DatasetFormatError, match="turn t1"):
        writer.records([item])
    with pytest.raises(TypeError, match="writes"):
        writer.records([pair() if writer.kind == "supervised" else best()])


def test_a_prompt_ending_with_a_reply_or_with_an_unknown_role_is_refused() -> None:
    with pytest.raises(DatasetFormatError, match="must end with a user"):
        get_writer("openai-dpo").records([pair(prompt=[*PROMPT, {"role": "assistant", "content": "hm"}])])
    with pytest.raises(DatasetFormatError, match="role"):
        get_writer("trl-chat").records([pair(prompt=[{"role": "robot", "content": "hi"}])])


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="use one of openai-dpo"):
        get_writer("csv")


# ------------------------------------------------------------------------------ schemas


@pytest.mark.parametrize(
    ("record", "complaint"),
    [
        ({"input": {"messages": []}, "preferred_output": [{"role": "assistant", "content": "a"}],
          "non_preferred_output": [{"role": "assistant", "content": "b"}]}, "at least one message"),
        ({"input": {"messages": PROMPT}, "preferred_output": [{"role": "user", "content": "a"}],
          "non_preferred_output": [{"role": "assistant", "content": "b"}]}, "preferred_output.0.role"),
        ({"input": {"messages": PROMPT}, "preferred_output": [{"role": "assistant", "content": "a"}] * 2,
          "non_preferred_output": [{"role": "assistant", "content": "b"}]}, "at most 1 item"),
        ({"input": {"messages": PROMPT}, "preferred_output": [{"role": "assistant", "content": "a"}],
          "non_preferred_output": [{"role": "assistant", "content": "b"}], "score": 1}, "score: Extra inputs"),
        ({"input": {"messages": PROMPT}, "preferred_output": [{"role": "assistant", "content": "a"}]},
         "non_preferred_output: Field required"),
    ],
)
def test_openai_dpo_schema_says_what_is_wrong(record: dict[str, Any], complaint: str) -> None:
    with pytest.raises(DatasetFormatError, match=complaint):
        validate_record(record, "openai-dpo")


def test_sft_needs_a_final_assistant_reply() -> None:
    with pytest.raises(DatasetFormatError, match="end with a non-empty assistant reply"):
        validate_record({"messages": PROMPT}, "openai-sft")


def test_validate_jsonl_names_the_line_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    good = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
    path.write_text(f"{good}\n\n{good}\n{{broken\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"x.jsonl:4 is not valid JSON"):
        validate_jsonl(path, "trl")
    path.write_text(f"{good}\n{json.dumps({'prompt': 'p', 'chosen': 'a'})}\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"x.jsonl:2: .*rejected: Field required"):
        validate_jsonl(path, "trl")
    path.write_text(f"{good}\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="holds 1 trl example; at least 10 are needed"):
        validate_jsonl(path, "trl", min_examples=10)
    with pytest.raises(FileNotFoundError):
        validate_jsonl(tmp_path / "missing.jsonl", "trl")


# ------------------------------------------------------------------------------ turns


def rollout(step: int, instance: str, phase: str, score: float | None, system: str, user: str, reply: str,
            owner: str | None = None, error: str | None = None) -> dict[str, Any]:
    return {"type": "rollout", "step": step, "phase": phase, "instance_id": instance, "score": score,
            "candidate_id": owner if phase == "validation" else None,
            "proposal_id": owner if phase == "proposal_validation" else None, "error": error,
            "trace": [{"model": "m", "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": user}],
                       "response": reply, "cached": False}]}


def test_agent_turns_pair_calls_on_the_same_visible_input() -> None:
    ledger = [
        rollout(1, "q1", "train", 0.0, "old prompt", "Count: a a", "two items"),
        rollout(1, "q1", "validation", 1.0, "new prompt", "Count: a a", "2", owner="c1"),
        rollout(1, "q1", "proposal_validation", 0.5, "other prompt", "Count: a a", "2 items", owner="p1"),
        rollout(1, "q2", "train", 0.0, "old prompt", "Count: a", "one"),  # alone in its turn
        rollout(2, "q1", "train", 1.0, "new prompt", "Count: a a", "2"),  # another step: another turn
        rollout(1, "q3", "train", 0.0, "old prompt", "Count: b", "x", error="agent: boom"),
    ]
    reading = read_turns(ledger, "agent")
    shapes = {(t.step, t.example_id): sorted((c.response, c.score) for c in t.candidates) for t in reading.turns}
    assert shapes == {(1, "q1"): [("2", 1.0), ("2 items", 0.5), ("two items", 0.0)],
                      (1, "q2"): [("one", 0.0)], (2, "q1"): [("2", 1.0)]}
    assert reading.unscored == {"agent: failed or unscored rollout": 1}
    q1 = next(t for t in reading.turns if (t.step, t.example_id) == (1, "q1"))
    assert q1.prompt == [{"role": "user", "content": "Count: a a"}]  # system prompts differ: dropped
    pairs = PreferencePairBuilder().build(reading.turns)
    assert [(p.chosen, p.rejected) for p in pairs] == [("2", "two items"), ("2", "2 items"), ("2 items", "two items")]


def test_agent_turns_keep_the_system_prompt_when_it_is_the_same() -> None:
    ledger = [rollout(1, "q1", "train", 0.0, "same", "hi", "a"),
              rollout(1, "q1", "validation", 1.0, "same", "hi", "b", owner="c1")]
    [turn] = read_turns(ledger, "agent").turns
    assert turn.prompt == [{"role": "system", "content": "same"}, {"role": "user", "content": "hi"}]


def test_aggregator_turns_score_by_validation_and_no_change_by_the_current_score() -> None:
    prompt = [{"role": "user", "content": "merge these"}]
    ledger = [
        {"type": "candidate", "step": 1, "final": False, "candidate_id": "g", "prompt_messages": prompt,
         "raw_response": "group", "update": {"p": 1}},
        {"type": "candidate", "step": 1, "final": True, "candidate_id": "a", "prompt_messages": prompt,
         "raw_response": "A", "update": {"p": 2}},
        {"type": "candidate", "step": 1, "final": True, "candidate_id": "b", "prompt_messages": prompt,
         "raw_response": "B", "update": {}, "error": None},
        {"type": "candidate", "step": 1, "final": True, "candidate_id": "c", "prompt_messages": prompt,
         "raw_response": "C", "update": {}, "error": "reply truncated"},
        {"type": "decision", "step": 1, "candidate_id": "a", "accepted": False, "current_score": 0.75,
         "candidate_score": 0.25},
    ]
    reading = read_turns(ledger, "aggregator")
    [turn] = reading.turns
    assert [(c.response, c.score) for c in turn.candidates] == [("A", 0.25), ("B", 0.75)]
    assert turn.example_id == "step-1" and reading.unscored == {"aggregator: candidate without a validation score": 1}


def test_optimizer_turns_group_by_prompt() -> None:
    def proposal(pid: str, prompt: str, reply: str) -> dict[str, Any]:
        return {"type": "proposal", "step": 1, "instance_id": "q1", "proposal_id": pid, "raw_response": reply,
                "prompt_messages": [{"role": "user", "content": prompt}]}

    ledger = [proposal("a", "P", "ra"), proposal("b", "P", "rb"), proposal("c", "Q", "rc"),
              {"type": "proposal_score", "step": 1, "proposal_id": "a", "score": 1.0},
              {"type": "proposal_score", "step": 1, "proposal_id": "b", "score": 0.0},
              {"type": "proposal_score", "step": 1, "proposal_id": "c", "score": None}]
    reading = read_turns(ledger, "optimizer")
    assert [[(c.response, c.score) for c in t.candidates] for t in reading.turns] == [[("ra", 1.0), ("rb", 0.0)], []]


def test_unknown_source() -> None:
    with pytest.raises(ValueError, match="source must be one of"):
        read_turns([], "judge")


def test_a_truncated_reply_is_never_chosen_and_is_counted(tmp_path: Path) -> None:
    cut = rollout(1, "q1", "validation", 1.0, "same", "hi", "The answer is plausi", owner="c1")
    cut["trace"][0]["truncated"] = True  # scored 1.0 because the judge found its word in the cut text
    ledger = [rollout(1, "q1", "train", 0.0, "same", "hi", "implausible"), cut,
              rollout(1, "q1", "proposal_validation", 0.5, "same", "hi", "plausible", owner="p1")]
    builder = PreferencePairBuilder()
    pairs = builder.build(read_turns(ledger, "agent").turns)
    assert [(p.chosen, p.rejected) for p in pairs] == [("plausible", "implausible")]
    assert all(p.chosen != "The answer is plausi" for p in pairs)
    assert builder.stats.truncated_candidates == 1 and builder.stats.pairs_skipped_truncated == 2
    assert "1 truncated responses" in builder.stats.summary()
    [best_example] = builder.best_responses(read_turns(ledger, "agent").turns)
    assert best_example.response == "plausible"  # the best complete reply, not the cut one


def test_tool_results_in_a_trace_are_not_calls_and_tools_reach_the_export() -> None:
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    ledger = [rollout(1, "q1", "train", 0.0, "same", "2+2?", "five"),
              rollout(1, "q1", "validation", 1.0, "same", "2+2?", "4", owner="c1")]
    for record in ledger:
        record["trace"][0]["tools"] = tools
        record["trace"].append({"tool_result": {"tool_call_id": "c1", "name": "calculator", "content": "4"}})
    reading = read_turns(ledger, "agent")
    [turn] = reading.turns
    assert turn.tools == tools and reading.unscored == {}
    [record] = get_writer("openai-dpo").records(PreferencePairBuilder().build(reading.turns))
    assert record["input"]["tools"] == tools
