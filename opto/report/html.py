"""`opto report RUN --html`: a run as one self-contained page.

The page holds the learning curve with its intervals, the lineage of a Pareto run, and
per step each candidate: a word diff of every parameter against the values it started
from, its decision, scores and interval, and the step's calls, tokens and cost. Pictures
are inline PNGs (the same matplotlib figures `opto report` draws), styles and the one
script are inline: the page fetches nothing, so it opens offline and can be mailed.
Without matplotlib the page has no pictures and says which extra adds them.
Every text that came from a model or a dataset is escaped, never interpreted.
"""

from __future__ import annotations

import base64
import difflib
import html
import json
import re
from pathlib import Path
from typing import Any

from .._util.files import atomic_write_text, read_jsonl
from ..run.ledger import RunDir
from .markdown import ReportSummary, _checkpoint, _num, estimate_rows, write_report
from .stages import is_stage_run, kept_text, read_stages

__all__ = ["write_html_report"]

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; color: #1d1d1f; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 1em 0; } td, th { border: 1px solid #ddd; padding: .3em .6em; }
th { background: #f4f4f6; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; }
details { margin: .6em 0; border: 1px solid #ddd; border-radius: 6px; padding: .4em .8em; }
summary { cursor: pointer; font-weight: 600; }
.accepted { color: #17752d; } .rejected { color: #a3261b; } .none { color: #666; }
.diff { white-space: pre-wrap; font: 13px/1.4 ui-monospace, monospace; background: #fafafa; padding: .5em; }
del { background: #fdd; text-decoration: line-through; } ins { background: #dfd; text-decoration: none; }
.muted { color: #666; } button { margin-right: .5em; }
"""

# Open or close every step at once; the page works without it.
_SCRIPT = """
document.querySelectorAll("button[data-open]").forEach(function (button) {
  button.addEventListener("click", function () {
    var open = button.getAttribute("data-open") === "1";
    document.querySelectorAll("details").forEach(function (d) { d.open = open; });
  });
});
"""


def write_html_report(run_dir: str | Path, out: str | Path | None = None) -> ReportSummary:
    """Write `report.html` (with `report.png` and `report.md`) for the run in `run_dir`.

    Args:
        run_dir: a training run's directory, or a prompts-then-weights run's.
        out: the folder to write into (default: the run directory).

    Returns:
        The `ReportSummary` of `write_report`, with `html` set to the page's path.
    """
    target = Path(out) if out is not None else Path(run_dir)
    summary = write_report(run_dir, target)
    folder = Path(run_dir)
    if is_stage_run(folder):
        body = _stage_body(folder, summary)
    else:
        body = _run_body(RunDir(folder), summary)
    page = _page(summary.title or f"opto run {folder.resolve().name}", body)
    path = target / "report.html"
    atomic_write_text(path, page)
    return summary.model_copy(update={"html": str(path)})


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{_e(title)}</title>'
        f"<style>{_STYLE}</style></head><body>\n<h1>{_e(title)}</h1>\n{body}\n"
        f"<script>{_SCRIPT}</script></body></html>\n"
    )


def _run_body(run: RunDir, summary: ReportSummary) -> str:
    ledger = run.ledger()
    checkpoint = _checkpoint(run)
    metrics = {int(m["step"]): m for m in read_jsonl(run.metrics_path) if not m.get("final") and "step" in m}
    parts = [
        f"<p>{summary.steps} steps: {summary.accepted} accepted, {summary.rejected} rejected"
        + (
            f"; test score {summary.first_test_score:.3f} &rarr; {summary.last_test_score:.3f}"
            if _both(summary)
            else ""
        )
        + ".</p>",
        *(
            [f'<p class="why"><strong>What was returned:</strong> {_e(summary.final_check)}</p>']
            if summary.final_check
            else []
        ),
        *([f'<p class="why"><strong>Why:</strong> {_e(summary.diagnosis)}</p>'] if summary.diagnosis else []),
        *_estimate(run, checkpoint),
        "<h2>Learning curve</h2>",
        _image(Path(summary.png), "learning curve: batch, candidate and test scores with 95% intervals", summary),
    ]
    parts.append("<h2>Lineage</h2>")
    if summary.lineage_png:
        parts.append(_image(Path(summary.lineage_png), "lineage of the Pareto pool", summary))
    elif summary.plot_skipped and any(r.get("type") == "pool" for r in ledger):  # a Pareto run, not drawn
        parts.append(_image(None, "lineage of the Pareto pool", summary))
    else:
        parts.append('<p class="muted">Greedy selection: each step starts from the values the last accepted '
                     "step left; the steps below are one line.</p>")  # fmt: skip
    parts += [
        "<h2>Steps</h2>",
        '<p><button data-open="1">open all</button><button data-open="0">close all</button></p>',
    ]
    parts += _steps(ledger, checkpoint, metrics)
    start = checkpoint.get("initial_parameters") or {}
    end = checkpoint.get("parameters") or {}
    parts += ["<h2>Values</h2>", "<h3>At the start</h3>", _values(start), "<h3>At the end</h3>", _values(end)]
    return "\n".join(parts)


def _steps(ledger: list[dict[str, Any]], checkpoint: dict[str, Any], metrics: dict[int, dict[str, Any]]) -> list[str]:
    current = dict(checkpoint.get("initial_parameters") or {})
    pool: dict[str, dict[str, Any]] = {}
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in ledger:
        by_step.setdefault(int(record.get("step") or 0), []).append(record)
    previous = {"calls": 0, "tokens": 0, "cost_usd": 0.0}
    parts = []
    for step in sorted(s for s in by_step if s > 0):
        records = by_step[step]
        for record in records:
            if record.get("type") == "pool":
                pool[record["candidate_id"]] = record.get("values") or {}
        parent = next((r for r in records if r.get("type") == "parent"), None)
        start = pool.get(parent["candidate_id"], current) if parent else current
        decisions = {r.get("candidate_id"): r for r in records if r.get("type") == "decision"}
        candidates = [r for r in records if r.get("type") == "candidate" and r.get("final", True)]
        step_metrics = metrics.get(step, {})
        used = {key: (step_metrics.get(key) or 0) - previous[key] for key in previous}
        previous = {key: step_metrics.get(key) or previous[key] for key in previous}
        accepted = step_metrics.get("accepted")
        outcome = "none" if accepted is None else ("accepted" if accepted else "rejected")
        heading = (
            f'Step {step}: <span class="{outcome}">{"no candidate" if outcome == "none" else outcome}</span>'
            f" &middot; batch score {_num(step_metrics.get('score'))}"
            f" &middot; {used['calls']} calls, {used['tokens']} tokens, ${used['cost_usd']:.4f}"
        )
        origin = f"pool member {_e(parent['candidate_id'])}" if parent else "the current values"
        inner = [f'<p class="muted">Parent: {origin}.</p>']
        for candidate in candidates:
            inner.append(_candidate(candidate, decisions.get(candidate.get("candidate_id")), start))
        for reason in (d.get("reason") for key, d in decisions.items() if key is None):
            inner.append(f'<p class="none">{_e(reason or "no candidate")}</p>')
        for error in (r for r in records if r.get("type") == "aggregate_error"):
            inner.append(f'<p class="rejected">Aggregator failed: {_e(error.get("error", ""))}</p>')
        parts.append(f"<details><summary>{heading}</summary>\n" + "\n".join(inner) + "\n</details>")
        for record in records:
            if record.get("type") == "applied":
                current.update(record.get("update") or {})
    if not parts:
        parts.append('<p class="muted">No step has finished yet.</p>')
    return parts


def _candidate(candidate: dict[str, Any], decision: dict[str, Any] | None, start: dict[str, Any]) -> str:
    name = _e(candidate.get("candidate_id") or "?")
    if decision is None:
        verdict, cls = "not decided", "none"
    else:
        verdict, cls = ("accepted", "accepted") if decision.get("accepted") else ("rejected", "rejected")
    rows = [
        ("decision", f'<span class="{cls}">{verdict}</span>'),
        ("current score", _num((decision or {}).get("current_score"))),
        ("candidate score", _num((decision or {}).get("candidate_score"))),
    ]
    if decision and decision.get("difference") is not None:
        interval = decision.get("difference_interval")
        shown = f"{decision['difference']:+.3f}" + (f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else "")
        if decision.get("p_value") is not None:
            shown += f", p = {decision['p_value']:.3g} ({_e(decision.get('test') or '')})"
        rows.append(("difference (95% interval)", shown))
    if decision and decision.get("reason"):
        rows.append(("reason", _e(decision["reason"])))
    if candidate.get("error"):
        rows.append(("error", _e(candidate["error"])))
    table = "<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
    diffs = [
        f'<p><b>{_e(key)}</b></p><div class="diff">{word_diff(start.get(key), value)}</div>'
        for key, value in (candidate.get("update") or {}).items()
    ]
    reasoning = candidate.get("reasoning")
    why = f'<p class="muted">Reasoning: {_e(reasoning)}</p>' if reasoning else ""
    body = "".join(diffs) or '<p class="muted">The candidate changes nothing.</p>'
    return f"<h4>Candidate {name}</h4>{table}{why}{body}"


def word_diff(old: Any, new: Any) -> str:
    """`old` -> `new` as escaped HTML, removed words in `<del>` and added ones in `<ins>`."""
    before, after = _text(old), _text(new)
    a, b = re.split(r"(\s+)", before), re.split(r"(\s+)", after)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out.append(_e("".join(a[i1:i2])))
            continue
        removed, added = "".join(a[i1:i2]), "".join(b[j1:j2])
        if removed:
            out.append(f"<del>{_e(removed)}</del>")
        if added:
            out.append(f"<ins>{_e(added)}</ins>")
    return "".join(out)


def _stage_body(folder: Path, summary: ReportSummary) -> str:
    rows = []
    for line in read_stages(folder):
        low, high = line.get("test_interval") or (None, None)
        rows.append(
            f'<tr><td>{_e(line["stage"])}</td><td class="num">{_num(line.get("test_accuracy"))}</td>'
            f'<td class="num">[{_num(low)}, {_num(high)}]</td>'
            f'<td class="num">{_e(str(line.get("prompt_tokens_per_call", "")))}</td>'
            f'<td class="num">{_e(str(line.get("calls", "")))}</td><td>{_e(str(line.get("model", "")))}</td>'
            f"<td>{_e(kept_text(line))}</td></tr>"
        )
    table = (
        "<table><tr><th>stage</th><th>test accuracy</th><th>95% interval</th><th>prompt tokens per call</th>"
        "<th>calls</th><th>model</th><th>kept</th></tr>" + "".join(rows) + "</table>"
    )
    return "\n".join(["<h2>Stages</h2>", _image(Path(summary.png), "test accuracy by stage", summary), table])


def _estimate(run: RunDir, checkpoint: dict[str, Any]) -> list[str]:
    """The cost estimated before the run (`train(confirm=...)`) beside what it spent."""
    rows = estimate_rows(run, checkpoint)
    if not rows:
        return []
    cells = "".join(
        f'<tr><td>{what}</td><td class="num">{estimated}</td><td class="num">{spent}</td></tr>'
        for what, estimated, spent in rows
    )
    return [
        "<h2>Cost</h2>",
        f"<table><tr><th>cost</th><th>estimated before the run</th><th>spent</th></tr>{cells}</table>",
    ]


def _image(path: Path | None, alt: str, summary: ReportSummary) -> str:
    if summary.plot_skipped:  # not this report's picture, even if an older one lies there
        return f'<p class="muted">({_e(alt)}: not drawn; {_e(summary.plot_skipped)})</p>'
    if path is None or not path.exists():
        return f'<p class="muted">({_e(alt)}: not drawn)</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _values(values: dict[str, Any]) -> str:
    if not values:
        return '<p class="muted">(not recorded)</p>'
    return f'<div class="diff">{_e(json.dumps(values, indent=2, ensure_ascii=False))}</div>'


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False)


def _both(summary: ReportSummary) -> bool:
    return summary.first_test_score is not None and summary.last_test_score is not None


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
