"""`opto report`: a run's learning curve as a picture and its steps as a Markdown summary.

Reads whatever a run directory holds (a finished, stopped or still-running run, and
ledgers written by older versions): `metrics.jsonl` for scores and cost, the ledger for
each step's decision, `checkpoint.json` for the values. Writes `report.png` (matplotlib,
no display needed) and `report.md`. matplotlib comes with the `report` extra: without it
only `report.md` is written and `ReportSummary.plot_skipped` says how to add the picture.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .._util.files import atomic_write_text, read_jsonl
from ..errors import MissingFileError
from ..run.ledger import RunDir, read_json_object
from ..run.results import FinalCheckResult
from ..trainer.diagnosis import best_rejected_win, is_rejected_win, summarize
from .stages import is_stage_run, stage_report

__all__ = ["PLOT_SKIPPED", "ReportSummary", "write_report"]


class ReportSummary(BaseModel):
    """What `write_report` wrote and the figures it found."""

    png: str
    markdown: str
    steps: int
    accepted: int
    rejected: int
    first_test_score: float | None = None
    last_test_score: float | None = None
    plotted_points: dict[str, int] = Field(default_factory=dict)
    title: str = ""
    legend: list[str] = Field(default_factory=list)
    # MinibatchFirst: candidates rejected on their batch, and the validation rollouts saved.
    screened_out: int = 0
    rollouts_saved: int = 0
    # Pareto selection: `lineage.png`, the pool's candidates and which came from which.
    lineage_png: str | None = None
    lineage_nodes: int = 0
    lineage_edges: int = 0
    # Pareto selection with a cost objective: `score_vs_cost.png`, each candidate's mean
    # validation score against its mean cost per rollout.
    cost_png: str | None = None
    # A prompts-then-weights run: its finished stages, in order (None for a training run).
    stages: list[str] | None = None
    # `opto report --html`: the self-contained page.
    html: str | None = None
    # Set when no picture was drawn (matplotlib is not installed): why, and the extra that
    # adds it. `png` then names where the picture would have gone; it was not written.
    plot_skipped: str | None = None
    # Why nothing was accepted, or why a candidate that scored above the current values was
    # rejected (`opto.trainer.diagnosis`, from the ledger's decisions); None: nothing to say.
    diagnosis: str | None = None
    # How the values the run returned were checked against the start, with the gap between
    # the search's own score and the check's (`FinalCheckResult.summary()`); None: no check.
    final_check: str | None = None
    # The agent's rollouts the ledger holds, by phase (a logged step's records, judged and
    # not run, left out), and those the checkpoint counts as made: every paid rollout is
    # on the record when the two agree (`reconciled`; None for a run without a checkpoint).
    ledger_rollouts: dict[str, int] = Field(default_factory=dict)
    counted_rollouts: int | None = None
    reconciled: bool | None = None


# The quick-start install (`.[local]`) has no matplotlib: the report still gives the
# Markdown, and says in one line how to get the picture.
PLOT_SKIPPED = 'plot skipped: matplotlib is not installed; pip install "opto-agents[report]" adds it'


def _plot_skipped() -> str | None:
    """`PLOT_SKIPPED` when matplotlib cannot be imported, else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return PLOT_SKIPPED
    return None


