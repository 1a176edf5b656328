"""The `opto` command."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .datasets import bigbench_tasks
from .errors import OptoValueError
from .preference import SOURCES
from .search import registry

if TYPE_CHECKING:
    from .finetune import TrainerAdapter, TrainingJobStatus

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from .recipes.demo import run_demo
    from .trainer.estimate import ask_on_terminal
    from .trainer.failures import TooManyFailures

    if args.finetune:
        return _prompts_then_weights(args)
    run_dir = _demo_run_dir(args)
    model = _demo_model(args)
    if not args.json:
        print(f"opto demo: a few-shot agent learns its prompt and demos on BIG-bench {args.task} with {model.name}")
        print(f"run dir: {run_dir} (after Ctrl-C, continue with: opto demo --run-dir {run_dir} --resume)")
    try:
        report = run_demo(
            model,
            run_dir=run_dir,
            task=args.task,
            train_n=args.train,
            validation_n=args.validation,
            test_n=args.test,
            batch_size=args.batch_size,
            seed=args.seed,
            selection=args.selection,
            progress=not (args.no_progress or args.json),
            resume=args.resume,
            # The estimate on stderr: stdout may carry --json.
            confirm=False
            if args.yes or model.local
            else functools.partial(ask_on_terminal, stream=sys.stderr, to_skip="pass --yes to start it"),
        )
    except KeyboardInterrupt:
        print(f"interrupted; the run is saved: opto demo --run-dir {run_dir} --resume continues it", file=sys.stderr)
        return 130
    except TooManyFailures as exc:  # said again in the command's words: how to resume it
        cause = exc.__cause__ or exc  # train() raises it from the failure, without its Python advice
        raise TooManyFailures(
            f"{cause}; the run is saved: fix the cause, then opto demo --run-dir {run_dir} --resume continues it"
        ) from None
    finally:
        model.close()
    if args.json:
        print(report.model_dump_json())
        return 0 if report.stopped_reason is None else 1
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    span = lambda i: "" if i is None else f" [{100 * i[0]:.1f}, {100 * i[1]:.1f}]"  # noqa: E731
    print(
        f"test accuracy ({report.test_examples} held-out examples): before {pct(report.test_before)}"
        f"{span(report.test_before_interval)}  after {pct(report.test_after)}{span(report.test_after_interval)}  "
        f"(best constant answer: {pct(report.test_baseline)})"
    )
    if report.test_change is not None and report.test_change_interval is not None:
        low, high = report.test_change_interval
        print(
            f"change: {100 * report.test_change:+.1f} points, 95% interval [{100 * low:+.1f}, {100 * high:+.1f}] "
            f"(paired over the same examples; brackets above: 95% intervals)"
        )
    if report.test_before_failed or report.test_after_failed:
        print(f"failed test examples (scored 0): before {report.test_before_failed}  after {report.test_after_failed}")
    print(f"steps: {report.steps}  accepted: {report.accepted}  rejected: {report.rejected}")
    if report.final_check is not None:
        print(report.final_check.summary())
    if report.diagnosis:
        print(f"why: {report.diagnosis}")
    print(
        f"model calls: {report.calls} (+{report.cached_calls} cached)  "
        f"tokens: {report.prompt_tokens} prompt + {report.completion_tokens} completion"
    )
    print(f"final system prompt: {report.final_parameters.get('system_prompt')!r}")
    demos = report.final_parameters.get("demos") or []
    print("final demos: " + (", ".join(f"{d['input']!r} -> {d['output']!r}" for d in demos) or "none"))
    print(f"time: {report.seconds:.1f} s   run dir: {report.run_dir} (see it with: opto report {report.run_dir})")
    if report.stopped_reason:
        print(f"stopped early: {report.stopped_reason}")
        return 1
    return 0


def _demo_run_dir(args: argparse.Namespace) -> str:
    """The demo's run directory, refused up front in the command's own words when
    --resume has nothing to continue or a new run would overwrite one."""
    from .errors import RunDirError

    if args.resume and not args.run_dir:
        raise OptoValueError("--resume needs --run-dir DIR, the run to continue (the demo printed it when it started)")
    run_dir = args.run_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    started = (Path(run_dir) / "checkpoint.json").exists()
    if args.resume and not started:
        raise RunDirError(
            f"{run_dir} holds no demo run to resume (no checkpoint.json); leave out --resume to start one"
        )
    if started and not args.resume:
        raise RunDirError(
            f"{run_dir} already holds a run (its checkpoint.json); add --resume to continue it, or choose another "
            "--run-dir"
        )
    return run_dir


def _weights_chain(text: str) -> str:
    """`--finetune`'s value: one method or a chain of them, checked as `prompts_then_weights` will."""
    from .recipes.prompts_then_weights import chain_of

    try:
        return ",".join(chain_of(text))
    except OptoValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: use sft, dpo or grpo, or a chain such as sft,dpo") from exc


