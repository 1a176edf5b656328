"""Prompts, then weights: the demo agent's prompt optimized, distilled into the model, and optimized again.

`prompts_then_weights` (and `opto demo --finetune {sft,dpo,grpo}`, or a chain of them such
as `sft,dpo`) chains, in one run directory, on the embedded SmolLM2-135M-Instruct (or any
model with a Hugging Face folder):

1. **zero-shot**: the few-shot agent with no demos, measured on the test split;
2. **prompt**: its prompt and demos optimized as `opto demo` does (``RUN/prompt``);
3. **sft**, **dpo** or **grpo**: the optimized agent answers every training example
   `samples` times (`opto.collect`, ``RUN/collect``); its replies become training data
   *in the zero-shot form* (system prompt and question, no demos): the correct replies
   for SFT; for DPO a correct reply over what the model itself answers zero-shot (its
   own greedy reply when wrong, else a wrong sample); the judged groups for GRPO
   (``RUN/data``). `TRLAdapter` tunes a LoRA adapter on the base model's folder
   (``RUN/finetune``), `switch_model` points the agent at it (recorded in
   ``RUN/models.json``), and the tuned model is asked zero-shot: a distilled model costs
   a fraction of the prompt tokens per call;
4. **prompt-again** (unless `again=False`): the prompt and demos optimized once more, now
   with the tuned model answering (``RUN/prompt-again``).

A chain of weights stages (`method="sft,dpo"`) runs them in order, each on the model the
chain has: the stage before's LoRA adapter is merged into a full model
(``RUN/merged-<stage>``) that the next stage starts from and, for DPO and for GRPO with
`beta` > 0, stays near (the reference model). A later stage learns *on-policy*: that model
answers every training example `samples` times zero-shot (``RUN/collect-<stage>``); DPO
prefers a correct sample (or, with `gold`, the expected answer where none is correct) over
each distinct wrong one, with the chosen replies' likelihood in the loss; GRPO weights
the judged samples by their advantage.

Every weights stage is checked before the chain goes on with it: its model and the model
the chain had answer `weights_validation_n` validation examples, paired; with
`keep="unless-worse"` a stage whose model is worse there beyond doubt (the paired 95%
interval of the change below zero) is reported (`kept=False`, its `validation_change`) and
the chain goes on with the model it had. Beyond doubt, because 64 examples cannot tell a
few points apart: on plurals a GRPO stage 4.7 points behind SFT on validation was 9.4
points ahead on the test examples.

Each stage ends with its test accuracy, 95% interval, prompt tokens per test call, the
stage's model calls and seconds as one line of ``RUN/metrics.jsonl``. A stopped run
continues with `resume=True` from the stage it was in: a finished stage is not run
again, the prompt stages resume their own run directories, the collection skips the
examples it wrote, and a fine-tuning job that was running is waited for (its worker
outlives the process), or submitted again when its worker died with the machine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .._util.async_tools import run_sync
from .._util.files import append_jsonl, atomic_write_json, atomic_write_jsonl, read_jsonl
from ..core.data import Example
from ..core.guides import ExactMatchGuide
from ..core.stats import paired_change
from ..datasets import bigbench
from ..errors import OptoValueError, RunDirError
from ..finetune.base import FineTuneError, TrainingJobStatus
from ..finetune.switch import switch_model
from ..llm.base import Model
from ..llm.usage import UsageStats, meter_usage
from ..report.stages import SETTINGS_FILE
from ..run.ledger import RunDir, read_json_object
from ..run.switches import apply_recorded_switches, recorded_switches
from ..trainer.collection import acollect
from ..trainer.evaluation import aevaluate
from .demo import DEMO_TASK, FewShotAgent, demo_trainer

__all__ = [
    "METHODS",
    "STAGES",
    "StageResult",
    "WeightsReport",
    "aprompts_then_weights",
    "chain_of",
    "prompts_then_weights",
]

logger = logging.getLogger(__name__)

METHODS = ("sft", "dpo", "grpo")
STAGES = ("zero-shot", "prompt", "sft", "dpo", "grpo", "prompt-again")
Stage = Literal["zero-shot", "prompt", "sft", "dpo", "grpo", "prompt-again"]

#: What the fine-tuning stage trains with unless `finetune=` says otherwise (LoRA r 16 on
#: every linear layer, 2 epochs, batches of 16: about 3-5 CPU minutes for 256 examples).
FINETUNE_DEFAULTS: dict[str, Any] = {
    "lora": {"r": 16, "lora_alpha": 32},
    "learning_rate": 5e-4,
    "num_train_epochs": 2.0,
    "per_device_train_batch_size": 16,
    "max_length": 256,
}
_METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "sft": {},
    # The preference loss plus the chosen replies' likelihood (RPO): DPO alone also lowers
    # the chosen reply's probability, and a 135M model then forgets what SFT taught it.
    # Two half-batches per step: the same gradient as batches of 16 pairs, and the DPO
    # worker's peak 2.6 GB instead of 3.7 (32 sequences' 49k-token logits at once).
    "dpo": {
        "learning_rate": 1e-4,
        "beta": 0.1,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "config": {"loss_type": ["sigmoid", "sft"]},
    },
    "grpo": {"learning_rate": 1e-4, "beta": 0.04},  # a KL term: the tuned model stays near where it started
}
_SETTINGS = SETTINGS_FILE


def chain_of(method: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The weights stages of `method`: one of `METHODS`, or several, in order ("sft,dpo")."""
    methods = tuple(m.strip() for m in method.split(",")) if isinstance(method, str) else tuple(method)
    unknown = [m for m in methods if m not in METHODS]
    if not methods or unknown or len(set(methods)) != len(methods):
        raise OptoValueError(
            f"method must be one of {', '.join(METHODS)} or a chain of them without repeats (e.g. 'sft,dpo'), "
            f"got {method!r}"
        )
    return methods


