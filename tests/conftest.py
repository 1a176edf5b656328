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