def write_report(run_dir: str | Path, out: str | Path | None = None) -> ReportSummary:
    """Write `report.png` and `report.md` for the run in `run_dir` (into `out`, default the run dir).

    For a prompts-then-weights run (`opto demo --finetune`) the picture has one bar per
    stage (`ReportSummary.stages`). Without matplotlib no picture is drawn (`report.md`
    only) and `ReportSummary.plot_skipped` says so."""
    if Path(run_dir).is_dir() and is_stage_run(Path(run_dir)):
        return _stages(Path(run_dir), Path(out) if out is not None else Path(run_dir))
    run = RunDir(run_dir) if Path(run_dir).is_dir() else None
    if run is None or not (run.metrics_path.exists() or run.ledger_path.exists()):
        raise MissingFileError(f"{run_dir} holds no opto run (no metrics.jsonl or ledger.jsonl)")
    target = Path(out) if out is not None else run.path
    if not target.is_dir():
        raise MissingFileError(f"--out {target} is not a folder; create it first")
    metrics = read_jsonl(run.metrics_path)
    steps = [m for m in metrics if not m.get("final")]
    finals = [m for m in metrics if m.get("final")]
    ledger = run.ledger()  # read once: the decisions, the markdown and the pool all come from it
    decisions = _decisions_by_step(ledger)
    screened = _screening(decisions)
    checkpoint = _checkpoint(run)
    tests = [(m["step"], m["test_score"]) for m in steps if m.get("test_score") is not None]
    tests += [(m["step"], m["test_score"]) for m in finals if m.get("test_score") is not None]
    if checkpoint.get("test_scores"):
        tests = sorted({(int(s), v) for s, v in checkpoint["test_scores"] if v is not None})
    intervals = {int(step): found for step, found in (checkpoint.get("test_intervals") or {}).items() if found}
    for m in [*steps, *finals]:  # a run written before the checkpoint kept them: the metrics lines
        if m.get("test_interval"):
            intervals.setdefault(int(m["step"]), m["test_interval"])
    png = target / "report.png"
    title = f"opto run {run.path.resolve().name}"
    if tests:
        title += f": test score {tests[0][1]:.3f} \u2192 {tests[-1][1]:.3f}"
    skipped = _plot_skipped()
    points, legend = ({}, []) if skipped else _plot(png, steps, tests, title, intervals)
    markdown = target / "report.md"
    accepted = sum(1 for m in steps if m.get("accepted") is True)
    rejected = sum(1 for m in steps if m.get("accepted") is False)
    diagnosis = _diagnosis(decisions, len(steps), accepted, sum(1 for m in steps if m.get("accepted") is None))
    checked = FinalCheckResult.model_validate(checkpoint["final_check"]) if checkpoint.get("final_check") else None
    final_check = checked.summary() if checked is not None else None
    phases, counted = ledger_rollouts(ledger), checkpoint.get("rollouts")
    atomic_write_text(
        markdown,
        _markdown(
            run.path,
            steps,
            tests,
            decisions,
            checkpoint,
            ledger,
            intervals,
            screened,
            diagnosis,
            final_check,
            _reconciliation(phases, counted),
        ),  # fmt: skip
    )
    pool = [r for r in ledger if r.get("type") == "pool"]
    lineage = _lineage(target / "lineage.png", pool, decisions) if pool and not skipped else None
    costed = [e for e in pool if (e.get("costs") or {}).get("cost") is not None] if not skipped else []
    if costed:
        _score_vs_cost(target / "score_vs_cost.png", costed)
    return ReportSummary(
        png=str(png),
        markdown=str(markdown),
        steps=len(steps),
        accepted=accepted,
        rejected=rejected,
        first_test_score=tests[0][1] if tests else None,
        last_test_score=tests[-1][1] if tests else None,
        plotted_points=points,
        title=title,
        legend=legend,
        screened_out=screened[1],
        rollouts_saved=screened[2],
        lineage_png=str(target / "lineage.png") if lineage else None,
        lineage_nodes=lineage[0] if lineage else 0,
        lineage_edges=lineage[1] if lineage else 0,
        cost_png=str(target / "score_vs_cost.png") if costed else None,
        plot_skipped=skipped,
        diagnosis=diagnosis,
        final_check=final_check,
        ledger_rollouts=phases,
        counted_rollouts=counted,
        reconciled=None if counted is None else sum(phases.values()) == counted,
    )


def _diagnosis(decisions: dict[int, list[dict[str, Any]]], steps: int, accepted: int, no_update: int) -> str | None:
    """The run's diagnosis, as `TrainResult.diagnosis` gives it, from the ledger's decisions."""
    found = [{**d, "step": step} for step, those in decisions.items() for d in those]
    wins = [d for d in found if is_rejected_win(d)]
    return summarize(
        steps=steps, accepted=accepted, no_update=no_update, rejected_wins=len(wins), best=best_rejected_win(wins)
    )


def _stages(folder: Path, target: Path) -> ReportSummary:
    if not target.is_dir():
        raise MissingFileError(f"--out {target} is not a folder; create it first")
    skipped = _plot_skipped()
    png, markdown, stages = stage_report(folder, target, draw=skipped is None)
    return ReportSummary(
        png=str(png),
        markdown=str(markdown),
        steps=len(stages),
        accepted=0,
        rejected=0,
        first_test_score=stages[0]["test_accuracy"] if stages else None,
        last_test_score=stages[-1]["test_accuracy"] if stages else None,
        plotted_points={"stages": len(stages)},
        title=f"prompts, then weights: {folder.name}",
        stages=[s["stage"] for s in stages],
        plot_skipped=skipped,
    )