class StageResult(BaseModel):
    """One stage's figures (a line of ``RUN/metrics.jsonl``)."""

    stage: Stage
    test_accuracy: float
    test_interval: tuple[float, float]
    prompt_tokens_per_call: float = Field(description="mean prompt tokens of the agent's calls on the test split")
    calls: int = Field(description="model calls of the whole stage: optimizing, collecting and testing")
    seconds: float
    model: str
    parameters: dict[str, Any] = Field(default_factory=dict, description="the agent's values when tested")
    train_records: int | None = Field(None, description="fine-tuning records the stage trained on")
    scores: list[float | None] = Field(default_factory=list, description="per test example, in test order")
    kept: bool | None = Field(
        None, description="a weights stage: whether the chain went on with its model (see `keep`)"
    )
    compared_with: str | None = Field(None, description="the stage whose model it was validated against")
    validation_change: float | None = Field(
        None, description="its validation accuracy minus that stage's, paired over the validation examples"
    )
    validation_interval: tuple[float, float] | None = None


class WeightsReport(BaseModel):
    """What `prompts_then_weights` did; `opto demo --finetune ... --json` prints it (without scores)."""

    task: str
    seed: int
    method: str = Field(description='the weights stages, in order ("sft" or a chain such as "sft,dpo")')
    run_dir: str
    stages: list[StageResult]
    # What the chain ended with (its last stage, unless a weights stage it did not keep)
    # against the prompt stage, paired over the test examples.
    chain_change: float | None = None
    chain_change_interval: tuple[float, float] | None = None
    kept: str | None = Field(None, description="the weights stage whose model the chain ended with (None: the base)")
    ended: str | None = Field(
        None, description="the stage the chain ended with: its last, unless that is a weights stage it did not keep"
    )
    seconds: float = 0.0

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)


def prompts_then_weights(model: Model | None = None, **kwargs: Any) -> WeightsReport:
    """Synchronous `aprompts_then_weights` (also inside a running event loop)."""
    return run_sync(aprompts_then_weights(model, **kwargs))


