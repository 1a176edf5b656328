"""The process that follows one ART job: ``python -m opto.finetune.art_worker JOB_FOLDER``.

It reads ``settings.json``, drives the job over HTTP (the art-run routes or W&B's
serverless API), reports through ``job.json`` and stops when a ``cancel`` file appears
or on SIGTERM. The API key comes from the environment variable the settings name; it is
never written, and every message is redacted. `ARTAdapter.submit` starts it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the OpenAI SDK's HTTP client, installed with opto

from .._util.files import read_jsonl
from .._util.redaction import redact, remember_secret
from .base import error_detail
from .job_folder import JobFiles

__all__ = ["main"]


class Cancelled(Exception):
    """The job was asked to stop (a cancel file, or SIGTERM)."""


class RemoteError(Exception):
    """The server refused a request or reported the training failed."""


def main(folder: str) -> int:
    files = JobFiles(Path(folder))
    job = json.loads(files.settings.read_text(encoding="utf-8"))
    signal.signal(signal.SIGTERM, _stop)
    files.update(status="running", started_at=time.time(), message=f"connecting to {job['base_url']}")
    try:
        served = run(files, job)
    except Cancelled:
        files.update(status="cancelled", finished_at=time.time(), message="cancelled")
        return 0
    except BaseException as exc:  # every failure is reported through job.json
        print(redact(traceback.format_exc()), file=sys.stderr)  # the log is a file: no key in it
        message = redact(str(exc) if isinstance(exc, RemoteError) else f"{type(exc).__name__}: {exc}")
        files.update(
            status="failed",
            progress=None,
            finished_at=time.time(),
            error=message,
            message=f"training failed: {message}",
        )
        return 1
    files.update(
        status="succeeded",
        progress=1.0,
        finished_at=time.time(),
        fine_tuned_model=served,
        message=f"trained; agents call {served}",
    )
    return 0


def _stop(signum: int, frame: Any) -> None:
    raise Cancelled()


def run(files: JobFiles, job: dict[str, Any]) -> str:
    """Train; returns the name agents must call."""
    key = os.environ.get(job["api_key_env"]) or None
    remember_secret(key)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    groups = read_jsonl(job["dataset"])
    with httpx.Client(base_url=job["base_url"], headers=headers, timeout=job["timeout"]) as client:
        if job["protocol"] == "art-run":
            return _art_run(client, files, job, groups)
        return _serverless(client, files, job, groups)


def _art_run(client: httpx.Client, files: JobFiles, job: dict[str, Any], groups: list[dict[str, Any]]) -> str:
    model = job["model"]
    _call(client, "GET", "/healthcheck", "check the server's health")
    _call(client, "POST", "/register", "register the model", json=model)
    served = _call(
        client,
        "POST",
        "/_prepare_backend_for_training",
        "prepare the backend for training",
        json={"model": model, "config": None},
    )
    served_url = served[0] if isinstance(served, list) and served else "?"
    files.update(message=f"training on {len(groups)} groups (the model is served at {served_url})")
    body = {
        "model": model,
        "trajectory_groups": groups,
        "config": job["config"],
        "dev_config": job["dev_config"],
        "verbose": False,
    }
    steps = 0
    with client.stream("POST", "/_train_model", json=body, timeout=httpx.Timeout(job["timeout"], read=None)) as reply:
        if reply.status_code >= 400:
            reply.read()
            raise RemoteError(f"the server refused to train ({reply.status_code}): {error_detail(reply)}")
        for line in reply.iter_lines():
            _check_cancel(files)
            if not line.strip():
                continue
            metrics = json.loads(line)
            steps += 1
            total = metrics.get("num_gradient_steps")
            loss = metrics.get("loss")
            files.update(
                progress=min(steps / total, 0.99) if total else None,
                message=f"gradient step {steps}"
                + (f"/{total}" if total else "")
                + (f", loss {loss:.4f}" if isinstance(loss, (int, float)) else ""),
            )
    if steps == 0:
        raise RemoteError("the training stream ended without a gradient step")
    step = _call(client, "POST", "/_get_step", "read the trained step", json={"model": model})
    return f"{model['name']}@{step}"


def _serverless(client: httpx.Client, files: JobFiles, job: dict[str, Any], groups: list[dict[str, Any]]) -> str:
    model = job["model"]
    created = _call(
        client,
        "POST",
        "/preview/models",
        "create the model",
        json={key: model[key] for key in ("name", "project", "base_model", "entity") if key in model},
    )
    model_id = created["id"]
    started = _call(
        client,
        "POST",
        "/preview/training-jobs",
        "create the training job",
        json={
            "model_id": model_id,
            "trajectory_groups": groups,
            "experimental_config": {**job["config"], **job["dev_config"]},
        },
    )
    remote = started["id"]
    files.update(message=f"W&B training job {remote} on {len(groups)} groups")
    after = 0
    while True:
        _check_cancel(files)
        events = (
            _call(
                client,
                "GET",
                f"/preview/training-jobs/{remote}/events",
                "read the job's events",
                params={"after": after},
            ).get("data")
            or []
        )
        for event in events:
            after = max(after, int(event.get("id", after)))
            data = event.get("data") or {}
            kind = event.get("type")
            if kind == "training_failed":
                raise RemoteError(f"the training job {remote} failed: {data.get('error') or 'no reason given'}")
            if kind == "gradient_step":
                total = data.get("num_gradient_steps")
                files.update(
                    progress=min(data.get("step", 0) / total, 0.99) if total else None,
                    message=f"gradient step {data.get('step')}" + (f"/{total}" if total else ""),
                )
            if kind == "training_ended":
                checkpoints = (
                    _call(client, "GET", f"/preview/models/{model_id}/checkpoints", "list the model's checkpoints").get(
                        "data"
                    )
                    or []
                )
                if not checkpoints:
                    raise RemoteError(f"the training job {remote} ended but the model has no checkpoint")
                return str(max(checkpoints, key=lambda c: c.get("step", 0))["name"])
        time.sleep(job["poll_interval"])


def _check_cancel(files: JobFiles) -> None:
    if files.cancel.exists():
        raise Cancelled()


def _call(client: httpx.Client, method: str, path: str, what: str, **kwargs: Any) -> Any:
    try:
        reply = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise RemoteError(f"cannot reach {client.base_url} to {what}: {type(exc).__name__}: {exc}") from None
    if reply.status_code >= 400:
        raise RemoteError(f"the server refused to {what} ({reply.status_code}): {error_detail(reply)}")
    try:
        return reply.json()
    except ValueError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
