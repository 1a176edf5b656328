"""Prompts, then weights (`opto.recipes.prompts_then_weights`): every stage of the chain on a scripted base model
and a tiny Hugging Face model fine-tuned with TRL, its metrics, its report, and resuming it
in the middle of fine-tuning without training twice."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from opto import RunDirError, ScriptedModel
from opto.cli import main
from opto.datasets import bigbench
from opto.finetune import TRLAdapter
from opto.run.ledger import RunDir
from opto.run.switches import recorded_switches
from opto.llm.sampling import current_sampling
from opto.preference import validate_jsonl
from opto.report.markdown import write_report
from opto.report.html import write_html_report
from opto.recipes import prompts_then_weights as recipe
from opto.recipes.prompts_then_weights import prompts_then_weights

pytestmark = pytest.mark.trl
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tiny model learns nothing in one step, so the chains go on with every stage they
# train (keep="last"); the check that keeps the better model has a test of its own.
SMALL = {"train_n": 4, "validation_n": 4, "test_n": 6, "collect_n": 6, "samples": 2, "progress": False,
         "keep": "last", "weights_validation_n": 4, "finetune": {"max_steps": 1, "per_device_train_batch_size": 2}}


def base_reply(messages: list[dict]) -> str:
    """The agent's model knows plurals only from demos (shown as earlier turns); with none
    it writes a sentence. A collected sample with an odd seed is wrong, so DPO finds pairs
    and GRPO groups with rewards that differ. As optimizer and aggregator it keeps the
    prompt as it is."""
    if messages[0]["content"].startswith("Answer"):
        word = messages[-1]["content"].rsplit(" ", 1)[-1]
        drawn = current_sampling()
        if drawn is not None and drawn.seed is not None and drawn.seed % 2:
            return f"{word}es"
        answer = f"{word}ed" if messages[-1]["content"].startswith("Today I") else f"{word}s"
        return answer if len(messages) > 2 else f"The answer is {answer}."
    return json.dumps({"reasoning": "keep it", "suggestion": {}})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    words = [e.x for e in bigbench("plural", n=40)] + ["Answer the question.", "blades"]
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "base", words)


def run_chain(folder: Path, tiny: Path, method: str = "sft", **kwargs: object):
    settings = {**SMALL, **kwargs}
    return prompts_then_weights(ScriptedModel(base_reply, name="base"), run_dir=folder, method=method,
                                base_folder=tiny, **settings)


def test_the_chain_measures_every_stage_and_the_tuned_model_is_asked_zero_shot(tmp_path: Path, tiny: Path) -> None:
    report = run_chain(tmp_path / "run", tiny)
    assert [s.stage for s in report.stages] == ["zero-shot", "prompt", "sft", "prompt-again"]
    zero, prompt, sft, again = report.stages
    assert zero.test_accuracy == 0.0 and prompt.test_accuracy > 0.5  # the demos teach the scripted model
    assert prompt.parameters["demos"] and sft.parameters["demos"] == []  # distilled: no demos in the prompt
    # Token counts: the scripted model estimates, the tiny model's tokenizer counts; the
    # real-model test compares the two stages (tests/test_weights_real.py).
    assert sft.prompt_tokens_per_call > 0 and again.prompt_tokens_per_call >= sft.prompt_tokens_per_call
    assert sft.model.endswith("/model") and again.model == sft.model
    assert sft.train_records == 6 and sft.calls == 6 * 2 + 2 * 4 + 6  # collected samples, the two validated, the test
    lo, hi = again.test_interval
    assert lo <= again.test_accuracy <= hi and all(s.seconds > 0 for s in report.stages)
    assert report.chain_change is not None and report.chain_change_interval is not None
    # The data: the zero-shot form of each example with the optimized agent's correct reply.
    data = tmp_path / "run" / "data" / "sft.jsonl"
    assert validate_jsonl(data, "openai-sft") == 6
    first = json.loads(data.read_text().splitlines()[0])["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[2]["content"] == first[1]["content"].rsplit(" ", 1)[-1] + "s"
    # The metrics: a line per stage with its figures; the switch recorded; the report's bars.
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["stage"]) for m in lines] == list(enumerate(["zero-shot", "prompt", "sft", "prompt-again"]))
    assert {"test_accuracy", "test_interval", "prompt_tokens_per_call", "calls", "seconds"} <= set(lines[0])
    assert recorded_switches(tmp_path / "run")[0].kind == "local"
    summary = write_report(tmp_path / "run")
    assert summary.stages == ["zero-shot", "prompt", "sft", "prompt-again"]
    assert "| sft | " in Path(summary.markdown).read_text() and Path(summary.png).stat().st_size > 10_000
    page = Path(write_html_report(tmp_path / "run").html).read_text()  # the same stages, as one page
    assert re.findall(r"<tr><td>([\w-]+)</td>", page) == ["zero-shot", "prompt", "sft", "prompt-again"]
    assert page.count('src="data:image/png;base64,') == 1


@pytest.mark.parametrize("method, fmt", [("dpo", "trl-chat"), ("grpo", "art")])
def test_dpo_pairs_and_grpo_groups_come_from_the_collected_answers(tmp_path: Path, tiny: Path, method: str,
                                                                   fmt: str, caplog) -> None:
    report = run_chain(tmp_path / "run", tiny, method=method, again=False)
    assert f"Chain it after SFT instead: method='sft,{method}'" in caplog.text  # from the base model: warned
    assert [s.stage for s in report.stages] == ["zero-shot", "prompt", method]
    data = tmp_path / "run" / "data" / f"{method}.jsonl"
    assert validate_jsonl(data, fmt) == report.stages[-1].train_records == 6
    record = json.loads(data.read_text().splitlines()[0])
    if method == "dpo":  # the right answer over what the untuned model says zero-shot: a sentence
        assert len(record["prompt"]) == 2 and record["chosen"][0]["content"].endswith("s")
        assert record["rejected"][0]["content"].startswith("The answer is ")
        own = json.loads((tmp_path / "run" / "data" / "own-replies-dpo.json").read_text())
        assert len(own) == 6 and all(score == 0.0 for _, score in own.values())
    else:
        assert sorted(t["reward"] for t in record["trajectories"]) == [0.0, 1.0]


@pytest.mark.parametrize("second", ["dpo", "grpo"])
def test_a_chain_starts_each_stage_from_the_model_the_stage_before_tuned(tmp_path: Path, tiny: Path, second: str,
                                                                        capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    if second == "grpo":  # the GRPO chain is stopped while its second job trains, and resumed there
        waited, calls = TRLAdapter.wait_until_complete, []

        async def crash_second(self, ref, **kwargs):
            calls.append(ref)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return await waited(self, ref, **kwargs)

        monkeypatch.setattr(TRLAdapter, "wait_until_complete", crash_second)
        with pytest.raises(KeyboardInterrupt):
            run_chain(run, tiny, method="sft,grpo", again=False)
        assert [json.loads(line)["stage"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [
            "zero-shot", "prompt", "sft"]
        sampled = (run / "collect-grpo" / "ledger.jsonl").read_text()
        monkeypatch.setattr(TRLAdapter, "wait_until_complete", waited)
        report = run_chain(run, tiny, method="sft,grpo", again=False, resume=True)
        assert len(list((run / "finetune").iterdir())) == 2  # the GRPO job was waited for, not submitted again
        assert (run / "collect-grpo" / "ledger.jsonl").read_text() == sampled  # nor its samples drawn again
    else:
        report = run_chain(run, tiny, method=f"sft,{second}", again=False)
    assert report.method == f"sft,{second}"
    assert [s.stage for s in report.stages] == ["zero-shot", "prompt", "sft", second]
    sft_switch, second_switch = recorded_switches(run)
    assert [sft_switch.job_id, second_switch.job_id] == [
        json.loads((run / f"finetune-{m}.json").read_text())["job_id"] for m in ("sft", second)]
    merged = run / "merged-sft"
    assert (merged / "config.json").is_file() and (merged / "tokenizer_config.json").is_file()
    # The second stage trained the merged SFT model (its reference too), not the base.
    jobs = {json.loads((job / "settings.json").read_text())["method"]: json.loads((job / "settings.json").read_text())
            for job in (run / "finetune").iterdir()}
    assert jobs["sft"]["model_path"] == str(tiny) and jobs[second]["model_path"] == str(merged)
    adapter = json.loads((Path(second_switch.target) / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(merged)
    assert Path(sft_switch.target).parent.parent == run / "finetune"
    if second == "grpo":
        assert jobs["grpo"]["settings"]["beta"] > 0  # a KL term keeps it near the SFT model
    else:  # the preference loss plus the chosen replies' likelihood
        assert jobs["dpo"]["settings"]["loss_type"] == ["sigmoid", "sft"]
    # On-policy: the second stage learns from what the SFT model itself samples, zero-shot.
    sft_stage, second_stage = report.stages[2:]
    samples = [r for r in RunDir(run / f"collect-{second}").ledger() if r.get("type") == "rollout"]
    assert len(samples) == 6 * 2 and all(r["trace"][0]["model"] == sft_stage.model for r in samples)
    assert all(len(r["trace"][0]["messages"]) == 2 for r in samples)  # system prompt and question, no demos
    assert all(r["trace"][0]["logprobs"] for r in samples)  # so `opto export --format art` groups are on-policy
    sampled = {str(r["output"]) for r in samples}
    golds = {e.x: e.info[0] for e in bigbench("plural", split="train", n=6)}
    for line in (run / "data" / f"{second}.jsonl").read_text().splitlines():
        record = json.loads(line)
        question = (record.get("prompt") or record["trajectories"][0]["messages_and_choices"])[1]["content"]
        if second == "dpo":  # a correct sample, or the expected answer, over a wrong sample
            assert record["rejected"][0]["content"] in sampled
            assert record["chosen"][0]["content"] in sampled | {golds[question]}
        else:  # the samples with their rewards, and the expected answer where none was right
            replies = {t["messages_and_choices"][-1]["message"]["content"] for t in record["trajectories"]}
            assert replies <= sampled | {golds[question]}
    assert second_stage.kept and second_stage.compared_with == "sft" and second_stage.validation_change is not None
    assert report.kept == second and (run / "data" / "validation-sft.json").is_file()
    assert main(["report", str(run)]) == 0 and f"stages: zero-shot, prompt, sft, {second}" in capsys.readouterr().out
    # Resumed after the end: nothing runs again, the same stages are reported.
    again = run_chain(run, tiny, method=f"sft,{second}", again=False, resume=True)
    assert [s.test_accuracy for s in again.stages] == [s.test_accuracy for s in report.stages]
    assert len(list((run / "finetune").iterdir())) == 2


def test_a_stage_less_accurate_on_validation_is_reported_and_the_chain_goes_on_without_it(
    tmp_path: Path, tiny: Path, monkeypatch, caplog
) -> None:
    run = tmp_path / "run"
    validated = recipe._Chain._validate

    async def sft_best(self, stage, agent):  # the agent really answers; SFT is made right on every example
        scores = await validated(self, stage, agent)
        return [1.0 if stage == "sft" else 0.0] * len(scores)

    monkeypatch.setattr(recipe._Chain, "_validate", sft_best)
    report = run_chain(run, tiny, method="sft,dpo", keep="unless-worse", weights_validation_n=5)
    assert [s.stage for s in report.stages] == ["zero-shot", "prompt", "sft", "dpo", "prompt-again"]
    prompt, sft, dpo, again = report.stages[1:]
    assert sft.kept and sft.compared_with == "prompt"
    assert dpo.kept is False and dpo.compared_with == "sft" and dpo.validation_change == -1.0
    assert dpo.validation_interval is not None and dpo.validation_interval[1] <= 0
    assert report.kept == "sft" and "the chain goes on with sft" in caplog.text
    # Only SFT's model was switched to, and the prompt stage after it ran on that model.
    assert [s.job_id for s in recorded_switches(run)] == [json.loads((run / "finetune-sft.json").read_text())["job_id"]]
    assert again.model == sft.model != dpo.model
    # The report says which stage was kept and why; --json carries the same.
    markdown = Path(write_report(run).markdown).read_text()
    assert "| dpo | " in markdown and "| no (-100.0 points vs sft on validation) |" in markdown
    assert "| yes (" in markdown.split("| sft | ")[1].splitlines()[0]


def test_on_policy_records_pair_right_over_wrong_and_fall_back_to_the_expected_answer() -> None:
    replies = [("cats", 1.0), ("cat", 0.0), ("cats", 1.0), ("catz", 0.0)]
    assert recipe._on_policy_records("dpo", replies, "cats") == [
        {"chosen": "cats", "rejected": "cat"},
        {"chosen": "cats", "rejected": "catz"},
    ]
    none_right = [("cat", 0.0), ("cat", 0.0)]
    assert recipe._on_policy_records("dpo", none_right, "cats") == [{"chosen": "cats", "rejected": "cat"}]
    assert recipe._on_policy_records("dpo", none_right, None) == []  # gold=False: nothing to prefer
    assert recipe._on_policy_records("dpo", [("cats", 1.0)] * 2, "cats") == []  # always right: nothing to learn
    assert recipe._on_policy_records("grpo", none_right, "cats") == [{"group": [*none_right, ("cats", 1.0)]}]
    assert recipe._on_policy_records("grpo", replies, "cats") == [{"group": replies}]
    assert recipe._on_policy_records("sft", replies, "cats") == [{"completion": "cats"}]


def test_a_chain_stopped_while_fine_tuning_resumes_there_without_training_twice(tmp_path: Path, tiny: Path,
                                                                               monkeypatch) -> None:
    waited = TRLAdapter.wait_until_complete

    async def crash(self, ref, **kwargs):
        raise KeyboardInterrupt  # the process stops while the job trains

    monkeypatch.setattr(TRLAdapter, "wait_until_complete", crash)
    with pytest.raises(KeyboardInterrupt):
        run_chain(tmp_path / "run", tiny)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["stage"] for line in lines] == ["zero-shot", "prompt"]
    with pytest.raises(RunDirError, match="already holds a prompts-then-weights run"):
        run_chain(tmp_path / "run", tiny)
    with pytest.raises(RunDirError, match="started with collect_n=6"):
        run_chain(tmp_path / "run", tiny, collect_n=8, resume=True)

    monkeypatch.setattr(TRLAdapter, "wait_until_complete", waited)
    model = ScriptedModel(base_reply, name="base")
    report = prompts_then_weights(model, run_dir=tmp_path / "run", method="sft", base_folder=tiny, resume=True, **SMALL)
    assert [s.stage for s in report.stages] == ["zero-shot", "prompt", "sft", "prompt-again"]
    assert len(list((tmp_path / "run" / "finetune").iterdir())) == 1  # the job was waited for, not submitted again
    # No stage before sft ran again, nothing was collected again: the base model answered only
    # the validation examples that SFT's model is checked against, and optimized prompt-again.
    answered = {r["messages"][-1]["content"] for r in model.requests if r["messages"][0]["content"].startswith("Answer")}
    assert answered == {e.x for e in bigbench("plural", split="validation", n=8)[4:]}
    assert any(not r["messages"][0]["content"].startswith("Answer") for r in model.requests)



def test_bad_settings_are_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    for method in ("ppo", "sft,sft", "sft,ppo", ""):
        with pytest.raises(ValueError, match="method must be one of sft, dpo, grpo or a chain of them"):
            prompts_then_weights(ScriptedModel(base_reply), run_dir=tmp_path / "run", method=method)
    with pytest.raises(ValueError, match='keep must be "unless-worse" or "last", got \'best\''):
        prompts_then_weights(ScriptedModel(base_reply), run_dir=tmp_path / "run", keep="best")
    with pytest.raises(SystemExit):
        main(["demo", "--finetune", "sft,sft", "--run-dir", str(tmp_path / "run")])
    assert "'sft,sft': use sft, dpo or grpo, or a chain such as sft,dpo" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="does not take --model or --base-url"):
        main(["demo", "--finetune", "sft", "--model", "gpt-4o-mini", "--run-dir", str(tmp_path / "run")])
    assert main(["demo", "--resume", "--run-dir", str(tmp_path / "run")]) == 1
    assert "holds no demo run to resume (no checkpoint.json); leave out --resume" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    # A chain with no finished stage yet still has a report: empty, and saying so.
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "pipeline.json").write_text("{}")
    assert main(["report", str(tmp_path / "new")]) == 0
    assert "stages: none finished yet" in capsys.readouterr().out
    assert "(no stage finished yet)" in (tmp_path / "new" / "report.md").read_text()