async def aprompts_then_weights(
    model: Model | None = None,
    *,
    run_dir: str | Path,
    method: str | list[str] = "sft",
    again: bool = True,
    task: str = DEMO_TASK,
    seed: int = 0,
    train_n: int = 12,
    validation_n: int = 24,
    test_n: int = 64,
    collect_n: int = 256,
    samples: int = 4,
    temperature: float = 0.7,
    gold: bool = True,
    keep: Literal["unless-worse", "last"] = "unless-worse",
    weights_validation_n: int = 64,
    base_folder: str | Path | None = None,
    finetune: Mapping[str, Any] | None = None,
    resume: bool = False,
    progress: bool = True,
) -> WeightsReport:
    """Optimize the demo agent's prompt, fine-tune its model on what the optimized agent
    answers, switch to the tuned model, optionally optimize the prompt again; measure each
    stage on the test split (see the module docstring).

    Args:
        model: the base model: the agent's, and the optimizer's in both prompt stages
            (default: the embedded SmolLM2 through llama.cpp).
        run_dir: the run directory of the whole chain.
        method: "sft", "dpo" or "grpo", or a chain of them in order ("sft,dpo", or a
            list): each stage fine-tunes the model the one before it tuned.
        again: optimize the prompt once more with the tuned model.
        task: the shipped BIG-bench task, as for `opto demo --task`.
        seed: the split and shuffle seed.
        train_n: training examples of the prompt stages.
        validation_n: validation examples of the prompt stages.
        test_n: held-out test examples every stage is measured on.
        collect_n: training examples the optimized agent answers for the training data.
        samples: answers per collected example (and per example a later stage of a chain
            draws from the model it starts from).
        temperature: their sampling temperature.
        gold: in a later stage of a chain, where none of the model's samples of an example
            is correct, learn the expected answer instead: DPO's chosen reply, a GRPO
            group's extra member with reward 1.
        keep: "unless-worse": a weights stage is validated against the model the chain
            had (on `weights_validation_n` validation examples, paired) and the chain goes
            on with it unless it is worse beyond doubt (the change's paired 95% interval
            below zero); "last": always with the newest.
        weights_validation_n: the validation examples of that check (after the
            `validation_n` the prompt stages validate on).
        base_folder: the Hugging Face folder of `model`'s weights, to fine-tune (default:
            the embedded model's, converted once, `embedded_model_folder()`).
        finetune: `TRLAdapter` settings over `FINETUNE_DEFAULTS` (e.g. `{"max_steps": 4}`).
        resume: continue the chain in `run_dir` (the same settings) from its stage.
    """
    methods = chain_of(method)
    if keep not in ("unless-worse", "last"):
        raise OptoValueError(f'keep must be "unless-worse" or "last", got {keep!r}')
    if methods[0] != "sft":
        logger.warning(
            "%s first trains the base model, which answers zero-shot with a sentence; on the embedded model "
            "that ended 60-70 points below the prompt stage. Chain it after SFT instead: method='sft,%s' "
            "(--finetune sft,%s)",
            methods[0],
            methods[0],
            methods[0],
        )
    started = time.monotonic()
    run = Path(run_dir)
    settings = {
        "method": ",".join(methods),
        "again": again,
        "task": task,
        "seed": seed,
        "train_n": train_n,
        "validation_n": validation_n,
        "test_n": test_n,
        "collect_n": collect_n,
        "samples": samples,
        "temperature": temperature,
        "gold": gold,
        "keep": keep,
        "weights_validation_n": weights_validation_n,
        "finetune": dict(finetune or {}),
    }
    done = _start(run, settings, resume)
    stages: list[Stage] = ["zero-shot", "prompt", *methods, *(["prompt-again"] if again else [])]  # type: ignore[list-item]
    owned = model is None
    if model is None:
        from ..llm.local import LocalModel

        model = LocalModel()
    chain = _Chain(run, model, settings, bigbench(task, split="test", n=test_n, seed=seed), base_folder, progress)
    try:
        for stage in stages:
            if stage in done:
                continue
            logger.info("stage %s", stage)
            stage_started = time.monotonic()
            with meter_usage() as meter:
                result = await chain.run(stage, done)
            result.calls = sum((s for s in meter.by_model.values()), UsageStats()).calls
            result.seconds = round(time.monotonic() - stage_started, 3)
            append_jsonl(run / "metrics.jsonl", [{"step": stages.index(stage), **result.model_dump(mode="json")}])
            done[stage] = result
    finally:
        if owned:
            await model.aclose()
    return _report(settings, run, [done[s] for s in stages], time.monotonic() - started)


