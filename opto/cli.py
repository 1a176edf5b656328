"""The `opto` command."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .llm import LocalModel, OpenAIModel

    if args.model or args.base_url:
        model = OpenAIModel(args.model or "default", base_url=args.base_url)
    else:
        model = LocalModel()
    run_dir = args.run_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"opto demo: optimizing a counting agent's system prompt with {model.name}")
    try:
        report = run_demo(
            model, run_dir=run_dir, train_n=args.train, validation_n=args.validation, test_n=args.test,
            batch_size=args.batch_size, seed=args.seed, progress=not args.no_progress,
        )
    finally:
        model.close()
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    print(f"test accuracy before: {pct(report.test_before)}  after: {pct(report.test_after)}")
    print(f"steps: {report.steps}  accepted: {report.accepted}  rejected: {report.rejected}")
    print(f"model calls: {report.calls} (+{report.cached_calls} cached)  "
          f"tokens: {report.prompt_tokens} prompt + {report.completion_tokens} completion")
    print(f"initial prompt: {report.initial_prompt!r}")
    print(f"final prompt:   {report.final_prompt!r}")
    print(f"time: {report.seconds:.1f} s   run dir: {report.run_dir} (ledger.jsonl, checkpoint.json, metrics.jsonl)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opto", description="Optimize the text parameters of LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="optimize a QA agent's prompt offline on the bundled local model")
    demo.add_argument("--model", help="model name on an OpenAI-compatible server (default: local SmolLM2)")
    demo.add_argument("--base-url", help="OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1; "
                      "the key is read from OPENAI_API_KEY")
    demo.add_argument("--train", type=int, default=8, help="training examples (default 8)")
    demo.add_argument("--validation", type=int, default=8, help="validation examples (default 8)")
    demo.add_argument("--test", type=int, default=24, help="test examples (default 24)")
    demo.add_argument("--batch-size", type=int, default=4)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--run-dir", help="where to write the run (default runs/demo-<time>)")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a clear one-line message instead of a traceback
        logging.getLogger("opto").debug("command failed", exc_info=True)
        print(f"opto {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
