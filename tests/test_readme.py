"""The README's training example runs as written, against FakeOpenAIServer."""

import json
import re
from pathlib import Path

from opto.testing import FakeOpenAIServer

README = Path(__file__).resolve().parent.parent / "README.md"


def _example() -> str:
    section = README.read_text().split("## Train an agent", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _reply(request):
    system = request["messages"][0]["content"]
    if "improve the parameters" in system or "merge several suggested updates" in system:
        return json.dumps({"reasoning": "digits", "suggestion": {"prompt": "Reply with the number in digits."}})
    return "12" if "digits" in system else "a dozen or so"


def test_readme_training_example_runs_as_written(tmp_path, monkeypatch, capsys):
    code = _example()
    assert len(code.strip().splitlines()) <= 25
    with FakeOpenAIServer(reply=_reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.chdir(tmp_path)
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    initial, final, params = capsys.readouterr().out.strip().rsplit("\n", 1)[-1].split(" ", 2)
    assert float(final) > float(initial)
    assert "Reply with the number in digits." in params
    assert (tmp_path / "runs" / "qa" / "ledger.jsonl").exists()


def test_readme_search_strategies_example_runs_as_written(capsys):
    section = README.read_text().split("### Search strategies", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    before, after, demos = capsys.readouterr().out.strip().split(" ", 2)
    assert float(before) == 0.0 and float(after) == 1.0
    assert "'output': 'boxes'" in demos or "'output': 'foxes'" in demos


def test_readme_sdk_and_litellm_tool_agent_examples_run_as_written(capsys):
    section = README.read_text().split("### Bring your own agent:", 1)[1].split("\n## ", 1)[0]
    sdk, tools = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:2]
    exec(compile(sdk, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip().splitlines()[-1] == "{'prompt': 'Reply in digits.'} 2"
    exec(compile(tools, "README.md", "exec"), {"__name__": "readme"})
    # two calls (the tool call, then the answer) in each of the train and validation rollouts
    assert capsys.readouterr().out.strip().splitlines()[-1] == "{'prompt': 'Reply in digits.'} 4"


def _weights_snippets() -> list[str]:
    section = README.read_text().split("## From prompts to weights", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def _is_agent_call(request: dict | None) -> bool:
    """A chat request of the README's QA agent (not of its optimizer or aggregator)."""
    if not request or "messages" not in request:
        return False
    system = request["messages"][0]["content"]
    return "improve the parameters" not in system and "merge several suggested updates" not in system


def _dpo_rows(n: int = 10) -> str:
    rows = [{"input": {"messages": [{"role": "user", "content": f"{i}+{i}?"}]},
             "preferred_output": [{"role": "assistant", "content": str(2 * i)}],
             "non_preferred_output": [{"role": "assistant", "content": "no idea"}]} for i in range(n)]
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_readme_weights_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    from opto import RunDir
    from opto.testing import FakeNeMoCustomizer

    train, openai_adapter, nemo_adapter, switch = _weights_snippets()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")

    def reply(request):  # two different proposals, so each is scored on its own
        system = request["messages"][0]["content"]
        if "improve the parameters" in system or "merge several suggested updates" in system:
            prompt = "Reply with the number in digits." if request.get("seed", 0) % 2 else "Count carefully."
            return [json.dumps({"reasoning": "r", "suggestion": {"prompt": prompt}})] * (request.get("n") or 1)
        return "12" if "digits" in system else "a dozen"

    with FakeOpenAIServer(reply=reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        namespace = {"__name__": "readme"}
        exec(compile(train, "README.md", "exec"), namespace)
        assert any(r["type"] == "proposal_score" for r in RunDir(tmp_path / "runs" / "qa").ledger())

        (tmp_path / "pairs.jsonl").write_text(_dpo_rows())
        server.job_script = ["succeeded"]
        exec(compile(openai_adapter, "README.md", "exec"), namespace)
        [job] = server.jobs.values()
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"succeeded {job['fine_tuned_model']}"

        asked_before = len(server.requests)
        exec(compile(switch, "README.md", "exec"), namespace)  # it continues the two snippets above
        assert capsys.readouterr().out.strip().splitlines()[-1] == job["fine_tuned_model"]
        agent_calls = [r.json for r in server.requests[asked_before:] if _is_agent_call(r.json)]
        assert agent_calls and {r["model"] for r in agent_calls} == {job["fine_tuned_model"]}
        assert (tmp_path / "runs" / "qa" / "models.json").exists()

    nemo_rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}?"}], "chosen_response": str(2 * i),
                  "rejected_response": "no idea"} for i in range(10)]
    (tmp_path / "pairs.nemo.jsonl").write_text("".join(json.dumps(row) + "\n" for row in nemo_rows))
    with FakeNeMoCustomizer(job_script=["completed"]) as nemo:
        monkeypatch.setenv("NEMO_CUSTOMIZER_URL", nemo.base_url)
        exec(compile(nemo_adapter, "README.md", "exec"), {"__name__": "readme"})
        [nemo_job] = nemo.jobs.values()
    status, model = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert status == "succeeded" and model == nemo_job.request["output_model"]
    assert nemo_job.request["hyperparameters"]["finetuning_type"] == "lora"


def test_readme_selector_example_runs_as_written(capsys):
    section = README.read_text().split("#### Writing a selector", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert len(code.strip().splitlines()) <= 30
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip().splitlines()[-1] == "{'prompt': 'Say yes.'} newest"