class _Chain:
    """The stages, each given the results of the ones before it."""

    def __init__(
        self,
        run: Path,
        model: Model,
        settings: dict[str, Any],
        test: list[Example],
        base_folder: str | Path | None,
        progress: bool,
    ):
        self.folder, self.model, self.settings, self.test, self.progress = run, model, settings, test, progress
        self.base_folder = base_folder
        self.methods = chain_of(settings["method"])
        self.guide = ExactMatchGuide()

    async def run(self, stage: str, done: dict[str, StageResult]) -> StageResult:
        if stage == "zero-shot":
            return await self._measure("zero-shot", FewShotAgent(self.model))
        if stage == "prompt":
            agent = await self._optimize(FewShotAgent(self.model), self.folder / "prompt")
            return await self._measure("prompt", agent)
        if stage == "prompt-again":
            agent = self._kept_agent()
            agent.apply(done[self.methods[-1]].parameters)
            agent = await self._optimize(agent, self.folder / "prompt-again")
            return await self._measure("prompt-again", agent)
        return await self._finetune(stage, done)

    async def _optimize(self, agent: FewShotAgent, folder: Path) -> FewShotAgent:
        s = self.settings
        trainer = demo_trainer(agent, self.model, task=s["task"], validation_n=s["validation_n"], seed=s["seed"])
        await trainer.atrain(
            self.guide,
            bigbench(s["task"], split="train", n=s["train_n"], seed=s["seed"]),
            batch_size=4,
            run_dir=folder,
            resume=(folder / "checkpoint.json").exists(),
            seed=s["seed"],
            progress=self.progress,
        )
        return agent

    async def _finetune(self, method: str, done: dict[str, StageResult]) -> StageResult:
        """Train `method` on the model the chain has, validate it against that model, go on
        with it unless it is worse (`keep`), and measure the tuned model zero-shot."""
        prompted = done["prompt"].parameters
        before = self._kept_stage(done)
        records = await self._training_data(method, prompted, on_policy=self.methods.index(method) > 0)
        status = await self._train(method, records, await self._start_folder(before))
        candidate = FewShotAgent(self.model)
        switch_model(candidate, status)
        candidate.apply({**prompted, "demos": []})  # distilled: asked zero-shot
        current = self._kept_agent()  # the base model while no weights stage is kept
        current.apply(prompted if before == "prompt" else {**prompted, "demos": []})
        change = paired_change(await self._validate(before, current), await self._validate(method, candidate))
        worse = change is not None and change.interval.high < 0
        kept = self.settings["keep"] == "last" or not worse
        switches = recorded_switches(self.folder)
        if kept and not (switches and switches[-1].job_id == status.job_id):
            switch_model(candidate, status, run_dir=self.folder)  # recorded: resumed runs and later stages use it
        if not kept and change is not None:
            logger.warning(
                "%s is worse than %s on the validation examples (%+.1f points, paired 95%% interval "
                "[%+.1f, %+.1f]): the chain goes on with %s",
                method,
                before,
                100 * change.difference,
                100 * change.interval.low,
                100 * change.interval.high,
                before,
            )
        result = await self._measure(method, candidate)  # type: ignore[arg-type]
        result.train_records = len(read_jsonl(records))
        result.kept, result.compared_with = kept, before
        if change is not None:
            result.validation_change = change.difference
            result.validation_interval = (change.interval.low, change.interval.high)
        return result

    async def _validate(self, stage: str, agent: FewShotAgent) -> list[float | None]:
        """`agent`'s scores on the validation examples of the weights check (kept in data/)."""
        path = self.folder / "data" / f"validation-{stage}.json"
        if path.exists():
            return list(read_json_object(path)["scores"])
        s = self.settings
        # The validation examples after those the prompt stages chose their candidates on.
        shown = s["validation_n"]
        examples = bigbench(s["task"], split="validation", n=shown + s["weights_validation_n"], seed=s["seed"])[shown:]
        result = await aevaluate(agent, self.guide, examples, concurrency=16, progress=self.progress)
        atomic_write_json(path, {"scores": result.scores, "mean": result.mean})
        return list(result.scores)

    async def _training_data(self, method: str, prompted: dict[str, Any], *, on_policy: bool) -> Path:
        """`method`'s records in the zero-shot form: from the optimized agent's answers on the
        training split (the first weights stage), or, `on_policy`, from what the model the
        chain has answers itself."""
        s = self.settings
        out = self.folder / "data" / f"{method}.jsonl"
        if out.exists():
            return out
        examples = bigbench(s["task"], split="train", n=s["collect_n"], seed=s["seed"])
        agent = FewShotAgent(self.model)
        agent.apply(prompted)
        if on_policy:
            sampler = self._kept_agent()
            sampler.apply({**prompted, "demos": []})
            # A tuned model (a TransformersModel) gives its tokens' logprobs: the groups of
            # `opto export RUN/collect-<stage> --format art` are then on-policy.
            sampler.logprobs = bool(recorded_switches(self.folder))
            # A tuned model batches the calls drawn under one seed (sample k of each example):
            # `samples` times the usual concurrency keeps its batches full.
            folder = self.folder / f"collect-{method}"
            answers = await self._collect(sampler, examples, folder, concurrency=16 * s["samples"])
            golds = {str(e.id): _gold(e) for e in examples} if s["gold"] else {}
            made = {i: _on_policy_records(method, replies, golds.get(i)) for i, replies in answers.items()}
        else:
            folder = self.folder / "collect"
            answers = await self._collect(agent, examples, folder)
            own = await self._own_replies(agent, examples, method) if method == "dpo" else {}
            made = {i: _records(method, replies, own.get(i)) for i, replies in answers.items()}
        questions = {str(e.id): e.x for e in examples}
        rows = [_with_prompt(row, agent.messages(questions[i], demos=False)) for i in made for row in made[i]]
        if not rows:
            raise FineTuneError(
                f"no usable {method} data on {len(examples)} training examples (see {folder}); "
                "collect more examples or samples"
            )
        atomic_write_jsonl(out, rows)
        return out

    async def _collect(
        self, agent: FewShotAgent, examples: list[Example], folder: Path, concurrency: int = 16
    ) -> dict[str, list[tuple[str, float]]]:
        """`agent`'s judged answers, `samples` per example, by example id (kept in `folder`)."""
        s = self.settings
        await acollect(
            agent,
            self.guide,
            examples,
            samples=s["samples"],
            temperature=s["temperature"],
            seed=s["seed"],
            run_dir=folder,
            resume=(folder / "collect.json").exists(),
            concurrency=concurrency,
            progress=self.progress,
        )
        answers: dict[str, list[tuple[str, float]]] = {}
        for record in RunDir(folder).ledger():
            if record.get("type") == "rollout" and record.get("output") is not None:
                reply = (str(record["output"]), record.get("score") or 0.0)
                answers.setdefault(record["instance_id"], []).append(reply)
        return answers

    async def _own_replies(
        self, agent: FewShotAgent, examples: list[Example], method: str
    ) -> dict[str, tuple[str, float]]:
        """What the base model answers itself in the zero-shot form (greedy), judged: the
        first stage's DPO rejected replies, so it learns away from what it would say (kept
        in data/)."""
        path = self.folder / "data" / f"own-replies-{method}.json"
        if path.exists():
            return {k: (v[0], v[1]) for k, v in read_json_object(path).items()}
        untuned = FewShotAgent(self.model)
        untuned.apply({**agent.stored_values(), "demos": []})
        result = await aevaluate(untuned, self.guide, examples, concurrency=16, progress=self.progress)
        own = {
            str(e.id): (str(output), score or 0.0)
            for e, output, score in zip(examples, result.outputs, result.scores)
            if output is not None
        }
        atomic_write_json(path, {k: list(v) for k, v in own.items()})
        return own

    async def _start_folder(self, before: str) -> Path:
        """The weights a stage starts from: the base model's folder, or the kept stage
        `before` merged into a full model (made once, kept in the run)."""
        from ..finetune.lora import merge_adapter
        from ..llm.transformers_model import embedded_model_folder

        switches = recorded_switches(self.folder)
        if not switches:
            return Path(self.base_folder or embedded_model_folder())
        return await asyncio.to_thread(merge_adapter, Path(switches[-1].target), self.folder / f"merged-{before}")

    async def _train(self, method: str, records: Path, start: Path) -> TrainingJobStatus:
        """Fine-tune `start` on `records`; a job this run started earlier is waited for."""
        from ..finetune.trl_adapter import TRLAdapter

        defaults, given = _METHOD_DEFAULTS[method], self.settings["finetune"]
        options = {**FINETUNE_DEFAULTS, **defaults, "seed": self.settings["seed"], **given}
        options["config"] = {**defaults.get("config", {}), **given.get("config", {})}  # TRL's own settings, merged
        adapter = TRLAdapter(start, output_dir=self.folder / "finetune", method=method, **options)
        job = self.folder / f"finetune-{method}.json"
        if job.exists():
            status = await adapter.status(str(read_json_object(job).get("job_id")))
            if status.status in ("pending", "running"):
                logger.info("waiting for fine-tuning job %s, started before the restart", status.job_id)
                status = await adapter.wait_until_complete(status.job_id, poll_interval=2)
            if status.succeeded:
                return status
            logger.warning(
                "fine-tuning job %s %s (%s); submitting it again", status.job_id, status.status, status.message
            )
        ref = await adapter.submit(records)
        atomic_write_json(job, {"job_id": ref.job_id})
        status = await adapter.wait_until_complete(ref, poll_interval=2)
        if not status.succeeded:
            raise FineTuneError(
                f"fine-tuning job {ref.job_id} {status.status}: {status.message} (log: "
                f"{self.folder / 'finetune' / ref.job_id / 'train.log'}); resume=True submits it again"
            )
        return status

    def _kept_stage(self, done: dict[str, StageResult]) -> str:
        """The last weights stage the chain went on with, or "prompt" when none."""
        kept = [m for m in self.methods if m in done and done[m].kept is not False]
        return kept[-1] if kept else "prompt"

    def _kept_agent(self) -> FewShotAgent:
        """The few-shot agent on the model the chain has: the run directory's last switch,
        or the base model when no stage was kept."""
        agent = FewShotAgent(self.model)
        apply_recorded_switches(agent, self.folder)
        return agent

    async def _measure(self, stage: Stage, agent: FewShotAgent) -> StageResult:
        with meter_usage() as meter:
            result = await aevaluate(agent, self.guide, self.test, concurrency=16, progress=self.progress)
        usage = sum(meter.by_model.values(), UsageStats())
        interval = result.interval
        return StageResult(
            stage=stage,
            test_accuracy=result.mean or 0.0,
            test_interval=(interval.low, interval.high) if interval else (0.0, 0.0),
            prompt_tokens_per_call=round(usage.prompt_tokens / max(usage.calls, 1), 1),
            calls=0,
            seconds=0.0,
            model=agent.model.name,
            parameters=agent.stored_values(),
            scores=result.scores,
        )


