"""A real MLflow tracking server on 127.0.0.1 (SQLite store) for the tests of learning from
production, and the production it has seen: traced requests with feedback, and a prompt."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow.entities import AssessmentSource
from test_logged import CAPITALS, question


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """An MLflow server (SQLite store in `folder`), the tracking URI set to it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
         "--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    previous, previous_env = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((folder / "server.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        mlflow.set_tracking_uri(url)
        os.environ["MLFLOW_TRACKING_URI"] = url
        yield url
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
        process.terminate()
        process.wait(timeout=30)
        log.close()


@mlflow.trace
def production_agent(question: str) -> str:
    return "It is a lovely place."


def traced_production(countries: list[str], *, name: str | None = None, expected: bool = True) -> str:
    """An experiment of traced requests, each with a thumbs down, a comment and a rating of
    2 on 1-5 (and the right answer when `expected`), plus one request nobody judged;
    returns the experiment's name."""
    name = name or f"production-{uuid.uuid4().hex[:8]}"
    experiment = mlflow.set_experiment(name)
    for country in countries:
        production_agent(question(country))
    production_agent("What is the weather?")  # no feedback at all
    mlflow.flush_trace_async_logging()
    user = AssessmentSource(source_type="HUMAN", source_id="user-7")
    for trace in mlflow.search_traces(experiment_ids=[experiment.experiment_id], return_type="list"):
        asked = [s for s in trace.data.spans if s.parent_id is None][0].inputs["question"]
        country = asked.rsplit(" ", 1)[-1].rstrip("?")
        if country not in CAPITALS:
            continue
        mlflow.log_feedback(trace_id=trace.info.trace_id, name="thumbs", value=False, rationale="I wanted the city",
                            source=user)  # fmt: skip
        mlflow.log_feedback(trace_id=trace.info.trace_id, name="rating", value=2, source=user)
        if expected:
            mlflow.log_expectation(trace_id=trace.info.trace_id, name="expected_answer", value=CAPITALS[country])
    return name


def registered(template: str, name: str | None = None) -> str:
    """A prompt registered with `template`, served as `@production`; its URI."""
    name = name or f"capitals-{uuid.uuid4().hex[:8]}"
    version = mlflow.genai.register_prompt(name=name, template=template)
    mlflow.genai.set_prompt_alias(name, alias="production", version=int(version.version))
    return f"prompts:/{name}@production"
