"""Fixtures of the shared test world (`world.py`): trainers, runs and run directories."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from world import make_level_trainer, make_run


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