def _records(
    method: str, replies: list[tuple[str, float]], own: tuple[str, float] | None = None
) -> list[dict[str, Any]]:
    """One example's records from the optimized agent's replies (the prompt added later):
    the first correct reply (sft); a correct reply over the model's `own` zero-shot reply
    when that is wrong, else over a wrong sample (dpo); or the whole judged group (grpo)."""
    right = [text for text, score in replies if score >= 1.0]
    wrong = [text for text, score in replies if score < 1.0 and text not in right]
    if own is not None and own[1] < 1.0 and own[0] not in right:
        wrong.insert(0, own[0])
    if method == "sft":
        return [{"completion": right[0]}] if right else []
    if method == "dpo":
        return [{"chosen": right[0], "rejected": wrong[0]}] if right and wrong else []
    return [{"group": replies}]


def _on_policy_records(method: str, replies: list[tuple[str, float]], gold: str | None) -> list[dict[str, Any]]:
    """One example's records from a model's own samples: for DPO a pair per distinct wrong
    sample, a correct sample (or, where none is, `gold`) over it; for GRPO the judged
    samples (with `gold` at reward 1 where none is correct); for SFT the correct ones."""
    right = list(dict.fromkeys(text for text, score in replies if score >= 1.0))
    wrong = list(dict.fromkeys(text for text, score in replies if score < 1.0 and text not in right))
    if method == "sft":
        return [{"completion": text} for text in right or ([gold] if gold else [])]
    if method == "dpo":
        chosen = right or ([gold] if gold else [])
        return [{"chosen": chosen[i % len(chosen)], "rejected": text} for i, text in enumerate(wrong)] if chosen else []
    return [{"group": replies if right or not gold else [*replies, (gold, 1.0)]}]


