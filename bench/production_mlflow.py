"""MLflow's `optimize_prompts` on bench/production.py's stream, run the way its docs show.

Each cycle registers the prompt production serves in MLflow's prompt registry (SQLite,
in a temporary folder), builds the dataset from the cycle's traces (`inputs`, the
recorded `outputs`, and `expectations` where a user gave the right answer) and calls
`mlflow.genai.optimize_prompts` with `GepaPromptOptimizer` and the `Correctness` judge,
both on a stand-in model behind opto's fake OpenAI server. MLflow registers what GEPA
returns without a check; production then serves it, as a user following the docs would.

The stand-ins are as able as opto's: the judge is wrong 10% of the time, and the
reflection model adds the rule its evidence asks for most 60% of the time, otherwise a
harmful or useless edit. Its evidence is what MLflow shows it: failed examples with
their expected answer: the dataset `optimize_prompts` takes carries inputs, outputs and
expectations, no thumbs or comments (MLflow stores those on the traces, and a custom
scorer could read them from the trace; its docs show none that does, and neither does
this bench).

    pip install mlflow gepa     # MLflow >= 3.5 (measured with 3.17.2), gepa 0.1.4
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import random
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from opto import LoggedRollout
from opto.testing.fake_openai import FakeOpenAIServer

# Imported once before MLflow installs its import hooks: LiteLLM's logging thread imports
# this module lazily, and with MLflow 3.17's evaluation autologging holding its hook lock
# that import deadlocks (seen here: `optimize_prompts` idle for 10 minutes).
with contextlib.suppress(Exception):
    import litellm.proxy.spend_tracking.savings  # noqa: F401

STAND_IN = "openai:/stand-in"


class MLflowStream:
    """One MLflow store and one stand-in model server for every cycle of a run."""

    def __init__(
        self,
        agent: Callable[[str, str], str],
        capitals: dict[str, str],
        edit: Callable[[str, dict[str, int], random.Random], str],
    ) -> None:
        self.agent = agent  # (prompt, country) -> the answer production gives
        self.capitals = capitals
        self.edit = edit  # (prompt, how often each need was asked for, random source) -> the new prompt
        self.rng = random.Random(0)
        self.key = ""

    @contextlib.contextmanager
    def running(self) -> Iterator[MLflowStream]:
        """Start the stand-in server and a fresh MLflow store; both go at the end."""
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch for prices
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        warnings.filterwarnings("ignore", module="mlflow")
        with FakeOpenAIServer(self._reply) as server, tempfile.TemporaryDirectory() as folder:
            saved = {name: os.environ.get(name) for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
            os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="sk-bench-stand-in")
            import litellm
            import mlflow

            litellm.suppress_debug_info = True
            mlflow.set_tracking_uri(f"sqlite:///{folder}/mlflow.db")
            # the runs' artifacts in the same folder, not ./mlruns
            mlflow.set_experiment(
                experiment_id=mlflow.create_experiment("bench", artifact_location=f"{folder}/artifacts")
            )
            for name in ("mlflow", "gepa", "LiteLLM", "litellm", "alembic"):
                logging.getLogger(name).setLevel(logging.ERROR)
            try:
                yield self
            finally:
                for name, value in saved.items():
                    os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)

    def cycle(
        self, prompt: str, records: list[LoggedRollout], name: str, cycle: int, expected_only: bool, exact: bool = False
    ) -> tuple[str, str]:
        """One `optimize_prompts` call on a cycle's traces; what production serves next.

        `expected_only` keeps the traces with a user's answer; `exact` scores with an
        exact-match scorer (the docs' custom-scorer example) instead of `Correctness`."""
        import mlflow
        from mlflow.genai.optimize.optimizers import GepaPromptOptimizer
        from mlflow.genai.scorers import Correctness, scorer

        @scorer(name="exact_match")
        def exact_match(outputs: str, expectations: dict[str, Any]) -> float:
            return float(outputs.strip().lower() == str(expectations["expected_response"]).strip().lower())

        self.rng = random.Random(f"{name}/{cycle}")
        self.key = f"{name}/{cycle}"
        served = mlflow.genai.register_prompt(name=name, template=prompt)
        version = mlflow.genai.load_prompt(served.uri)
        countries = {f"What is the capital of {country}?": country for country in self.capitals}

        def predict_fn(question: str) -> str:
            return self.agent(version.format(question=question), countries[question])

        rows = [row for record in records if (row := _row(record, expected_only))]
        if not rows:
            return prompt, "unchanged (no trace with an expected answer)"
        with contextlib.redirect_stdout(io.StringIO()):  # GEPA prints every iteration
            result = mlflow.genai.optimize_prompts(
                predict_fn=predict_fn,
                train_data=rows,
                prompt_uris=[served.uri],
                optimizer=GepaPromptOptimizer(reflection_model=STAND_IN),
                scorers=[exact_match if exact else Correctness(model=STAND_IN)],
            )
        found = str(result.optimized_prompts[0].template)
        if found == prompt:
            return prompt, f"unchanged (registered version {result.optimized_prompts[0].version}, the same text)"
        return found, "promoted"

    def _reply(self, body: dict[str, Any]) -> str:
        text = body["messages"][-1]["content"]
        return self._judge(text) if "<claim>" in text else self._reflect(text)

    def _judge(self, text: str) -> str:
        """MLflow's Correctness judge: is the expected answer (the claim) in the output?"""
        claim = text.split("<claim>", 1)[1].split("</claim>", 1)[0].strip()
        output = text.split("<document>", 1)[1].split("</document>", 1)[0].split("} - ", 1)[-1]
        supported = claim in output
        digest = hashlib.sha256(f"{self.key}/{claim}/{output}".encode()).digest()
        if digest[0] < 26:  # wrong 10% of the time, whatever order the threads judge in
            supported = not supported
        return json.dumps({"rationale": "Let's think step by step.", "result": "yes" if supported else "no"})

    def _reflect(self, text: str) -> str:
        """GEPA's reflection: the needs its failed examples show (the expected city
        missing: the capital; there but in a longer answer: one word), then the same edit
        as opto's stand-in."""
        current = text.split("```", 2)[1].strip()
        asked = {"capital": 0, "brief": 0}
        for example in text.split("# Example ")[1:]:
            if "## score\n0.0" not in example or "### expected_response\n" not in example:
                continue
            expected = example.split("### expected_response\n", 1)[1].split("\n", 1)[0].strip()
            output = example.split("\n## outputs\n", 1)[-1].split("\n## ", 1)[0].strip()
            if expected in self.capitals.values():
                asked["capital" if expected not in output else "brief"] += 1
        update = self.edit(current, asked, self.rng)
        return f"```\n{update.strip()}\n```"


def _row(record: LoggedRollout, expected_only: bool) -> dict[str, Any] | None:
    """A dataset row as MLflow's docs build it: the inputs, the recorded output, and the
    user's answer as the expectation. A row without an answer carries the recorded output
    as its expectation, which is what MLflow scores it against anyway (MLflow 3.17 fails
    on a dataset where only some rows have an `expectations` column)."""
    if expected_only and record.info is None:
        return None
    expected = record.info if record.info is not None else record.output
    return {"inputs": {"question": record.x}, "outputs": record.output, "expectations": {"expected_response": expected}}
