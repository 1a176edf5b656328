"""`opto report` after the quick-start install (`.[local]`, no matplotlib): the Markdown
report (and the `--html` page) still come out, without pictures, and one line names the
`report` extra that adds them. matplotlib's absence is simulated: a `None` entry in
`sys.modules` makes `import matplotlib` raise ImportError."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from world import dataset, make_level_trainer

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, ScriptedModel
from opto.cli import main
from opto.report.markdown import PLOT_SKIPPED, write_report
from opto.report.html import write_html_report

EXTRA = 'pip install "opto-agents[report]"'


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide matplotlib, and any of its submodules an earlier test imported, for one test."""
    names = {"matplotlib", "matplotlib.pyplot", "matplotlib.ticker", "matplotlib.image"}
    names |= {name for name in sys.modules if name.startswith("matplotlib.")}
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError):
        import matplotlib  # noqa: F401


@pytest.fixture(scope="module")
def level_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished greedy run with test scores: four accepted steps."""
    path = tmp_path_factory.mktemp("level-run")
    trainer, *_ = make_level_trainer()
    trainer.train(
        ExactMatchGuide(),
        dataset([0, 1, 2, 3]),
        test_dataset=dataset([0, 1, 5]),
        eval_frequency=2,
        run_dir=path,
        progress=False,
        shuffle=False,
    )
    return path


class Digits(Agent):
    """Right ("4") once its prompt mentions digits."""

    def __init__(self) -> None:
        self.prompt = Parameter("Answer the question.", description="system prompt")

    def forward(self, question: str) -> str:
        return "4" if "digits" in self.prompt.value else "four"


@pytest.fixture(scope="module")
def pareto_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Pareto run of three steps, with a pool whose lineage would be drawn."""
    proposals = itertools.cycle(["Answer briefly.", "Answer in digits."])
    brain = ScriptedModel(lambda messages: json.dumps({"reasoning": "r", "suggestion": {"prompt": next(proposals)}}))
    data = [(f"{i}+{4 - i}", "4") for i in range(5)]
    trainer = AggregatedUpdate(Digits(), Optimizer(brain), validation=data, selection="pareto")
    path = tmp_path_factory.mktemp("pareto-run") / "run"
    trainer.train(ExactMatchGuide(), data, test_dataset=data, batch_size=2, run_dir=path, progress=False)
    return path


def skip_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "skipped" in line]


@pytest.mark.usefixtures("no_matplotlib")
def test_the_markdown_report_comes_out_and_one_line_names_the_extra(
    level_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(level_run), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert skip_lines(out) == [PLOT_SKIPPED] and EXTRA in PLOT_SKIPPED and "matplotlib" in PLOT_SKIPPED
    assert f"wrote {tmp_path / 'report.md'}\n" in out and "report.png" not in out  # only what was written
    assert "steps: 4  accepted: 4" in out
    table = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4 and "| 1 | 0.000 | accepted |" in table[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


@pytest.mark.usefixtures("no_matplotlib")
def test_the_summary_says_no_picture_was_drawn(level_run: Path, tmp_path: Path) -> None:
    summary = write_report(level_run, tmp_path)
    assert summary.plot_skipped == PLOT_SKIPPED and summary.plotted_points == {} and summary.legend == []
    assert not Path(summary.png).exists() and Path(summary.markdown).exists()
    assert summary.first_test_score is not None and summary.steps == 4  # the figures do not need the picture


@pytest.mark.usefixtures("no_matplotlib")
def test_the_html_page_comes_out_without_pictures(
    pareto_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(pareto_run), "--out", str(tmp_path), "--html"]) == 0
    out = capsys.readouterr().out
    assert skip_lines(out) == [PLOT_SKIPPED]
    assert f"wrote {tmp_path / 'report.md'} and {tmp_path / 'report.html'}\n" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "report.md"]  # no lineage.png either
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "data:image/png" not in page and page.count("opto-agents[report]") == 2  # curve and lineage
    assert "lineage of the Pareto pool: not drawn" in page and "Greedy selection" not in page
    assert page.count("<details>") == 3  # every step is still there


@pytest.mark.usefixtures("no_matplotlib")
def test_an_old_picture_in_the_folder_is_not_shown_as_this_reports(level_run: Path, tmp_path: Path) -> None:
    (tmp_path / "report.png").write_bytes(b"\x89PNG stale")
    page = Path(write_html_report(level_run, tmp_path).html).read_text(encoding="utf-8")
    assert "data:image/png" not in page and "opto-agents[report]" in page


@pytest.mark.usefixtures("no_matplotlib")
def test_a_prompts_then_weights_run_gets_its_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "pipeline.json").write_text("{}")
    stages = [
        {
            "step": i,
            "stage": name,
            "test_accuracy": accuracy,
            "test_interval": [accuracy - 0.1, accuracy + 0.1],
            "prompt_tokens_per_call": 40.0,
            "calls": 6,
            "seconds": 1.5,
            "model": "base",
            "parameters": {"system_prompt": "Answer.", "demos": []},
        }
        for i, (name, accuracy) in enumerate([("zero-shot", 0.2), ("prompt", 0.6)])
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in stages))
    assert main(["report", str(run), "--html"]) == 0
    out = capsys.readouterr().out
    assert skip_lines(out) == [PLOT_SKIPPED] and "stages: zero-shot, prompt" in out
    assert "| prompt | 60.0% |" in (run / "report.md").read_text()
    assert not (run / "report.png").exists() and "opto-agents[report]" in (run / "report.html").read_text()


def test_with_matplotlib_the_picture_is_drawn_and_nothing_is_skipped(
    level_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the report extra draws the pictures")
    assert main(["report", str(level_run), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'report.png'} and {tmp_path / 'report.md'}\n" in out and skip_lines(out) == []
    assert write_report(level_run, tmp_path).plot_skipped is None
    assert (tmp_path / "report.png").stat().st_size > 1000
