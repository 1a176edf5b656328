"""The documentation: every Python block of README.md and docs/ runs as written, the site
builds with `mkdocs build --strict`, and every public name has an API reference entry.

Blocks are found by walking the files. A page's blocks run in order in one namespace (a
later block may use an earlier one's names, as a reader would), in a fresh folder, with
OPENAI_BASE_URL and OPENAI_API_KEY pointed at a `FakeOpenAIServer`: a block that would
need a real key runs against the fake. Some pages get more of their setting (a file they
name, the fake server's fine-tuning jobs, a fake NeMo Customizer), and their output is
checked where it says what a reader should see.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import opto
from opto import RunDir
from opto.testing import FakeNeMoCustomizer, FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)


@dataclass
class Block:
    page: Path
    line: int
    code: str


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, with the line each starts on."""
    text = page.read_text(encoding="utf-8")
    return [Block(page, text.count("\n", 0, match.start()) + 2, match.group(1)) for match in BLOCK.finditer(text)]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page)]
# Pages whose blocks run the embedded model (minutes, not seconds), and the one on Ray.
PAGE_MARKS = {
    "docs/getting-started.md": [pytest.mark.local_model],
    "docs/guides/prompts-to-weights.md": [pytest.mark.local_model],
    "docs/guides/ray.md": [pytest.mark.ray, pytest.mark.xdist_group("ray")],  # one Ray instance at a time
    "docs/guides/production.md": [pytest.mark.xdist_group("mlflow_server")],  # the MLflow server of its tests
}
# Pages that fine-tune the converted embedded model: the conversion made once for the run (conftest.py).
PAGE_FIXTURES = {"docs/guides/prompts-to-weights.md": ["embedded_hf_model"],
                 "docs/guides/production.md": ["mlflow_tracking_server"]}


# ------------------------------------------------------------------ the fakes' replies


def _is_optimizer(request: dict[str, Any]) -> bool:
    system = request["messages"][0]["content"] if request.get("messages") else ""
    return "improve the parameters" in system or "merge several suggested updates" in system


def digits_reply(request: dict[str, Any]) -> Any:
    """The optimizer and aggregator suggest replying in digits; the agent then answers 12."""
    if _is_optimizer(request):
        suggestion = {"reasoning": "digits", "suggestion": {"prompt": "Reply with the number in digits."}}
        return [json.dumps(suggestion)] * (request.get("n") or 1)
    return "12" if "digits" in request["messages"][0]["content"] else "a dozen or so"


def two_proposals_reply(request: dict[str, Any]) -> Any:
    """Two different proposals (by the request's seed), so each is scored on its own."""
    if _is_optimizer(request):
        prompt = "Reply with the number in digits." if request.get("seed", 0) % 2 else "Count carefully."
        return [json.dumps({"reasoning": "r", "suggestion": {"prompt": prompt}})] * (request.get("n") or 1)
    return "12" if "digits" in request["messages"][0]["content"] else "a dozen"


# ------------------------------------------------------------------ the pages' settings


@dataclass
class Setting:
    """What a page's blocks run in: the fake server, and anything else they name."""

    folder: Path
    server: FakeOpenAIServer
    extra: dict[str, Any] = field(default_factory=dict)


def _dpo_rows(n: int = 10) -> str:
    rows = [
        {
            "input": {"messages": [{"role": "user", "content": f"{i}+{i}?"}]},
            "preferred_output": [{"role": "assistant", "content": str(2 * i)}],
            "non_preferred_output": [{"role": "assistant", "content": "no idea"}],
        }
        for i in range(n)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows)


