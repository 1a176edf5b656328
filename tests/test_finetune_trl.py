"""TRLAdapter: local DPO with TRL on a tiny random model built here (no downloads, CPU only).

Needs the `trl` extra (trl + torch), which the README's test setup installs; without it
these tests fail with a message saying so, rather than being skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest
from tiny_models import build_tiny_model
from world import make_run

from opto.cli import main
from opto.finetune import FineTuneError, TRLAdapter
from opto.preference import DatasetFormatError, export_run

pytestmark = pytest.mark.trl

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may come from the hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

try:
    import datasets
    import torch
    import transformers
    import trl  # noqa: F401
    from trl.data_utils import is_conversational, maybe_apply_chat_template
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(f"the TRL tests need the trl extra: pip install torch==2.13.0 'opto-agents[trl]' ({exc})") from exc

@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """TRL files exported from a real run with num_proposals=2, and a tiny model that knows their text."""
    folder = tmp_path_factory.mktemp("trl")
    make_run(folder / "run", examples=4)
    chat, plain = folder / "chat.jsonl", folder / "plain.jsonl"
    export_run(folder / "run", chat, source="all", format="trl-chat")
    records = [json.loads(line) for line in chat.read_text().splitlines()]
    texts = [m["content"] for r in records for m in [*r["prompt"], *r["chosen"], *r["rejected"]]]
    model = build_tiny_model(folder / "tiny-model", texts)
    # The plain format is rendered with the tiny model's own chat template.
    export_run(folder / "run", plain, source="agent", format="trl", tokenizer=model)
    return {"chat": chat, "plain": plain, "model": model, "folder": folder}


def test_trl_loads_the_conversational_export(exported: dict[str, Path]) -> None:
    dataset = datasets.load_dataset("json", data_files=str(exported["chat"]), split="train")
    lines = exported["chat"].read_text().splitlines()
    assert set(dataset.column_names) == {"prompt", "chosen", "rejected"} and len(dataset) == len(lines) >= 8
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported["model"])
    for example in dataset:
        assert is_conversational(example)
        rendered = maybe_apply_chat_template(example, tokenizer)
        assert rendered["prompt"].endswith("<|assistant|>\n")
        assert rendered["chosen"].endswith("<|end|>\n") and rendered["chosen"] != rendered["rejected"]


def test_dpo_trains_two_steps_on_cpu_and_saves_the_model(exported: dict[str, Path]) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=exported["folder"] / "jobs", max_steps=2,
                         per_device_train_batch_size=2, learning_rate=1e-3, max_length=1024)
    assert asyncio.run(adapter.is_healthy())
    ref = asyncio.run(adapter.submit(exported["chat"]))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=0.2, timeout=240))
    assert final.status == "succeeded", final.message
    assert final.progress == 1.0 and final.fine_tuned_model
    tuned = Path(final.fine_tuned_model)
    assert (tuned / "config.json").is_file() and (tuned / "tokenizer_config.json").is_file()
    before = transformers.AutoModelForCausalLM.from_pretrained(exported["model"])
    after = transformers.AutoModelForCausalLM.from_pretrained(tuned)
    changed = [name for name, p in after.state_dict().items() if not torch.equal(p, before.state_dict()[name])]
    assert changed, "two DPO steps with lr 1e-3 should move the weights"
    assert _runs_in_opto(tuned)  # the trained folder is a model opto runs
    # The job's state is on disk, readable by another adapter (another process).
    other = TRLAdapter(exported["model"], output_dir=exported["folder"] / "jobs")
    assert asyncio.run(other.status(ref.job_id)).status == "succeeded"


def test_the_plain_export_is_rendered_with_the_models_chat_template(exported: dict[str, Path]) -> None:
    rows = [json.loads(line) for line in exported["plain"].read_text().splitlines()]
    assert rows and all(r["prompt"].startswith("<|") and r["prompt"].endswith("<|assistant|>\n") for r in rows)
    assert not any("Assistant:" in r["prompt"] for r in rows)  # no home-made template


def test_the_plain_export_trains_two_steps_too(exported: dict[str, Path]) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=exported["folder"] / "jobs-plain", max_steps=2,
                         per_device_train_batch_size=2, learning_rate=1e-3)
    ref = asyncio.run(adapter.submit(exported["plain"]))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=0.2, timeout=240))
    assert final.status == "succeeded", final.message
    assert (Path(final.fine_tuned_model) / "config.json").is_file()


def test_a_job_cancelled_before_it_starts_training_ends_cancelled(exported: dict[str, Path], tmp_path: Path) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path, max_steps=50, per_device_train_batch_size=1)
    ref = asyncio.run(adapter.submit(exported["plain"]))
    asyncio.run(adapter.cancel(ref))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=0.2, timeout=240))
    assert final.status == "cancelled" and final.fine_tuned_model is None


def test_bad_input_is_refused_before_training(exported: dict[str, Path], tmp_path: Path) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "user", "content": "x"}], "chosen": [], "rejected": []}) + "\n")
    with pytest.raises(DatasetFormatError, match="bad.jsonl:1"):
        asyncio.run(adapter.submit(bad))
    with pytest.raises(FineTuneError, match="no TRL job"):
        asyncio.run(adapter.status("trl-nope"))


def test_cli_trl_submit(exported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["finetune", "submit", str(exported["chat"]), "--backend", "trl", "--model", str(exported["model"]),
                 "--output-dir", str(tmp_path), "--max-steps", "1", "--poll-interval", "0.2",
                 "--hyperparameter", "max_length=512", "--wait"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "succeeded" in printed and f"fine-tuned model: {tmp_path}" in printed


def test_submit_returns_at_once_and_a_lora_run_saves_an_adapter(exported: dict[str, Path], tmp_path: Path) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path, max_steps=2, per_device_train_batch_size=2,
                         learning_rate=1e-3, lora={"r": 4, "lora_alpha": 8})
    ref = asyncio.run(adapter.submit(exported["chat"]))
    assert asyncio.run(adapter.status(ref)).status in ("pending", "running")  # training is in another process
    final = asyncio.run(TRLAdapter(exported["model"], output_dir=tmp_path).wait_until_complete(
        ref, poll_interval=0.2, timeout=240))
    assert final.status == "succeeded", final.message
    tuned = Path(final.fine_tuned_model)
    config = json.loads((tuned / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert any(p.name.startswith("adapter_model") for p in tuned.iterdir())
    from peft import PeftModel

    base = transformers.AutoModelForCausalLM.from_pretrained(exported["model"])
    assert isinstance(PeftModel.from_pretrained(base, tuned), PeftModel)
    assert _runs_in_opto(tuned)  # the adapter, on the base its config names


def _runs_in_opto(folder: Path) -> bool:
    """`TransformersModel` loads what TRL wrote and answers a chat message with it."""
    from opto.llm import TransformersModel

    model = TransformersModel(folder, batch_wait=0)
    reply = asyncio.run(model.complete([{"role": "user", "content": "Count the items"}], max_tokens=4))
    return reply.usage.completion_tokens > 0 and model.usage.calls == 1


def test_sft_on_the_supervised_export_trains_and_runs_in_opto(exported: dict[str, Path], tmp_path: Path,
                                                              capsys) -> None:
    """`opto export --format openai-sft` -> `opto finetune submit --backend trl --method sft` -> the model runs."""
    sft = tmp_path / "sft.jsonl"
    assert main(["export", str(exported["folder"] / "run"), "--source", "all", "--format", "openai-sft",
                 "--out", str(sft)]) == 0
    records = [json.loads(line) for line in sft.read_text().splitlines()]
    assert records and all(r["messages"][-1]["role"] == "assistant" for r in records)
    capsys.readouterr()
    code = main(["finetune", "submit", str(sft), "--backend", "trl", "--method", "sft", "--model",
                 str(exported["model"]), "--output-dir", str(tmp_path / "jobs"), "--max-steps", "2",
                 "--poll-interval", "0.2", "--hyperparameter", "learning_rate=1e-3", "--wait"])
    printed = capsys.readouterr().out
    assert code == 0 and "succeeded" in printed, printed
    tuned = Path(printed.split("fine-tuned model: ", 1)[1].split()[0])
    before = transformers.AutoModelForCausalLM.from_pretrained(exported["model"])
    after = transformers.AutoModelForCausalLM.from_pretrained(tuned)
    assert any(not torch.equal(p, before.state_dict()[name]) for name, p in after.state_dict().items())
    assert _runs_in_opto(tuned)
    with pytest.raises(DatasetFormatError):  # a preference file is not supervised data
        asyncio.run(TRLAdapter(exported["model"], output_dir=tmp_path / "bad", method="sft").submit(exported["chat"]))
    with pytest.raises(ValueError, match="'dpo', 'sft' or 'grpo'"):
        TRLAdapter(exported["model"], output_dir=tmp_path, method="ppo")


def test_cancel_from_another_adapter_stops_a_running_job(exported: dict[str, Path], tmp_path: Path) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path, max_steps=100000, per_device_train_batch_size=1)
    ref = asyncio.run(adapter.submit(exported["chat"]))
    other = TRLAdapter(exported["model"], output_dir=tmp_path, cancel_grace=60)  # as another process would
    deadline = time.monotonic() + 120
    while "step" not in asyncio.run(other.status(ref)).message and time.monotonic() < deadline:
        time.sleep(0.2)
    assert asyncio.run(other.cancel(ref)).status == "cancelled"
    adapter.join(ref, timeout=60)
    assert adapter._processes[ref.job_id].returncode == 0  # it stopped on its own, after a step


def test_a_killed_worker_is_reported_failed_with_its_log(exported: dict[str, Path], tmp_path: Path) -> None:
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path, max_steps=100000, per_device_train_batch_size=1)
    ref = asyncio.run(adapter.submit(exported["chat"]))
    process = adapter._processes[ref.job_id]
    while "training" not in asyncio.run(adapter.status(ref)).message and "step" not in asyncio.run(
            adapter.status(ref)).message:
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    final = asyncio.run(TRLAdapter(exported["model"], output_dir=tmp_path).status(ref))
    assert final.status == "failed" and "ended without a result" in final.error


def test_cli_trl_submit_returns_and_status_and_wait_work_from_a_new_command(
        exported: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--backend", "trl", "--output-dir", str(tmp_path)]
    assert main(["finetune", "submit", str(exported["chat"]), "--model", str(exported["model"]), *base,
                 "--max-steps", "1", "--lora"]) == 0
    printed = capsys.readouterr().out
    job_id = printed.split("submitted job ", 1)[1].split()[0]
    assert f"job folder: {tmp_path / job_id}" in printed and "succeeded" not in printed  # it did not wait
    assert main(["finetune", "wait", job_id, *base, "--poll-interval", "0.2", "--timeout", "240"]) == 0
    assert main(["finetune", "status", job_id, *base]) == 0
    assert "succeeded" in capsys.readouterr().out
    assert (tmp_path / job_id / "model" / "adapter_config.json").is_file()


# ------------------------------------------------------------------------------ GRPO on groups

PROMPT = [{"role": "system", "content": "Count the items."}, {"role": "user", "content": "Count: apple apple"}]


def art_group(replies: dict[str, float]) -> dict:
    return {"trajectories": [{"messages_and_choices": [*PROMPT, {"finish_reason": "stop", "index": 0, "logprobs": None,
                                                                 "message": {"role": "assistant", "content": text}}],
                              "reward": reward, "metadata": {"example_id": "apples"}}
                             for text, reward in replies.items()]}


def reply_logprob(model, tokenizer, text: str) -> float:
    """log p(text | PROMPT) under the chat template, computed here on its own."""
    prompt = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*PROMPT, {"role": "assistant", "content": text}], tokenize=False)
    ids = tokenizer(full, add_special_tokens=False, return_tensors="pt").input_ids
    start = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids.shape[1]
    with torch.no_grad():
        logits = model(ids).logits[0, start - 1:-1].log_softmax(-1)
    return float(logits.gather(1, ids[0, start:].unsqueeze(1)).sum())


@pytest.mark.parametrize("lora", [False, True], ids=["all-weights", "lora"])
def test_grpo_on_groups_moves_probability_toward_the_higher_reward_reply(exported, tmp_path, lora):
    groups = tmp_path / "groups.jsonl"
    # the second group has equal rewards: it teaches nothing and is dropped
    groups.write_text(json.dumps(art_group({"2": 1.0, "two apples": 0.0})) + "\n"
                      + json.dumps(art_group({"3": 0.5, "three": 0.5})) + "\n")
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path / "jobs", method="grpo", max_steps=3,
                         learning_rate=3e-2 if lora else 1e-2, beta=0.01, lora=lora or None)
    ref = asyncio.run(adapter.submit(groups))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=0.2, timeout=240))
    assert final.status == "succeeded", final.message
    assert ref.method == "grpo" and final.progress == 1.0
    log = (Path(final.fine_tuned_model).parent / "train.log").read_text()
    assert "grpo step 3/3" in log and "training on 2 replies (1 groups dropped: equal rewards)" in log
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported["model"])
    before = transformers.AutoModelForCausalLM.from_pretrained(exported["model"])
    if lora:
        from peft import PeftModel

        after = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(exported["model"]),
                                          final.fine_tuned_model)
    else:
        after = transformers.AutoModelForCausalLM.from_pretrained(final.fine_tuned_model)
    margin_before = reply_logprob(before, tokenizer, "2") - reply_logprob(before, tokenizer, "two apples")
    margin_after = reply_logprob(after, tokenizer, "2") - reply_logprob(after, tokenizer, "two apples")
    assert margin_after > margin_before + 0.1, (margin_before, margin_after)


def test_grpo_steps_are_minibatches_of_replies_over_the_epochs(exported, tmp_path):
    """Each step takes `per_device_train_batch_size` replies (one graph for every reply at
    once held tens of GB for a few hundred replies); epochs count passes over them."""
    groups = tmp_path / "groups.jsonl"
    groups.write_text("".join(json.dumps(art_group({str(n): 1.0, f"{n} apples": 0.0})) + "\n" for n in (2, 3, 4)))
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path / "jobs", method="grpo", num_train_epochs=2,
                         per_device_train_batch_size=4, learning_rate=1e-3)
    final = asyncio.run(adapter.wait_until_complete(asyncio.run(adapter.submit(groups)), poll_interval=0.2,
                                                    timeout=240))
    assert final.status == "succeeded", final.message
    log = (Path(final.fine_tuned_model).parent / "train.log").read_text()
    assert "training on 6 replies" in log and "grpo step 4/4" in log and "grpo step 5/" not in log


def test_grpo_refuses_a_file_that_is_not_groups_and_groups_that_cannot_teach(exported, tmp_path):
    adapter = TRLAdapter(exported["model"], output_dir=tmp_path / "jobs", method="grpo", max_steps=1)
    with pytest.raises(ValueError, match="not a valid art record"):
        asyncio.run(adapter.submit(exported["chat"]))
    flat = tmp_path / "flat.jsonl"
    flat.write_text(json.dumps(art_group({"2": 1.0, "two": 1.0})) + "\n")
    final = asyncio.run(adapter.wait_until_complete(asyncio.run(adapter.submit(flat)), poll_interval=0.2,
                                                    timeout=240))
    assert final.status == "failed" and "has rewards that vary (1 dropped)" in final.error
    with pytest.raises(ValueError, match="method must be 'dpo', 'sft' or 'grpo'"):
        TRLAdapter(exported["model"], output_dir=tmp_path, method="ppo")


def test_grpo_scores_a_minibatch_of_replies_in_one_pass_as_each_alone(exported):
    """The padded batch gives every reply the log-probabilities it has on its own: the
    padding is after each reply and masked, so no reply sees another's tokens."""
    from opto.finetune.grpo import ScoredReply, batch_logprobs

    tokenizer = transformers.AutoTokenizer.from_pretrained(exported["model"])
    model = transformers.AutoModelForCausalLM.from_pretrained(exported["model"]).eval()
    texts = ("2", "two apples, and then some more", "three")
    with torch.no_grad():
        together = batch_logprobs(model, tokenizer, [ScoredReply(PROMPT, text, 1.0) for text in texts])
    assert len({t.numel() for t in together}) == 3  # different lengths: two of them padded
    for batched, text in zip(together, texts):
        assert abs(float(batched.sum()) - reply_logprob(model, tokenizer, text)) < 1e-3
