"""`opto report`: a real PNG with the expected points, and a Markdown table with one row per step."""


import matplotlib.image
import pytest

from opto import ExactMatchGuide
from opto.cli import main
from opto.report.markdown import write_report
from world import dataset, make_level_trainer


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    trainer, *_ = make_level_trainer()
    trainer.train(ExactMatchGuide(), dataset([0, 1, 2, 3]), test_dataset=dataset([0, 1, 5]), eval_frequency=2,
                  run_dir=path, progress=False, shuffle=False)
    return path


def test_the_report_is_a_real_picture_and_a_table_of_steps(finished_run, tmp_path, capsys):
    code = main(["report", str(finished_run), "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'report.png'}" in out and "steps: 4  accepted: 4" in out
    image = matplotlib.image.imread(tmp_path / "report.png")
    assert image.shape[:2] == (450, 800)  # 8 x 4.5 inches at 100 dpi
    summary = write_report(finished_run, tmp_path)
    # 4 train scores, tests at 0, 2 and 4, 4 accepted steps, 4 token points
    assert summary.plotted_points == {"train": 4, "test": 3, "test_intervals": 3, "accepted": 4, "tokens": 4}
    # every drawn series has a legend entry, the twin axis's tokens line included
    assert summary.legend == ["train batch score", "test score", "accepted (candidate score)",
                              "test score 95% interval", "tokens so far (right axis)"]
    first, last = summary.first_test_score, summary.last_test_score
    assert summary.title == f"opto run {finished_run.name}: test score {first:.3f} \u2192 {last:.3f}" and first != last
    table = [line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith("| ")]
    assert len(table) == 1 + 4  # the header and one row per step
    assert "| 1 | 0.000 | accepted |" in table[1]
    text = (tmp_path / "report.md").read_text()
    assert "-level 0" in text and "+level 1" in text  # the diff of the accepted prompt
    assert "**At the best validation score**" in text and "**At the end**" in text


def test_the_report_works_on_a_stopped_run_and_an_old_ledger(tmp_path):
    from pathlib import Path

    old = Path(__file__).parent / "fixtures" / "ledger_f6b2917" / "run"
    summary = write_report(old, tmp_path)
    assert summary.steps == 3 and (tmp_path / "report.png").stat().st_size > 1000
    assert "(not recorded by this version)" in (tmp_path / "report.md").read_text()


def test_a_folder_without_a_run_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 1
    assert "holds no opto run" in capsys.readouterr().err