def _with_prompt(row: dict[str, Any], prompt: list[dict[str, str]]) -> dict[str, Any]:
    """A record of `_records` as the TRL adapter's line: chat messages (sft), a trl-chat
    pair (dpo) or an ART trajectory group (grpo)."""
    if "completion" in row:
        return {"messages": [*prompt, {"role": "assistant", "content": row["completion"]}]}
    if "chosen" in row:
        return {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": row["chosen"]}],
            "rejected": [{"role": "assistant", "content": row["rejected"]}],
        }
    return {
        "trajectories": [
            {
                "messages_and_choices": [
                    *prompt,
                    {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": text}},
                ],
                "reward": score,
            }
            for text, score in row["group"]
        ]
    }


def _gold(example: Example) -> str:
    """The example's first accepted answer."""
    info = example.info
    return str(info[0] if isinstance(info, (list, tuple)) and info else info)


def _start(run: Path, settings: dict[str, Any], resume: bool) -> dict[str, StageResult]:
    """The stages already finished; a new chain refuses a folder that holds one."""
    path = run / _SETTINGS
    if not path.exists():
        if (run / "metrics.jsonl").exists():
            raise RunDirError(f"{run} holds metrics.jsonl but no {_SETTINGS}; choose another run_dir")
        run.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, settings)
        return {}
    if not resume:
        raise RunDirError(
            f"{run} already holds a prompts-then-weights run; pass resume=True (--resume) to continue "
            "it, or choose another run_dir"
        )
    saved = read_json_object(path)
    changed = [k for k in settings if saved.get(k) != settings[k]]
    if changed:
        raise RunDirError(
            f"cannot resume {run}: it was started with "
            + ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
            + "; this call has "
            + ", ".join(f"{k}={settings[k]!r}" for k in changed)
        )
    return {r["stage"]: StageResult.model_validate(r) for r in read_jsonl(run / "metrics.jsonl")}


def _report(settings: dict[str, Any], run: Path, stages: list[StageResult], seconds: float) -> WeightsReport:
    report = WeightsReport(
        task=settings["task"],
        seed=settings["seed"],
        method=settings["method"],
        run_dir=str(run),
        stages=stages,
        seconds=round(seconds, 1),
    )
    report.kept = next((s.stage for s in reversed(stages) if s.kept), None)
    last = [s for s in stages if s.kept is not False][-1]
    report.ended = last.stage
    prompt = report.stage("prompt")
    change = paired_change(prompt.scores, last.scores) if prompt is not None and last is not prompt else None
    if change is not None:
        report.chain_change = change.difference
        report.chain_change_interval = (change.interval.low, change.interval.high)
    return report
