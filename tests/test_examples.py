"""Every example in examples/ runs offline, as a user would run it, and shows what its
docstring says it shows. (custom_agent.py and from_trace.py run in test_examples_and_cli.py.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(name: str, folder: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OPENAI_API_KEY", None)  # an example must not need a key from the environment
    env.pop("OPENAI_BASE_URL", None)
    for key in [key for key in env if key.startswith("MLFLOW_")]:  # another test's MLflow server and experiment
        env.pop(key)
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def test_every_example_is_tested_and_documented() -> None:
    tested = {name for name in re.findall(r'"(\w+\.py)"', Path(__file__).read_text())}
    tested |= {"custom_agent.py", "from_trace.py"}
    examples = {path.name for path in EXAMPLES.glob("*.py")}
    assert len(examples) >= 10 and examples == tested
    page = (ROOT / "docs" / "examples.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in examples:
        assert f"examples/{name}" in page and name in readme, name
        assert (EXAMPLES / name).read_text().startswith('"""'), f"{name} has no docstring saying what it shows"


def test_openai_sdk_agent_with_tools(tmp_path: Path) -> None:
    out = run_example("openai_sdk_tools.py", tmp_path)
    assert "accuracy before 0.00 after 1.00" in out
    assert "instructions: 'Use the multiply tool.'" in out


def test_litellm_agent(tmp_path: Path) -> None:
    out = run_example("litellm_agent.py", tmp_path)
    assert "accuracy before 0.00 after 1.00" in out
    assert re.search(r"calls: agent \d+, optimizer 1", out)


def test_langgraph_agent_seen_through_opentelemetry(tmp_path: Path) -> None:
    out = run_example("langgraph_otel.py", tmp_path)
    assert "accuracy before 0.00 after 1.00" in out
    assert "['model call', 'tool: add', 'model call']" in out
    [run] = (tmp_path / "runs").iterdir()
    assert (run / "ledger.jsonl").exists()


def test_agent_judged_by_an_llm(tmp_path: Path) -> None:
    out = run_example("llm_judge.py", tmp_path)
    assert "judge's mean score before 0.30 after 1.00" in out
    assert "Score: 10" in out


@pytest.mark.ray
@pytest.mark.xdist_group("ray")  # one Ray instance on the machine at a time
def test_training_on_ray(tmp_path: Path) -> None:
    out = run_example("ray_run.py", tmp_path)
    assert "accuracy before 0.00 after 1.00" in out
    assert re.search(r"\d+ rollouts of 0.5 s CPU each in [\d.]+ s on 2 Ray workers", out)


def test_numeric_and_text_parameters_together(tmp_path: Path) -> None:
    pytest.importorskip("optuna", reason="the tpe extra")
    out = run_example("numeric_and_text.py", tmp_path)
    assert "mean score before 0.00 after 1.00" in out
    top_k = int(re.search(r"top_k: (\d+)", out).group(1))
    assert top_k >= 4  # the answer is the fourth passage: TPE found a value that reaches it


def test_prompts_then_weights_on_the_fakes(tmp_path: Path) -> None:
    out = run_example("prompts_then_weights.py", tmp_path)
    assert "accuracy with the optimized prompt 1.00" in out
    assert "fine-tuning job succeeded: ft:gpt-4.1-mini" in out
    assert "accuracy of the tuned model with the original prompt 1.00" in out
    [run] = (tmp_path / "runs").iterdir()
    switches = json.loads((run / "models.json").read_text())
    assert "ft:gpt-4.1-mini" in json.dumps(switches)


def test_collecting_rl_groups(tmp_path: Path) -> None:
    out = run_example("collect_rl_groups.py", tmp_path)
    assert "rollouts: 15 (5 examples x 3 samples), mean score 0.67" in out
    assert "groups kept: 5" in out
    [run] = (tmp_path / "runs").iterdir()
    groups = [json.loads(line) for line in (run / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 5


def test_gepa_adapters_under_opto(tmp_path: Path) -> None:
    pytest.importorskip("gepa", reason="the gepa extra")
    out = run_example("gepa_adapter.py", tmp_path)
    assert "DefaultAdapter: accuracy before 0.00 after 1.00" in out
    assert "best_candidate: {'system_prompt': 'Name the capital.'}" in out
    assert "FactsAdapter: accuracy before 0.00 after 0.67" in out  # the 4 countries it was trained on, of 6
    assert "changed: facts, style" in out
    assert (tmp_path / "runs" / "gepa-facts" / "ledger.jsonl").exists()


def test_a_dspy_program_compiled_by_opto(tmp_path: Path) -> None:
    pytest.importorskip("dspy", reason="the dspy extra")
    out = run_example("dspy_program.py", tmp_path)
    assert "held-out accuracy before 0.00 after 1.00" in out
    assert "answer's instructions: 'Reply with the capital city only" in out
    assert "saved and loaded: the same answers: True" in out
    assert "LM calls per rollout in the ledger: [2]" in out  # both predictors' calls, in every rollout


def test_production_publishes_a_checked_prompt_and_rolls_it_back(tmp_path: Path) -> None:
    pytest.importorskip("mlflow.server", reason="MLflow's full package (the dev extra)")
    out = run_example("production.py", tmp_path)
    assert "12 traces with feedback" in out
    assert "published version 2 as 'production'" in out
    assert "production serves: Answer with the capital city, in one word." in out
    assert out.strip().endswith("'production' points again at version 1")
