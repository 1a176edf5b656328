"""`opto report RUN --html`: one self-contained page, loaded in a real headless Chromium
(Debian's package; `.ci/run` installs it) without console errors, and not blank."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, ScriptedModel
from opto.cli import main
from opto.report.html import word_diff, write_html_report

pytest.importorskip("matplotlib", reason="the report extra draws the pictures")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = "Answer in digits <script>alert('x')</script> & \"quote\""


class Digits(Agent):
    def __init__(self) -> None:
        self.prompt = Parameter("Answer the question.", description="system prompt")

    def forward(self, question: str) -> str:
        return "4" if "digits" in self.prompt.value else "four"


def make_run(folder: Path, selection: str = "pareto") -> Path:
    proposals = itertools.cycle(["Answer briefly.", HOSTILE])
    brain = ScriptedModel(lambda messages: json.dumps({"reasoning": "r", "suggestion": {"prompt": next(proposals)}}))
    data = [(f"{i}+{4 - i}", "4") for i in range(5)]
    trainer = AggregatedUpdate(Digits(), Optimizer(brain), validation=data, selection=selection)
    run = folder / "run"
    trainer.train(ExactMatchGuide(), data, test_dataset=data, batch_size=2, run_dir=run, progress=False)
    return run


def test_the_page_shows_each_step_with_diffs_decisions_and_escapes_model_text(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    summary = write_html_report(run)
    page = Path(summary.html).read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and summary.html == str(run / "report.html")
    # self-contained: nothing fetched from anywhere
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.IGNORECASE)
    assert "<link" not in page and "<iframe" not in page
    assert page.count('src="data:image/png;base64,') == 2  # the learning curve and the lineage
    # every step, its decision, its candidate's diff against its parent
    assert page.count("<details>") == summary.steps == 3
    assert 'class="rejected">rejected' in page and 'class="accepted">accepted' in page
    assert word_diff("Answer the question.", "Answer briefly.") in page  # step 1's candidate, against the start
    assert "Parent: pool member" in page
    # model text is data: escaped, never a live script
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # opto's own: open or close every step


def test_word_diff_marks_removed_and_added_words_and_escapes_them() -> None:
    assert word_diff("Answer the question.", "Answer in <b>digits</b>.") == (
        "Answer <del>the</del><ins>in</ins> <del>question.</del><ins>&lt;b&gt;digits&lt;/b&gt;.</ins>"
    )
    assert word_diff(None, {"k": 1}) == "<ins>{\n &quot;k&quot;: 1\n}</ins>"


def test_the_cli_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path, selection="greedy")
    assert main(["report", str(run), "--html", "--out", str(tmp_path)]) == 0
    assert "report.html" in capsys.readouterr().out
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "Greedy selection" in page and page.count('src="data:image/png;base64,') == 1


def _load_in_chromium(page: Path, folder: Path) -> tuple[list[str], Path]:
    """Chromium's console lines for `page`, and a screenshot of it."""
    shot = folder / f"{page.stem}.png"
    done = subprocess.run(
        [
            str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={folder / ('profile-' + page.stem)}", "--enable-logging=stderr", "--v=0",
            "--window-size=1200,1600", f"--screenshot={shot}", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and shot.exists(), done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if ":CONSOLE" in line], shot


def _ink(png: Path) -> float:
    """The share of the screenshot's pixels that are not background white."""
    from matplotlib.image import imread

    pixels = imread(png)[..., :3]
    return float((pixels.min(axis=-1) < 0.9).mean())


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)")
def test_the_page_loads_in_headless_chromium_without_console_errors(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    page = Path(write_html_report(run).html)
    console, shot = _load_in_chromium(page, tmp_path)
    assert console == []
    assert _ink(shot) > 0.02  # text, tables and the curve, not a blank page
    # the check sees what a broken page would show: a console error, an exception, a blank page
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><html><body><script>console.error("boom"); null.x;</script></body></html>')
    console, shot = _load_in_chromium(broken, tmp_path)
    assert any('"boom"' in line for line in console) and any("TypeError" in line for line in console)
    assert _ink(shot) < 0.001
