"""Fixtures of the shared test world (`world.py`): trainers, runs and run directories; and
what the parallel run (pytest-xdist, `-n 2` in pyproject.toml) needs: one core per worker,
the slowest tests first, and the converted embedded model made once for every worker."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from world import make_level_trainer, make_run


def pytest_configure(config: pytest.Config) -> None:
    """An xdist worker runs on cores of its own (its share of this process's cores), and so
    do the processes it starts. llama.cpp's threads wait for each other at every step: with
    more of them than free cores (two workers, each running the model on every core) a
    step waits for the scheduler, and a one-minute test took fifteen. `LocalModel` and
    torch size their threads to the cores a process may run on."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw"))
    mine = set(cpus[index::count]) if len(cpus) >= count else {cpus[index % len(cpus)]}
    for thread in os.listdir("/proc/self/task"):  # the threads execnet has started too
        try:
            os.sched_setaffinity(int(thread), mine)
        except OSError:  # a thread that has ended since
            pass


# Not on the real model, but the longest of the rest (a minute each on one core, mypy
# with no cache as in CI): started early too, so that neither ends the run on one worker.
LONG = ("test_static_checks.py::test_mypy", "test_extraction_fuzz.py::", "test_packaging.py::test_wheel")


def _order(item: pytest.Item) -> int:
    if item.get_closest_marker("local_model"):
        return 0
    return 1 if any(name in item.nodeid for name in LONG) else 2


@pytest.hookimpl(trylast=True)  # after xdist's own
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a parallel run, the tests on the real model first (minutes each, against seconds
    for most of the rest), so that the short ones fill in around them and no worker is
    left with a long test at the end while the other has nothing to do."""
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing to schedule
        return
    items.sort(key=_order)
    if config.getvalue("loadgroup"):
        _name_the_groups(items)


def _name_the_groups(items: list[pytest.Item]) -> None:
    """`--dist loadgroup` keeps the tests of one `xdist_group` on one worker by the
    `@group` its worker adds to their node ids; with pytest 9.2's structured node ids
    that addition no longer takes (pytest-dev/pytest-xdist#1386) and the groups run
    spread over the workers, two Ray instances at once. Add it where it is missing."""
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            item._id = type(item._id).parse(item.nodeid + suffix)


def _shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that every xdist worker of this run sees (the parent of the workers'
    temporary folders; without xdist, this run's own)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _opto_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`$OPTO_CACHE_DIR` for the whole run: one folder shared by the workers (and the
    processes the tests start), never the user's ~/.cache/opto."""
    folder = _shared_folder(tmp_path_factory) / "opto-cache"
    folder.mkdir(exist_ok=True)
    before = os.environ.get("OPTO_CACHE_DIR")
    os.environ["OPTO_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("OPTO_CACHE_DIR", None)
    else:
        os.environ["OPTO_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def embedded_hf_model(_opto_cache_dir: Path) -> Path:
    """The embedded SmolLM2 converted to a Hugging Face folder once for the whole run, in
    `$OPTO_CACHE_DIR`, where `embedded_model_folder()` and `--model embedded` find it.
    The first worker to ask converts it; the other waits for the lock, then reuses it."""
    from filelock import FileLock

    from opto.llm.transformers_model import embedded_model_folder

    with FileLock(str(_opto_cache_dir.parent / "opto-cache.lock")):
        return embedded_model_folder(_opto_cache_dir)


@pytest.fixture
def level_trainer() -> Callable[..., Any]:
    """A factory: `level_trainer(level=0, delta=1, **trainer_kwargs)` -> (trainer, agent, agent model, brain)."""
    return make_level_trainer


@pytest.fixture(scope="module")
def counting_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished counting-world run (two proposals per instance, each scored): its run dir."""
    path = tmp_path_factory.mktemp("counting-run")
    make_run(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _ctrl_c_works():
    """Tests press Ctrl-C (SIGINT) on runs and on child processes. A shell that starts the
    suite in the background (`cmd &`) makes SIGINT ignored, which children inherit: put
    Python's own handler back, so the tests see what a user at a terminal sees."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(scope="session")
def mlflow_tracking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real MLflow server (SQLite store) for the worker's tests of learning from
    production; they share it through the xdist group "mlflow_server"."""
    from mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
