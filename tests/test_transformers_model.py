"""`TransformersModel` on tiny random models built here: generation settings, batching of
concurrent calls, logprobs, LoRA adapters, and clear errors for what it cannot run."""

from __future__ import annotations

import asyncio
import time
import itertools
import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.trl
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny_models import build_tiny_model  # noqa: E402

from opto import Agent, ExactMatchGuide, Guide, Parameter, evaluate  # noqa: E402
from opto.llm import LLMError, TransformersModel  # noqa: E402
from opto.llm.errors import LLMRequestError  # noqa: E402

TEXTS = ["the cat sat on the mat", "blades gangs situations", "answer the question"] * 5
ASK = [{"role": "user", "content": "the cat"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TEXTS)


def complete_all(model: TransformersModel, count: int, **kwargs) -> list:
    async def run():
        return await asyncio.gather(*(model.complete(ASK, **kwargs) for _ in range(count)))
    return asyncio.run(run())


def test_it_generates_with_the_settings_asked(tiny):
    model = TransformersModel(tiny, batch_wait=0)
    [greedy] = complete_all(model, 1, max_tokens=5)
    assert greedy.model == "model" and greedy.usage.prompt_tokens > 0 and 0 < greedy.usage.completion_tokens <= 5
    assert greedy.truncated or greedy.finish_reason == "stop"
    [again] = complete_all(model, 1, max_tokens=5, seed=1)  # greedy: the same text whatever the seed
    assert again.text == greedy.text
    [three] = complete_all(model, 1, max_tokens=6, n=3, temperature=1.0, seed=7)
    [same] = complete_all(model, 1, max_tokens=6, n=3, temperature=1.0, seed=8 - 1)
    assert len(three.texts) == 3 and three.texts == same.texts  # a seed makes sampling repeatable
    [limited] = complete_all(model, 1, max_tokens=2, temperature=1.0, seed=3)
    assert limited.usage.completion_tokens <= 2


def test_stop_strings_cut_the_reply(tiny):
    model = TransformersModel(tiny, batch_wait=0)
    [whole] = complete_all(model, 1, max_tokens=12, temperature=1.0, seed=5)
    word = next((w for w in whole.text.split() if len(w) > 1), None)
    if word is None:
        pytest.skip("the random model wrote no word to stop at")  # pragma: no cover
    [cut] = complete_all(model, 1, max_tokens=12, temperature=1.0, seed=5, stop=[word])
    assert word not in cut.text and whole.text.startswith(cut.text)


def test_logprobs_come_with_the_sampled_tokens(tiny):
    model = TransformersModel(tiny, batch_wait=0)
    [found] = complete_all(model, 1, max_tokens=4, temperature=1.0, seed=2, logprobs=True)
    assert len(found.logprobs) == found.usage.completion_tokens
    assert all(entry["logprob"] <= 0.0 and isinstance(entry["token"], str) for entry in found.logprobs)
    assert "".join(entry["token"] for entry in found.logprobs).strip() == found.text.strip()


class Sampler(Agent):
    """Asks its model with logprobs=True, as an agent whose rollouts are RL data should."""

    def __init__(self, model: TransformersModel) -> None:
        self.model = model
        self.prompt = Parameter("answer the question", description="system prompt")

    async def forward(self, question: str) -> str:
        reply = await self.model.complete([{"role": "system", "content": self.prompt.value},
                                           {"role": "user", "content": question}], max_tokens=3, logprobs=True)
        return reply.text


class DistinctRewards(Guide):
    """Gives every rollout a reward of its own, so that no group is dropped for equal
    rewards: whether the random model's samples differ depends on how its calls batch."""

    def __init__(self) -> None:
        self.calls = itertools.count(1)

    def get_feedback(self, x, output, info):
        return next(self.calls) / 100


def test_groups_collected_from_it_with_logprobs_export_as_on_policy(tiny, tmp_path, caplog):
    from opto import collect
    from opto.preference import export_run, read_groups

    examples = [{"x": f"the cat {i}", "info": "blades", "id": f"e{i}"} for i in range(3)]
    collect(Sampler(TransformersModel(tiny)), DistinctRewards(), examples, samples=4, temperature=1.0,
            run_dir=tmp_path / "run", progress=False)
    reading = read_groups(tmp_path / "run")
    assert len(reading.groups) == 3 and reading.stats.off_policy_trajectories == 0
    with caplog.at_level("WARNING"):
        export_run(tmp_path / "run", tmp_path / "groups.jsonl", format="art")
    assert "off-policy" not in caplog.text and "carry no logprobs" not in caplog.text
    choice = json.loads((tmp_path / "groups.jsonl").read_text().splitlines()[0])[
        "trajectories"][0]["messages_and_choices"][-1]
    assert choice["logprobs"]["content"] and all(t["logprob"] <= 0 for t in choice["logprobs"]["content"])


def test_a_prefix_every_call_shares_is_run_once_and_changes_no_answer(tiny, monkeypatch):
    from opto.llm import transformers_model

    demos = [{"role": "system", "content": "answer the question " * 6}] + [
        turn for word in ("cat", "mat", "blade") for turn in ({"role": "user", "content": f"the {word}"},
                                                              {"role": "assistant", "content": f"{word}s"})]
    asks = [[*demos, {"role": "user", "content": question}] for question in ("the cat sat", "gangs", "the mat on")]

    def answer(min_shared: int) -> tuple[list, int]:
        monkeypatch.setattr(transformers_model, "MIN_SHARED_PREFIX", min_shared)
        model = TransformersModel(tiny)
        runs = []
        original = model.load()[2].forward

        def counting(*args, **kwargs):  # the widest input a forward pass is given
            ids = kwargs.get("input_ids", args[0] if args else None)
            runs.append(ids.shape[0] * ids.shape[1])
            return original(*args, **kwargs)

        model.load()[2].forward = counting

        async def run():
            return await asyncio.gather(*(model.complete(m, max_tokens=5, logprobs=True) for m in asks))
        return asyncio.run(run()), runs[0]

    shared, first_pass = answer(16)
    plain, plain_first_pass = answer(10_000)
    assert [c.text for c in shared] == [c.text for c in plain]
    assert [c.usage for c in shared] == [c.usage for c in plain]
    for a, b in zip(shared, plain):
        assert [round(t["logprob"], 4) for t in a.logprobs] == [round(t["logprob"], 4) for t in b.logprobs]
    # The prefix ran once for one row; without sharing the first pass holds every row's whole prompt.
    assert first_pass * 3 < plain_first_pass


def test_concurrent_calls_with_the_same_settings_share_a_generate(tiny):
    model = TransformersModel(tiny, max_batch_size=4, batch_wait=0.5)
    replies = complete_all(model, 8, max_tokens=3)
    assert len(replies) == 8 and model.generate_calls == 2  # two full batches of 4
    alone = TransformersModel(tiny, batch_wait=0)
    assert [r.text for r in replies] == [alone_reply.text for alone_reply in complete_all(alone, 8, max_tokens=3)]

    async def mixed():  # other settings are another batch
        return await asyncio.gather(model.complete(ASK, max_tokens=3), model.complete(ASK, max_tokens=4))
    before = model.generate_calls
    asyncio.run(mixed())
    assert model.generate_calls == before + 2


def test_calls_arriving_one_by_one_while_the_worker_is_busy_wait_there_as_one_batch(tiny):
    """Sealed at its timer, each late call used to be a batch of its own behind the one running."""
    model = TransformersModel(tiny, batch_wait=0.005)
    run = model._run

    def slow(prompts, settings):  # the first batch holds the worker while the others arrive
        if model.generate_calls == 0:
            time.sleep(0.5)
        return run(prompts, settings)

    model._run = slow

    async def staggered():
        first = asyncio.ensure_future(model.complete(ASK, max_tokens=3))
        later = []
        for _ in range(5):
            await asyncio.sleep(0.05)  # ten times the batch wait: each would have gone alone
            later.append(asyncio.ensure_future(model.complete(ASK, max_tokens=3)))
        return await asyncio.gather(first, *later)

    model.load()
    replies = asyncio.run(staggered())
    assert len(replies) == 6 and model.generate_calls == 2


class Echo(Agent):
    def __init__(self, model: TransformersModel) -> None:
        self.model = model
        self.prompt = Parameter("Answer.")

    async def forward(self, x: str) -> str:
        reply = await self.model.complete([{"role": "system", "content": self.prompt.value},
                                           {"role": "user", "content": x}], max_tokens=3)
        return reply.text


def test_an_evaluation_at_concurrency_batches_its_calls_and_counts_usage(tiny):
    model = TransformersModel(tiny, batch_wait=0.2)
    data = [{"x": f"the cat {i}", "info": "mat"} for i in range(12)]
    result = evaluate(Echo(model), ExactMatchGuide(), data, concurrency=12)
    assert len(result.rollouts) == 12 and all(not r.failed for r in result.rollouts)
    assert model.generate_calls <= 3 and model.usage.calls == 12 and model.usage.completion_tokens > 0


def test_a_lora_adapter_runs_on_its_base(tiny, tmp_path):
    import transformers
    from peft import LoraConfig, get_peft_model

    base = transformers.AutoModelForCausalLM.from_pretrained(tiny)
    tuned = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    tuned.save_pretrained(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tiny)
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    on_top = TransformersModel(tmp_path / "adapter", batch_wait=0)  # the base is read from the adapter
    assert on_top.path == Path(tiny) and on_top.adapter == tmp_path / "adapter"
    [reply] = complete_all(on_top, 1, max_tokens=3)
    assert reply.usage.completion_tokens > 0
    from peft import PeftModel

    assert isinstance(on_top.load()[2], PeftModel)

    other = build_tiny_model(tmp_path / "other", ["completely different words here"] * 5)
    with pytest.raises(LLMError, match="trained on .* not on"):
        TransformersModel(other, adapter=tmp_path / "adapter").load()


def test_what_it_cannot_run_is_refused_with_the_reason(tiny, tmp_path):
    import shutil

    import transformers

    with pytest.raises(FileNotFoundError, match="no model at"):
        TransformersModel(tmp_path / "missing")
    no_template = tmp_path / "no-template"
    shutil.copytree(tiny, no_template)
    config = json.loads((no_template / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (no_template / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in no_template.glob("chat_template*"):
        extra.unlink()
    with pytest.raises(LLMError, match="no chat template"):
        TransformersModel(no_template).load()
    bert = tmp_path / "distilbert"  # an encoder: no causal language model head exists for it
    transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=50, dim=8, n_layers=1, n_heads=2,
                                                               hidden_dim=8)).save_pretrained(bert)
    shutil.copy(tiny / "tokenizer.json", bert / "tokenizer.json")
    shutil.copy(tiny / "tokenizer_config.json", bert / "tokenizer_config.json")
    with pytest.raises(LLMError, match="not a causal language model"):
        TransformersModel(bert).load()
    with pytest.raises(LLMRequestError, match="does not call tools"):
        asyncio.run(TransformersModel(tiny).complete(ASK, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}]))
    with pytest.raises(ValueError, match="max_batch_size"):
        TransformersModel(tiny, max_batch_size=0)