def _prompts_then_weights(args: argparse.Namespace) -> int:
    from .recipes.prompts_then_weights import prompts_then_weights
    from .report.stages import kept_text

    if args.model or args.base_url:
        raise SystemExit(
            "opto demo --finetune trains the embedded model's weights on this machine; it does not take "
            "--model or --base-url"
        )
    if args.selection != "greedy" or args.batch_size != 4:
        raise SystemExit(
            "opto demo --finetune runs the prompt stages with the demo's defaults (--batch-size 4, --selection greedy)"
        )
    model = _demo_model(args)
    run_dir = args.run_dir or f"runs/weights-{time.strftime('%Y%m%d-%H%M%S')}"
    if not args.json:
        print(
            f"opto demo --finetune {args.finetune}: the prompt, then the weights of {model.name}, on BIG-bench "
            f"{args.task} (run dir {run_dir})"
        )
    try:
        report = prompts_then_weights(
            model,
            run_dir=run_dir,
            method=args.finetune,
            again=not args.no_again,
            task=args.task,
            seed=args.seed,
            train_n=args.train,
            validation_n=args.validation,
            test_n=args.test,
            collect_n=args.collect,
            keep=args.keep,
            weights_validation_n=args.check,
            resume=args.resume,
            progress=not (args.no_progress or args.json),
        )
    finally:
        model.close()
    if args.json:
        print(report.model_dump_json(exclude={"stages": {"__all__": {"scores", "parameters"}}}))
        return 0
    print(
        f"{'stage':<13} {'test accuracy':>14} {'95% interval':>16} {'prompt tokens/call':>19} {'calls':>6} "
        f"{'seconds':>8}  kept"
    )
    for stage in report.stages:
        low, high = stage.test_interval
        print(
            f"{stage.stage:<13} {100 * stage.test_accuracy:>13.1f}% {f'[{100 * low:.1f}, {100 * high:.1f}]':>16} "
            f"{stage.prompt_tokens_per_call:>19.1f} {stage.calls:>6} {stage.seconds:>8.1f}  {kept_text(stage.model_dump())}"
        )
    if report.chain_change is not None and report.chain_change_interval is not None:
        low, high = report.chain_change_interval
        print(
            f"{report.ended} vs prompt: {100 * report.chain_change:+.1f} points, paired 95% interval "
            f"[{100 * low:+.1f}, {100 * high:+.1f}]"
        )
    print(f"time: {report.seconds:.1f} s   see it with: opto report {run_dir}")
    return 0


def _demo_model(args: argparse.Namespace) -> Any:
    from .llm import LocalModel, OpenAIModel

    if args.model or args.base_url:
        return OpenAIModel(args.model or "default", base_url=args.base_url)
    return LocalModel()


def _collect(args: argparse.Namespace) -> int:
    from .core.guides import ExactMatchGuide
    from .datasets import bigbench
    from .recipes.demo import FewShotAgent
    from .trainer.collection import collect

    model = _demo_model(args)
    executor = None
    try:
        agent = FewShotAgent(model)
        if args.values:
            agent.load(args.values)
        data = bigbench(args.task, split=args.split, n=args.n, seed=args.seed)
        if args.ray:  # Ray joins the cluster RAY_ADDRESS names, else starts a local instance
            from .executors import RayExecutor

            executor = RayExecutor()
        result = collect(
            agent,
            ExactMatchGuide(),
            data,
            samples=args.samples,
            run_dir=args.run_dir,
            temperature=args.temperature,
            seed=args.seed,
            resume=args.resume,
            concurrency=args.concurrency,
            progress=not args.no_progress,
            executor=executor,
        )
    finally:
        if executor is not None:
            executor.close()
        model.close()
    score = "n/a" if result.mean_score is None else f"{result.mean_score:.3f}"
    print(
        f"collected {result.rollouts} rollouts ({result.samples} per example, {result.examples} examples, "
        f"{result.skipped_examples} already collected) into {result.run_dir}; mean score {score}, "
        f"{result.failed} failed; {result.usage.calls} model calls"
    )
    print(f"next: opto export {result.run_dir} --format art --out groups.jsonl")
    if result.stopped_reason:
        print(f"stopped early: {result.stopped_reason}")
        return 1
    return 0