def _score_vs_cost(path: Path, pool: list[dict[str, Any]]) -> None:
    """Each candidate's mean validation score against its mean cost per rollout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5), dpi=100)
    for entry in pool:
        x, y = entry["costs"]["cost"], entry.get("pool_mean") or 0.0
        ax.scatter([x], [y], color="tab:blue", zorder=3)
        ax.annotate(entry["candidate_id"][:6], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("mean cost per validation rollout (USD, or tokens without prices)")
    ax.set_ylabel("validation mean")
    ax.set_title("candidates: score against cost")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _lineage(path: Path, pool: list[dict[str, Any]], decisions: dict[int, list[dict[str, Any]]]) -> tuple[int, int]:
    """Draw the Pareto pool's lineage: each candidate at (step, validation mean), an arrow
    from its parent (dashed from a merge's second parent), green if it was accepted.
    Returns (candidates drawn, arrows drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    verdict = {d.get("candidate_id"): d.get("accepted") for found in decisions.values() for d in found}
    by_step: dict[int, list[str]] = {}
    for entry in pool:
        by_step.setdefault(int(entry.get("from_step", 0)), []).append(entry["candidate_id"])
    where: dict[str, tuple[float, float]] = {}
    for entry in pool:  # candidates of one step side by side, not on top of each other
        step, peers = int(entry.get("from_step", 0)), by_step[int(entry.get("from_step", 0))]
        offset = (peers.index(entry["candidate_id"]) - (len(peers) - 1) / 2) * 0.25 / max(1, len(peers) - 1) ** 0.5
        where[entry["candidate_id"]] = (step + offset, entry.get("pool_mean") or 0.0)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    arrows = 0
    for entry in pool:
        x, y = where[entry["candidate_id"]]
        for parent, style in ((entry.get("parent_id"), "-"), (entry.get("merge_parent_id"), "--")):
            if parent in where:
                px, py = where[parent]
                ax.annotate(
                    "",
                    xy=(x, y),
                    xytext=(px, py),
                    arrowprops={"arrowstyle": "->", "linestyle": style, "color": "tab:gray"},
                )
                arrows += 1
        accepted = verdict.get(entry["candidate_id"])
        color = "black" if accepted is None else ("tab:green" if accepted else "tab:red")
        ax.scatter([x], [y], color=color, marker="o" if accepted is not False else "x", zorder=3)
        ax.annotate(entry["candidate_id"][:6], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("validation mean")
    ax.set_title("candidate lineage (green: accepted, red: rejected, black: the start; dashed: merged from)")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return len(pool), arrows


def _screening(decisions: dict[int, list[dict[str, Any]]]) -> tuple[int, int, int]:
    """MinibatchFirst's figures: (candidates screened, rejected on their batch, validation rollouts saved)."""
    staged = [d for found in decisions.values() for d in found if d.get("stage")]
    out = [d for d in staged if d.get("stage") == "minibatch"]
    return len(staged), len(out), sum(int(d.get("rollouts_saved") or 0) for d in out)


def ledger_rollouts(ledger: list[dict[str, Any]]) -> dict[str, int]:
    """The rollouts in the ledger by phase, as the run counts them (a logged step's
    records, judged and not run again, count as its rollouts; `opto.collect`'s samples
    are not a training run's)."""
    phases: dict[str, int] = {}
    for record in ledger:
        if record.get("type") == "rollout" and record.get("phase") != "collect":
            phases[record["phase"]] = phases.get(record["phase"], 0) + 1
    return phases


def _reconciliation(phases: dict[str, int], counted: int | None) -> list[str]:
    if counted is None:
        return []
    listed = ", ".join(f"{phase} {n}" for phase, n in phases.items())
    found = sum(phases.values())
    verdict = "they agree" if found == counted else f"{counted - found:+d} not in the ledger"
    return [f"Rollouts: {found} in the ledger ({listed or 'none'}), {counted} counted: {verdict}.", ""]


def _checkpoint(run: RunDir) -> dict[str, Any]:
    try:
        return json.loads(run.checkpoint_path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _decisions_by_step(ledger: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    found: dict[int, list[dict[str, Any]]] = {}
    for record in ledger:
        if record.get("type") == "decision":
            found.setdefault(int(record.get("step", 0)), []).append(record)
    return found


def _plot(
    path: Path,
    steps: list[dict[str, Any]],
    tests: list[tuple[int, float]],
    title: str,
    intervals: dict[int, list[float]],
) -> tuple[dict[str, int], list[str]]:
    """Draw the learning curve; returns the points of each series and the legend's labels."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    points: dict[str, int] = {}
    train = [(m["step"], m["score"]) for m in steps if m.get("score") is not None]
    if train:
        ax.plot(*zip(*train), "o-", color="tab:blue", label="train batch score")
        points["train"] = len(train)
    if tests:
        ax.plot(*zip(*tests), "s--", color="tab:green", label="test score")
        points["test"] = len(tests)
        bars = [(s, v, intervals[s]) for s, v in tests if s in intervals]
        if bars:  # the 95% interval of each test score
            ax.errorbar(
                [s for s, _, _ in bars],
                [v for _, v, _ in bars],
                yerr=[[v - i[0] for _, v, i in bars], [i[1] - v for _, v, i in bars]],
                fmt="none",
                ecolor="tab:green",
                capsize=4,
                label="test score 95% interval",
            )
            points["test_intervals"] = len(bars)
    for outcome, marker, color, label in ((True, "^", "tab:green", "accepted"), (False, "x", "tab:red", "rejected")):
        marked = [
            (m["step"], m.get("candidate_score") if m.get("candidate_score") is not None else m.get("score"))
            for m in steps
            if m.get("accepted") is outcome
        ]
        marked = [(s, v) for s, v in marked if v is not None]
        if marked:
            xs, ys = [s for s, _ in marked], [float(v) for _, v in marked if v is not None]
            ax.scatter(xs, ys, marker=marker, s=80, color=color, label=f"{label} (candidate score)", zorder=3)
            points[label] = len(marked)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("score")
    handles, labels = ax.get_legend_handles_labels()
    tokens = [(m["step"], m.get("tokens") or 0) for m in steps]
    if tokens:
        cost = ax.twinx()
        cost.plot(*zip(*tokens), ":", color="tab:gray", label="tokens so far (right axis)")
        cost.set_ylabel("tokens so far")
        points["tokens"] = len(tokens)
        more_handles, more_labels = cost.get_legend_handles_labels()  # the twin axis keeps its own
        handles, labels = handles + more_handles, labels + more_labels
    rows = -(-len(labels) // 3)
    if handles:  # below the axes, where no line crosses it, three entries a row
        fig.legend(handles, labels, loc="lower center", ncol=min(3, len(labels)), fontsize=8, frameon=False)
    ax.set_title(title)
    fig.tight_layout(rect=(0, 0.045 * rows, 1, 1))
    fig.savefig(path)
    plt.close(fig)
    return points, labels


def estimate_rows(run: RunDir, checkpoint: dict[str, Any]) -> list[tuple[str, str, str]]:
    """`train(confirm=...)`'s estimate (estimate.json) beside what the run spent, as
    (what, estimated, spent) rows; none without an estimate."""
    if not run.estimate_path.exists():
        return []
    estimate = read_json_object(run.estimate_path)
    used = list((checkpoint.get("usage") or {}).values())
    tokens = sum(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0) for u in used)
    usd = estimate.get("usd")
    return [
        ("calls", str(estimate["calls"]), str(sum(u.get("calls", 0) for u in used))),
        ("tokens", str(estimate["prompt_tokens"] + estimate["completion_tokens"]), str(tokens)),
        ("dollars", "unknown" if usd is None else f"{usd:.4f}", f"{sum(u.get('cost_usd', 0.0) for u in used):.4f}"),
    ]


def _estimate_table(path: Path, checkpoint: dict[str, Any]) -> list[str]:
    rows = estimate_rows(RunDir(path), checkpoint)
    if not rows:
        return []
    lines = ["| cost | estimated before the run | spent |", "|---|---:|---:|"]
    return [*lines, *(f"| {what} | {estimated} | {spent} |" for what, estimated, spent in rows), ""]


def _markdown(
    path: Path,
    steps: list[dict[str, Any]],
    tests: list[tuple[int, float]],
    decisions: dict[int, list[dict[str, Any]]],
    checkpoint: dict[str, Any],
    ledger: list[dict[str, Any]],
    intervals: dict[int, list[float]],
    screening: tuple[int, int, int],
    diagnosis: str | None = None,
    final_check: str | None = None,
    reconciliation: list[str] | None = None,
) -> str:
    lines = [f"# Run report: {path}", ""]
    state = "finished" if checkpoint.get("finished") else "not finished (stopped or still running)"
    lines += [f"{len(steps)} steps, {state}.", ""]
    failed = {int(step): n for step, n in (checkpoint.get("test_failed") or {}).items()}
    if tests:
        shown = [
            f"step {s}: {v:.3f}"
            + (f" [{intervals[s][0]:.3f}, {intervals[s][1]:.3f}]" if s in intervals else "")
            + (f" ({failed[s]} failed)" if failed.get(s) else "")
            for s, v in tests
        ]
        lines += ["Test scores (95% intervals in brackets): " + ", ".join(shown), ""]
    if sum(checkpoint.get("train_failed") or []) or any(failed.values()):
        lines += [
            f"Failed rollouts (the agent or guide raised; each scored as min_score in the means): "
            f"{sum(checkpoint.get('train_failed') or [])} in training batches, "
            f"{sum(failed.values())} in test evaluations.",
            "",
        ]
    if final_check:
        lines += [f"**What was returned:** {final_check}", ""]
    if diagnosis:
        lines += [f"**Why:** {diagnosis}", ""]
    lines += _estimate_table(path, checkpoint)
    lines += reconciliation or []
    screened, out, saved = screening
    if screened:
        lines += [
            f"Minibatch-first: {out} of {screened} candidates lost on their batch and were not validated on "
            f"the dataset, saving {saved} validation rollouts.",
            "",
        ]
    lines += [
        "| step | score | decision | reason | candidate score | calls | tokens | cost (USD) |",
        "|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    previous: dict[str, Any] = {"calls": 0, "tokens": 0, "cost_usd": 0.0}
    for m in steps:
        decision = {True: "accepted", False: "rejected", None: "no candidate"}[m.get("accepted")]
        reasons = "; ".join(str(d.get("reason", "")) for d in decisions.get(int(m["step"]), []))
        reason = reasons.replace("|", "/")[:120]
        lines.append(
            f"| {m['step']} | {_num(m.get('score'))} | {decision} | {reason} | {_num(m.get('candidate_score'))} | "
            f"{(m.get('calls') or 0) - previous['calls']} | {(m.get('tokens') or 0) - previous['tokens']} | "
            f"{(m.get('cost_usd') or 0.0) - previous['cost_usd']:.4f} |"
        )
        previous = {key: m.get(key) or 0 for key in previous}
    lines += ["", "## Parameter values", ""]
    start = checkpoint.get("initial_parameters") or {}
    end = checkpoint.get("parameters") or {}
    lines += ["**At the start**", "", _values(start) if start else "(not recorded by this version)", ""]
    best = checkpoint.get("best")
    if best:
        lines += [
            f"**At the best validation score** ({best['score']:.3f}, step {best['step']})",
            "",
            _values(best["parameters"]),
            "",
        ]
    lines += ["**At the end**", "", _values(end) if end else "(no checkpoint yet)", ""]
    applied = [r for r in ledger if r.get("type") == "applied"]
    if applied:
        lines += ["## What each accepted step changed", ""]
        current = dict(start)
        for record in applied:
            lines.append(f"**Step {record.get('step')}**")
            lines.append("")
            for name, value in (record.get("update") or {}).items():
                lines += _diff(name, current.get(name), value)
                current[name] = value
            lines.append("")
    return "\n".join(lines) + "\n"


def _diff(name: str, old: Any, new: Any) -> list[str]:
    old_text = old if isinstance(old, str) else json.dumps(old, indent=1, ensure_ascii=False)
    new_text = new if isinstance(new, str) else json.dumps(new, indent=1, ensure_ascii=False)
    diff = difflib.unified_diff(
        (old_text or "").splitlines(), new_text.splitlines(), f"{name} before", f"{name} after", lineterm=""
    )
    return ["```diff", *diff, "```"]


def _values(values: dict[str, Any]) -> str:
    return "```json\n" + json.dumps(values, indent=2, ensure_ascii=False) + "\n```"


def _num(value: Any) -> str:
    return "" if value is None else f"{value:.3f}"