def _nemo_rows(n: int = 10) -> str:
    rows = [
        {"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "chosen_response": str(2 * i), "rejected_response": "no"}
        for i in range(n)
    ]
    return "".join(json.dumps(row) + "\n" for row in rows)


@contextlib.contextmanager
def weights_page(setting: Setting, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (setting.folder / "pairs.jsonl").write_text(_dpo_rows())
    (setting.folder / "pairs.nemo.jsonl").write_text(_nemo_rows())
    setting.server.job_script = ["succeeded"]
    with FakeNeMoCustomizer(job_script=["completed"]) as nemo:
        monkeypatch.setenv("NEMO_CUSTOMIZER_URL", nemo.base_url)
        setting.extra["nemo"] = nemo
        yield


@contextlib.contextmanager
def production_page(setting: Setting, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A real MLflow server with the production the page reads: traced requests with
    feedback and expected answers, and the prompt it serves."""
    import mlflow
    from mlflow_server import registered, traced_production

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])  # the session's server (PAGE_FIXTURES)
    traced_production(["France", "Italy", "Peru", "Chile", "Japan", "Kenya"], name="production")
    registered("Answer the question.", name="capitals")
    yield


REPLIES: dict[str, Callable[[dict[str, Any]], Any]] = {"docs/guides/prompts-to-weights.md": two_proposals_reply}
PAGE_SETUP: dict[str, Callable[[Setting, pytest.MonkeyPatch], contextlib.AbstractContextManager[None]]] = {
    "docs/guides/prompts-to-weights.md": weights_page,
    "docs/guides/production.md": production_page,
}


# ------------------------------------------------------------------ what the pages show


def _last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def check_training_example(outputs: list[str], setting: Setting) -> None:
    initial, final, parameters = _last_line(outputs[0]).split(" ", 2)
    assert float(final) > float(initial)
    assert "Reply with the number in digits." in parameters
    assert (setting.folder / "runs" / "qa" / "ledger.jsonl").exists()


def check_getting_started(outputs: list[str], setting: Setting) -> None:
    """The tutorial on the embedded model ends better than it started, resumes for a
    second epoch, and its run makes an HTML report; then the OpenAI example."""
    from opto.cli import main

    before, after = re.fullmatch(r"test score: (\S+) -> (\S+)", _last_line(outputs[2])).groups()
    assert float(after) > float(before)
    assert re.fullmatch(r"after 2 epochs: \S+ \(8 steps\)", _last_line(outputs[4]))
    assert main(["report", str(setting.folder / "runs" / "verbs"), "--html"]) == 0
    assert (setting.folder / "runs" / "verbs" / "report.html").exists()
    check_training_example(outputs[5:], setting)


def check_agents_page(outputs: list[str], setting: Setting) -> None:
    # 4 examples, batches of 1: the noise probe (8), 4 training rollouts, the first step's
    # candidate screened on its batch (1) and raced on the 4 examples beside the start (8);
    # the final check of this deterministic agent reads the start's and the final values'
    # scores on the 4 examples from the race, and runs nothing
    assert _last_line(outputs[0]) == "{'prompt': 'Reply in digits.'} 21"
    # the same rollouts, two calls each (the tool call, then the answer)
    assert _last_line(outputs[1]) == "{'prompt': 'Reply in digits.'} 42"


def check_search_page(outputs: list[str], setting: Setting) -> None:
    before, after, demos = _last_line(outputs[0]).split(" ", 2)
    assert float(before) == 0.0 and float(after) == 1.0
    assert "'output': 'boxes'" in demos or "'output': 'foxes'" in demos
    assert _last_line(outputs[1]) == "{'prompt': 'Say yes.'} newest"


def check_weights_page(outputs: list[str], setting: Setting) -> None:
    stages = [line.split()[0] for line in outputs[0].strip().splitlines()]
    assert stages == ["zero-shot", "prompt", "sft"]
    server = setting.server
    assert any(r["type"] == "proposal_score" for r in RunDir(setting.folder / "runs" / "qa").ledger())
    [job] = server.jobs.values()
    assert _last_line(outputs[2]) == f"succeeded {job['fine_tuned_model']}"
    [nemo_job] = setting.extra["nemo"].jobs.values()
    assert _last_line(outputs[3]) == f"succeeded {nemo_job.request['output_model']}"
    assert nemo_job.request["hyperparameters"]["finetuning_type"] == "lora"
    # switch_model to the last job above (NeMo's): the second epoch asked the tuned model
    tuned = nemo_job.request["output_model"]
    assert _last_line(outputs[4]) == tuned
    asked = {r.json["model"] for r in server.requests if r.json and "messages" in r.json and not _is_optimizer(r.json)}
    assert tuned in asked
    assert (setting.folder / "runs" / "qa" / "models.json").exists()


def check_stopping_page(outputs: list[str], setting: Setting) -> None:
    assert _last_line(outputs[0]).startswith("TargetScore(0.95): validation score 1.0000")


def check_production_page(outputs: list[str], setting: Setting) -> None:
    assert outputs[-1].splitlines()[-2].startswith("published version 2 as 'production' (final check (held-out, 3")
    assert _last_line(outputs[-1]) == "'production' points again at version 1"


def check_opentelemetry_page(outputs: list[str], setting: Setting) -> None:
    assert _last_line(outputs[0]) == "1.0 ['fake-model']"


def check_ray_page(outputs: list[str], setting: Setting) -> None:
    assert _last_line(outputs[0]) == "0.0 1.0"
    assert _last_line(outputs[1]) == "0.0 16"  # evaluate and collect through the same RayExecutor
    assert len(RunDir(setting.folder / "runs" / "groups").ledger()) == 16


def check_exceptions_page(outputs: list[str], setting: Setting) -> None:
    assert _last_line(outputs[0]) == "ModelNotFoundError 404 no-such-model req_fake_1"


CHECKS: dict[str, Callable[[list[str], Setting], None]] = {
    "README.md": check_training_example,
    "docs/getting-started.md": check_getting_started,
    "docs/guides/agents.md": check_agents_page,
    "docs/guides/search.md": check_search_page,
    "docs/guides/prompts-to-weights.md": check_weights_page,
    "docs/guides/stopping.md": check_stopping_page,
    "docs/guides/production.md": check_production_page,
    "docs/exceptions.md": check_exceptions_page,
    "docs/guides/opentelemetry.md": check_opentelemetry_page,
    "docs/guides/ray.md": check_ray_page,
}


# ------------------------------------------------------------------ the tests


def test_the_blocks_are_found_by_walking_the_files() -> None:
    assert len(PAGES) >= 20 and len(PAGES_WITH_CODE) >= 15
    assert set(CHECKS) | set(PAGE_SETUP) <= {_name(page) for page in PAGES_WITH_CODE}, "a check names no page"
    sample = "text\n```python\nprint(1)\n```\nmore\n```bash\nls\n```\n```python\nx = 2\n```\n"
    assert [match.group(1) for match in BLOCK.finditer(sample)] == ["print(1)\n", "x = 2\n"]


@pytest.mark.parametrize("page", [pytest.param(page, marks=PAGE_MARKS.get(_name(page), ())) for page in PAGES_WITH_CODE],
                         ids=_name)
def test_every_python_block_runs_as_written(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    name = _name(page)
    for fixture in PAGE_FIXTURES.get(name, ()):
        request.getfixturevalue(fixture)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with FakeOpenAIServer(reply=REPLIES.get(name, digits_reply)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        setting = Setting(tmp_path, server)
        setup = PAGE_SETUP.get(name)
        outputs = []
        with setup(setting, monkeypatch) if setup else contextlib.nullcontext():
            namespace: dict[str, Any] = {"__name__": f"docs:{name}"}
            try:
                for block in python_blocks(page):
                    exec(compile(block.code, f"{name}:{block.line}", "exec"), namespace)
                    outputs.append(capsys.readouterr().out)
                if name in CHECKS:
                    CHECKS[name](outputs, setting)
            finally:
                # A script's models close when it exits; here the page's namespace is a
                # cycle (its functions' globals), so collect it now: their threads stop.
                namespace.clear()
                gc.collect()


def test_every_public_name_has_an_api_reference_entry() -> None:
    groups = [path for path in (DOCS / "reference").glob("*.md") if path.name != "subpackages.md"]
    reference = "\n".join(path.read_text(encoding="utf-8") for path in groups)
    entries = set(re.findall(r"^::: opto\.(\w+)\s*$", reference, re.MULTILINE))
    assert set(opto.__all__) - entries == set()
    assert entries - set(opto.__all__) == set(), "an entry for a name opto does not export"


def test_the_cli_page_names_every_command() -> None:
    from opto.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    page = (DOCS / "guides" / "cli.md").read_text(encoding="utf-8")
    assert {command for command in commands if f"`opto {command}" not in page} == set()


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    page = (tmp_path / "site" / "reference" / "training" / "index.html").read_text(encoding="utf-8")
    assert "AggregatedUpdate" in page and "train" in page