def _fake_server(args: argparse.Namespace) -> int:
    from .testing import FakeARTServer, FakeNeMoCustomizer, FakeOpenAIServer

    if args.art:
        server: FakeOpenAIServer | FakeNeMoCustomizer | FakeARTServer = FakeARTServer(port=args.port)
        hint = (
            "opto finetune submit GROUPS --backend art --base-url {url} --model NAME --base-model BASE "
            "--output-dir art-jobs --allow-without-logprobs --wait"
        )
    elif args.nemo:
        server = FakeNeMoCustomizer(port=args.port)
        hint = "opto finetune submit FILE --backend nemo --base-url {url} --model CONFIG"
    else:
        reply = None if args.echo or args.reply is None else args.reply
        server = FakeOpenAIServer(reply=reply, latency=args.latency, port=args.port, rate_limit_rps=args.rate_limit)
        hint = 'OpenAIModel("any", base_url="{url}", api_key="test")'
    with server:
        print(f"{type(server).__name__} listening on {server.base_url} (Ctrl-C to stop)", flush=True)
        print("  e.g. " + hint.format(url=server.base_url), flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    print(f"stopped after {len(server.requests)} requests", flush=True)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report.html import write_html_report
    from .report.markdown import write_report

    summary = (write_html_report if args.html else write_report)(args.run_dir, args.out)
    # Without matplotlib the picture was not written, so it is not named.
    picture = None if summary.plot_skipped else summary.png
    print("wrote " + " and ".join(path for path in (picture, summary.markdown, summary.html) if path))
    if summary.plot_skipped:
        print(summary.plot_skipped)
    if summary.stages is not None:  # a prompts-then-weights run
        print(f"stages: {', '.join(summary.stages) or 'none finished yet'}")
        return 0
    test = ""
    if summary.first_test_score is not None:
        test = f"  test score {summary.first_test_score:.3f} -> {summary.last_test_score:.3f}"
    print(f"steps: {summary.steps}  accepted: {summary.accepted}  rejected: {summary.rejected}{test}")
    if summary.final_check:
        print(summary.final_check)
    if summary.diagnosis:
        print(f"why: {summary.diagnosis}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .preference import PreferencePairBuilder, export_run

    builder = PreferencePairBuilder(
        min_score_diff=args.min_score_diff,
        max_pairs_per_turn=args.max_pairs_per_turn,
        exhaustive_pairs=not args.best_vs_worst,
    )
    report = export_run(
        args.run_dir,
        args.out,
        source=args.source,
        format=args.format,
        validation_fraction=args.validation_fraction,
        seed=args.seed,
        builder=builder,
        tokenizer=args.tokenizer,
        nemo_prompt=args.nemo_prompt,
        min_score=args.min_score,
    )
    print(f"wrote {report.records} {report.format} records to {report.out}")
    if report.validation_out is not None:
        print(f"wrote {report.validation_records} {report.format} records to {report.validation_out} (validation)")
    if report.groups is not None:
        print(f"trajectory groups: {report.groups.summary()}")
        return 0
    stats = report.stats
    print(
        f"turns: {stats.turns}  candidates: {stats.candidates}  "
        f"{'examples' if report.format == 'openai-sft' else 'pairs'}: {stats.pairs}  "
        f"skipped turns (single candidate): {stats.turns_skipped_single_candidate}  "
        f"skipped pairs (difference < {args.min_score_diff} or tie): {stats.pairs_skipped_small_diff}"
    )
    if args.min_score is not None:
        print(f"replies below --min-score {args.min_score}: {stats.candidates_below_min_score}")
    if stats.truncated_candidates:
        print(
            f"truncated responses (cut at max_tokens, never chosen): {stats.truncated_candidates}  "
            f"skipped pairs: {stats.pairs_skipped_truncated}"
        )
    if stats.by_source:
        print("by source: " + ", ".join(f"{name} {count}" for name, count in sorted(stats.by_source.items())))
    if report.unused:
        print("not used: " + ", ".join(f"{count} {reason}" for reason, count in report.unused.items()))
    return 0


def _hyperparameters(items: Sequence[str] | None) -> dict[str, object]:
    import json

    values: dict[str, object] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise OptoValueError(f"--hyperparameter takes KEY=VALUE (e.g. n_epochs=2), got {item!r}")
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw  # e.g. auto
    return values


def _finetune(args: argparse.Namespace) -> int:
    import asyncio

    from ._util.files import atomic_write_json

    adapter = _finetune_adapter(args)
    state = getattr(args, "state", None)

    def show(status: TrainingJobStatus) -> int:
        progress = "" if status.progress is None else f" {100 * status.progress:.0f}%"
        print(f"job {status.job_id}: {status.status}{progress}" + (f" - {status.message}" if status.message else ""))
        if status.fine_tuned_model and status.succeeded:
            print(f"fine-tuned model: {status.fine_tuned_model}")
        if args.action == "cancel":  # the request worked; the job is stopping or stopped
            return 1 if status.status in ("failed", "succeeded") else 0
        return 1 if status.status in ("failed", "cancelled") else 0

    async def run() -> int:
        if args.action == "submit":
            ref = await adapter.submit(args.target, validation_dataset=args.validation_file)
            print(f"submitted job {ref.job_id} ({adapter.backend}, {ref.method}, base model {ref.base_model})")
            if state:
                atomic_write_json(state, adapter.state_dict())
                print(f"saved the adapter state to {state} (no key)")
            if args.backend in ("trl", "art"):
                print(
                    f"job folder: {Path(args.output_dir) / ref.job_id} (follow it with: opto finetune status "
                    f"{ref.job_id} --backend {args.backend} --output-dir {args.output_dir})"
                )
            if not args.wait:
                return show(await adapter.status(ref))
            return show(await adapter.wait_until_complete(ref, poll_interval=args.poll_interval, timeout=args.timeout))
        if args.action == "status":
            return show(await adapter.status(args.target))
        if args.action == "wait":
            return show(
                await adapter.wait_until_complete(args.target, poll_interval=args.poll_interval, timeout=args.timeout)
            )
        return show(await adapter.cancel(args.target))

    return asyncio.run(run())


def _finetune_adapter(args: argparse.Namespace) -> TrainerAdapter:
    """The backend's adapter, from the command line or (status, wait, cancel) from a --state file."""
    import json

    from .finetune import NeMoCustomizerAdapter, OpenAIFineTuneAdapter, TRLAdapter

    if args.state and args.backend in ("trl", "art"):
        raise OptoValueError(
            f"--state is for the openai and nemo backends; {args.backend} keeps its jobs in --output-dir"
        )
    if args.action != "submit" and args.state:
        saved = json.loads(Path(args.state).read_text(encoding="utf-8"))
        restore: type[TrainerAdapter] = registry.lookup("finetune backend", args.backend)
        return restore.from_state_dict(saved)
    submit = args.action == "submit"
    model = getattr(args, "model", None)
    if submit and not model:
        raise OptoValueError(
            {
                "openai": "submit needs --model, the base model to fine-tune",
                "nemo": "submit needs --model, the Customizer config of the base model "
                "(e.g. meta/llama-3.2-1b-instruct@v1.0.0+A100)",
                "trl": "submit needs --model, the folder of the Hugging Face model to train (or "
                "'embedded', the embedded SmolLM2)",
                "art": "submit needs --model, the name of the trained model (ART serves it as a LoRA)",
            }[args.backend]
        )
    options = _hyperparameters(getattr(args, "hyperparameter", None))
    if args.backend == "trl":
        if not args.output_dir:
            raise OptoValueError("--backend trl needs --output-dir, where the job's folder is (or will be) made")
        max_steps = getattr(args, "max_steps", None)
        method = getattr(args, "method", "dpo")
        if model == "embedded":  # the embedded SmolLM2, converted to a Hugging Face folder once
            from .llm.transformers_model import embedded_model_folder

            model = str(embedded_model_folder())
        if method not in ("dpo", "grpo", "sft", "supervised"):
            raise OptoValueError(f"--backend trl trains with --method dpo, sft or grpo, not {method}")
        return TRLAdapter(
            model or "",
            output_dir=args.output_dir,
            method="sft" if method == "supervised" else method,
            **({"max_steps": max_steps} if max_steps else {}),
            config=options,
            lora=True if getattr(args, "lora", False) else None,
        )
    if args.backend == "art":
        return _art_adapter(args, model)
    method = getattr(args, "method", "dpo")
    if args.backend == "nemo":
        return NeMoCustomizerAdapter(
            model or "unknown",
            base_url=args.base_url,
            namespace=args.namespace,
            method="sft" if method in ("sft", "supervised") else "dpo",
            hyperparameters=options,
        )
    if not (os.environ.get("OPENAI_API_KEY") or args.base_url or os.environ.get("OPENAI_BASE_URL")):
        raise OptoValueError(
            "no API key: set OPENAI_API_KEY (it is read from the environment only), or give "
            "--base-url for an OpenAI-compatible server that needs none"
        )
    return OpenAIFineTuneAdapter(
        model or "unknown",
        method="supervised" if method in ("sft", "supervised") else "dpo",
        base_url=args.base_url,
        hyperparameters=options,
        suffix=getattr(args, "suffix", None),
        seed=getattr(args, "seed", None),
    )


def _art_adapter(args: argparse.Namespace, model: str | None) -> TrainerAdapter:
    from .finetune import ARTAdapter

    if not args.output_dir:
        raise OptoValueError("--backend art needs --output-dir, where the job's folder is (or will be) made")
    if args.action != "submit":  # status, wait, cancel read the job folder only
        return ARTAdapter("unused", base_model="unused", base_url="http://unused", output_dir=args.output_dir)
    if not args.base_url or not args.base_model:
        raise OptoValueError("--backend art needs --base-url (the art run server, or W&B's API root) and --base-model")
    return ARTAdapter(
        model or "",
        base_model=args.base_model,
        base_url=args.base_url,
        protocol=args.protocol,
        project=args.project,
        learning_rate=args.learning_rate,
        kl_penalty=args.kl_penalty,
        dev_config={"allow_training_without_logprobs": True} if args.allow_without_logprobs else {},
        output_dir=args.output_dir,
    )


def _add_export_parser(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser("export", help="turn a run's ledger into preference (or supervised) data")
    export.add_argument("run_dir", help="the run directory (holding ledger.jsonl), or its ledger.jsonl")
    export.add_argument("--source", choices=[*SOURCES, "all"], default="all", help="which turns to use (default all)")
    export.add_argument(
        "--format",
        choices=registry.names("preference format"),
        default="openai-dpo",
        help="the output format (default openai-dpo)",
    )
    export.add_argument("--out", required=True, help="the JSONL file to write")
    export.add_argument(
        "--validation-fraction",
        type=float,
        default=0.0,
        help="share of examples written to OUT's .validation.jsonl twin (default 0)",
    )
    export.add_argument(
        "--min-score-diff",
        type=float,
        default=0.0,
        help="smallest score difference that makes a pair (default 0: any strict win)",
    )
    export.add_argument(
        "--min-score",
        type=float,
        default=None,
        help="openai-sft: every complete reply scoring at least this, single candidate or not "
        "(default: each turn's best reply, when it beats another)",
    )
    export.add_argument("--max-pairs-per-turn", type=int, default=None, help="keep the N widest pairs per turn")
    export.add_argument("--best-vs-worst", action="store_true", help="one pair per turn instead of every pair")
    export.add_argument("--seed", type=int, default=0, help="the split's seed (default 0)")
    export.add_argument(
        "--tokenizer",
        help="trl: the target model's folder (or hub id), whose chat template "
        "renders the prompts (required for trl; trl-chat needs none)",
    )
    export.add_argument(
        "--nemo-prompt",
        choices=["messages", "string"],
        default=None,
        help="nemo: the prompt as the message list (default) or as the last message's text",
    )
    export.set_defaults(handler=_export)


def _add_finetune_parser(commands: argparse._SubParsersAction) -> None:
    finetune = commands.add_parser("finetune", help="send exported data to a fine-tuning backend and follow the job")
    actions = finetune.add_subparsers(dest="action", required=True)
    for action, help_text, target in (
        ("submit", "validate and upload a file, start a job", "the JSONL file (from opto export)"),
        ("status", "show a job's state", "the job id"),
        ("wait", "wait until a job finishes", "the job id"),
        ("cancel", "cancel a job", "the job id"),
    ):
        sub = actions.add_parser(action, help=help_text)
        sub.add_argument("target", help=target)
        sub.add_argument(
            "--backend",
            choices=registry.names("finetune backend"),
            default="openai",
            help="openai: any OpenAI-compatible fine-tuning API (default); nemo: NVIDIA NeMo "
            "Customizer; trl: local DPO; art: GRPO on trajectory groups (OpenPipe ART)",
        )
        sub.add_argument(
            "--base-url",
            help="openai: the API root (default OPENAI_BASE_URL, then OpenAI; the key is "
            "read from OPENAI_API_KEY); nemo: the Customizer's root (default NEMO_CUSTOMIZER_URL; "
            "the key from NEMO_API_KEY or NGC_API_KEY)",
        )
        sub.add_argument("--namespace", default="default", help="nemo: the namespace of datasets and models")
        sub.add_argument("--output-dir", help="trl, art: where job folders are")
        if action == "submit":
            sub.add_argument(
                "--model",
                help="the base model (openai: its name; nemo: its Customizer config; "
                "trl: a model folder, or 'embedded' for the embedded SmolLM2)",
            )
            sub.add_argument(
                "--method",
                choices=["dpo", "supervised", "sft", "grpo"],
                default="dpo",
                help="openai, nemo: dpo (default) or supervised (sft); trl: dpo, sft, or grpo (on an "
                "art file of trajectory groups)",
            )
            sub.add_argument(
                "--hyperparameter",
                action="append",
                metavar="KEY=VALUE",
                help="openai: e.g. n_epochs=2, beta=0.1; nemo: e.g. epochs=1, beta=0.1; "
                "trl: any DPOConfig setting (repeatable)",
            )
            sub.add_argument("--suffix", help="openai: added to the tuned model's name")
            sub.add_argument("--seed", type=int, default=None, help="openai: the job's seed")
            sub.add_argument("--validation-file", help="a validation JSONL file")
            sub.add_argument("--max-steps", type=int, default=None, help="trl: stop after this many steps")
            sub.add_argument(
                "--lora", action="store_true", help="trl: train a LoRA adapter (peft) instead of all weights"
            )
            sub.add_argument(
                "--protocol",
                choices=["art-run", "serverless"],
                default="art-run",
                help="art: an `art run` server (default) or W&B's serverless training API (key from WANDB_API_KEY)",
            )
            sub.add_argument("--base-model", help="art: the model the trained LoRA starts from")
            sub.add_argument("--project", default="opto", help="art: the model's project (default opto)")
            sub.add_argument("--learning-rate", type=float, default=5e-6, help="art: the learning rate")
            sub.add_argument("--kl-penalty", type=float, default=None, help="art: the KL penalty (beta)")
            sub.add_argument(
                "--allow-without-logprobs",
                action="store_true",
                help="art: train on trajectories without logprobs (off-policy)",
            )
            sub.add_argument("--wait", action="store_true", help="wait until the job finishes")
            sub.add_argument("--state", help="openai, nemo: save the adapter's state (no key) to this JSON file")
        else:
            sub.add_argument(
                "--state",
                help="openai, nemo: the state file `submit --state` saved (its base URL, "
                "settings and jobs) instead of the options above",
            )
        if action in ("submit", "wait"):
            sub.add_argument("--poll-interval", type=float, default=10.0, help="seconds between status checks")
            sub.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
        sub.set_defaults(handler=_finetune)


class _VersionAction(argparse.Action):
    """`--version`, computed only when asked: finding clashing packages scans every installed one."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from ._util.installed import version_text

        print(version_text())
        parser.exit()


def _add_production_parser(commands: Any) -> None:
    cycle = commands.add_parser(
        "production",
        help="learn from production: read traces and feedback, train, check on the newest, publish or refuse",
        description="Learn from production: read traces and feedback, train, check on the newest, publish or refuse.",
        epilog=(
            "exit codes: 0 a better prompt was published (or would be, with --dry-run); 3 the cycle could not "
            "improve with evidence (nothing published: the check did not pass, nothing to train on, or the alias "
            "moved while it trained); 1 an error (its message says what to fix). --agent MODULE:FACTORY is "
            "imported from the current folder first, as `python -m` does."
        ),
    )
    cycle.add_argument("--agent", required=True, help="MODULE:FACTORY, a function returning your opto Agent")
    cycle.add_argument("--prompt", required=True, help="the registry prompt, prompts:/NAME@ALIAS (MLflow)")
    cycle.add_argument("--parameter", default="prompt", help="the agent's parameter holding it (default: prompt)")
    source = cycle.add_mutually_exclusive_group(required=True)
    source.add_argument("--experiment", help="the MLflow experiment to read traces from")
    source.add_argument("--otlp", help="an OTLP JSON export to read traces from")
    cycle.add_argument("--expected", help="the expected answer's MLflow expectation name, or OTLP span attribute")
    cycle.add_argument("--model", required=True, help="the optimizer's model (a LiteLLM name, or a name on --base-url)")
    cycle.add_argument("--base-url", help="an OpenAI-compatible API root for --model; the key from OPENAI_API_KEY")
    cycle.add_argument("--judge-model", help="a judge for traces without an expected answer (same server)")
    cycle.add_argument("--newest", type=float, default=0.25, help="share of the newest traces to check on (0.25)")
    cycle.add_argument("--run-dir", help="the run's directory (ledger, checkpoint; resumed when it holds a run)")
    cycle.add_argument("--message", help="the commit message of a published version")
    cycle.add_argument("--dry-run", action="store_true", help="check, but register nothing")
    cycle.set_defaults(handler=_production)


def _production(args: argparse.Namespace) -> int:
    """Exit 0 when a better prompt was published (or would be, in a dry run), 3 when the
    cycle could not improve with evidence."""
    from .integrations.production import load_agent, production_cycle

    if os.getcwd() not in sys.path:  # --agent my_app.agent:make_agent from the folder that holds my_app/
        sys.path.insert(0, os.getcwd())

    def model(name: str) -> Any:
        if args.base_url:
            from .llm import OpenAIModel

            return OpenAIModel(name, base_url=args.base_url)
        from .llm.litellm_model import LiteLLMModel

        return LiteLLMModel(name)

    cycle = production_cycle(
        load_agent(args.agent),
        model(args.model),
        prompt=args.prompt,
        parameter=args.parameter,
        experiment=args.experiment,
        otlp=args.otlp,
        expected=args.expected,
        newest=args.newest,
        judge=model(args.judge_model) if args.judge_model else None,
        publish_result=not args.dry_run,
        run_dir=args.run_dir,
        message=args.message,
    )
    print(cycle.summary())
    return 0 if cycle.improved else 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opto", description="Optimize the text parameters of LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        nargs=0,
        help="print the version, where opto is installed, and any package clashing with it",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="a few-shot agent learns its demos offline on the bundled local model")
    demo.add_argument("--model", help="model name on an OpenAI-compatible server (default: local SmolLM2)")
    demo.add_argument(
        "--base-url",
        help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1; the key comes from OPENAI_API_KEY",
    )
    demo.add_argument(
        "--task", default="plural", choices=bigbench_tasks(), help="shipped BIG-bench task (default plural)"
    )
    demo.add_argument("--train", type=int, default=12, help="training examples (default 12)")
    demo.add_argument("--validation", type=int, default=24, help="validation examples (default 24)")
    demo.add_argument("--test", type=int, default=64, help="held-out test examples (default 64)")
    demo.add_argument("--batch-size", type=int, default=4)
    demo.add_argument("--selection", default="greedy", choices=("greedy", "pareto"))
    demo.add_argument("--seed", type=int, default=0, help="split and shuffle seed (default 0)")
    demo.add_argument("--run-dir", help="where to write the run (default runs/demo-<time>)")
    demo.add_argument("--json", action="store_true", help="print the report as one JSON object")
    demo.add_argument(
        "--finetune",
        type=_weights_chain,
        metavar="{sft,dpo,grpo}[,...]",
        help="prompts, then weights: after the prompt stage, fine-tune the embedded model (LoRA, TRL) "
        "on the optimized agent's answers, asked zero-shot, then optimize the prompt again; a comma list "
        "(sft,dpo) is a chain, each stage starting from the model the one before it tuned",
    )
    demo.add_argument(
        "--collect",
        type=int,
        default=256,
        help="with --finetune: training examples the optimized agent answers (default 256)",
    )
    demo.add_argument("--no-again", action="store_true", help="with --finetune: stop after the fine-tuned stage")
    demo.add_argument(
        "--keep",
        default="unless-worse",
        choices=("unless-worse", "last"),
        help="with --finetune: go on with a tuned model unless it is worse than the model before it on "
        "validation examples beyond doubt (unless-worse, the default), or always (last)",
    )
    demo.add_argument(
        "--check",
        type=int,
        default=64,
        metavar="N",
        help="with --finetune: validation examples each tuned model is checked on (default 64)",
    )
    demo.add_argument("--resume", action="store_true", help="continue the interrupted run in --run-dir")
    demo.add_argument(
        "--yes",
        action="store_true",
        help="with a remote --model: start without showing the cost estimate and asking first",
    )
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(handler=_demo)
    gather = commands.add_parser(
        "collect", help="RL data: the demo's few-shot agent answers each example several times, without optimizing"
    )
    gather.add_argument("--run-dir", required=True, help="where to write the rollouts (ledger.jsonl)")
    gather.add_argument("--samples", type=int, default=4, help="rollouts per example (default 4)")
    gather.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    gather.add_argument("--task", default="plural", choices=bigbench_tasks(), help="shipped BIG-bench task")
    gather.add_argument("--split", default="train", choices=("train", "validation", "test"))
    gather.add_argument("--n", type=int, default=24, help="examples (default 24)")
    gather.add_argument("--values", help="the agent's values: a run's agent.json (default: the demo's start)")
    gather.add_argument("--seed", type=int, default=0, help="examples' and samples' seed (default 0)")
    gather.add_argument("--concurrency", type=int, default=4, help="rollouts in flight at once (default 4)")
    gather.add_argument(
        "--ray",
        action="store_true",
        help="run the rollouts on Ray workers: the cluster at "
        "RAY_ADDRESS, else a local Ray instance (needs the ray extra)",
    )
    gather.add_argument("--resume", action="store_true", help="continue a collection in --run-dir")
    gather.add_argument("--model", help="model name on an OpenAI-compatible server (default: local SmolLM2)")
    gather.add_argument("--base-url", help="OpenAI-compatible API root; the key comes from OPENAI_API_KEY")
    gather.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    gather.set_defaults(handler=_collect)
    fake = commands.add_parser("fake-server", help="run the offline fake OpenAI-compatible server in the foreground")
    fake.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    fake.add_argument("--latency", type=float, default=0.0, help="seconds every chat request waits")
    answer = fake.add_mutually_exclusive_group()
    answer.add_argument("--reply", help="the text every chat completion answers")
    answer.add_argument("--echo", action="store_true", help='answer "echo: <last user message>" (the default)')
    fake.add_argument("--rate-limit", type=float, default=None, help="requests per second before 429s")
    servers = fake.add_mutually_exclusive_group()
    servers.add_argument(
        "--nemo",
        action="store_true",
        help="serve the fake NeMo Data Store, Entity Store and Customizer instead (for opto finetune --backend nemo)",
    )
    servers.add_argument(
        "--art",
        action="store_true",
        help="serve the fake ART training server instead (art run "
        "routes and W&B's serverless API, key test-key; for opto finetune --backend art)",
    )
    fake.set_defaults(handler=_fake_server)
    report = commands.add_parser("report", help="a run's learning curve (report.png) and step summary (report.md)")
    report.add_argument("run_dir", help="the run directory")
    report.add_argument("--out", help="the folder to write into (default: the run directory)")
    report.add_argument(
        "--html",
        action="store_true",
        help="also write report.html: one self-contained page with each step's candidates and diffs",
    )
    report.set_defaults(handler=_report)
    _add_production_parser(commands)
    _add_export_parser(commands)
    _add_finetune_parser(commands)
    return parser


# The library's messages name its Python arguments; the command's user types options.
_COMMAND_WORDS = (
    ("pass resume=True (--resume)", "add --resume"),
    ("pass resume=True", "add --resume"),
    ("train(..., resume=True)", "the same command with --resume"),
    ("resume=True", "--resume"),
    ("choose another run_dir", "choose another --run-dir"),
)


def in_command_words(text: str) -> str:
    """A library message as the `opto` command's user should read it."""
    for python, option in _COMMAND_WORDS:
        text = text.replace(python, option)
    return text


@contextlib.contextmanager
def command_words() -> Iterator[None]:
    """While the command runs, every log record it makes is in the command's words.

    A record factory rather than a handler filter: training swaps the handlers for ones
    that write above its progress bars (tqdm's), and those would not carry a filter."""
    make_record = logging.getLogRecordFactory()

    def reworded(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        record.msg, record.args = in_command_words(record.getMessage()), None
        return record

    logging.setLogRecordFactory(reworded)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make_record)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        with command_words():
            return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a clear one-line message instead of a traceback
        logging.getLogger("opto").debug("command failed", exc_info=True)
        print(f"opto {args.command}: error: {in_command_words(str(exc))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