@pytest.mark.local_model
def test_the_embedded_model_converted_once_answers_like_the_gguf_one(tmp_path):
    from opto.datasets import bigbench
    from opto.llm.transformers_model import embedded_model_folder

    folder = embedded_model_folder(tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".converting-")]
    started = os.stat(folder / "model.safetensors").st_mtime_ns
    assert embedded_model_folder(tmp_path) == folder  # reused, not converted again
    assert os.stat(folder / "model.safetensors").st_mtime_ns == started
    demos = [turn for e in bigbench("plural", split="train", n=4, seed=0)
             for turn in ({"role": "user", "content": e.x}, {"role": "assistant", "content": e.info[0]
                                                             if isinstance(e.info, list) else e.info})]
    model = TransformersModel(folder, batch_wait=0)
    reply = asyncio.run(model.complete([{"role": "system", "content": "Answer the question."}, *demos,
                                        {"role": "user", "content": "This is a blade"}], max_tokens=8, stop=["\n"]))
    assert reply.text.strip() == "blades"


@pytest.mark.local_model
def test_the_embedded_model_is_a_base_the_cli_fine_tunes(tmp_path, capsys, embedded_hf_model):
    """`opto finetune submit sft.jsonl --backend trl --method sft --model embedded`: the
    embedded SmolLM2 trained one step with LoRA, and the adapter runs in opto. `embedded`
    is the folder converted once for the run in $OPTO_CACHE_DIR (conftest.py); the
    conversion itself is the test above's."""
    from opto.cli import main

    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "system", "content": "Answer the question."},
                                                       {"role": "user", "content": f"This is a {w}"},
                                                       {"role": "assistant", "content": f"{w}s"}]})
                              for w in ("blade", "gang", "town", "cat")) + "\n")
    code = main(["finetune", "submit", str(data), "--backend", "trl", "--method", "sft", "--model", "embedded",
                 "--output-dir", str(tmp_path / "jobs"), "--max-steps", "1", "--lora", "--poll-interval", "0.5",
                 "--hyperparameter", "per_device_train_batch_size=2", "--wait"])
    printed = capsys.readouterr().out
    assert code == 0 and "succeeded" in printed, printed
    assert "SmolLM2" in printed and str(embedded_hf_model) in printed  # the base: the converted embedded folder
    adapter = Path(printed.split("fine-tuned model: ", 1)[1].split()[0])
    model = TransformersModel(adapter, batch_wait=0)
    assert model.path.name.startswith("SmolLM2") and model.adapter == adapter
    reply = asyncio.run(model.complete([{"role": "user", "content": "This is a dog"}], max_tokens=4))
    assert reply.usage.completion_tokens > 0
