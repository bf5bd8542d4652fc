"""Shared fixtures. Every test gets its own ``$MLOTSPARK_HOME`` under tmp_path,
except the real default model, which is fetched once per machine into a cache
directory shared by test runs (``$MLOTSPARK_TEST_MODELS`` or
``~/.cache/mlotspark-test``) so the suite does not download it for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import mlotspark  # noqa: F401  (resolves OpenBLAS before any test imports mlx)

from model_cache import MODEL_CACHE  # noqa: E402  (a module of its own: see there)


def pytest_configure(config):
    # Module- and session-scoped fixtures load models before a test's own home is set
    # (``_isolated_home``): without a home of the run's, they wrote the user's ~/.mlotspark
    # (its models_used.json listed pytest's temporary models in ``mlotspark list``).
    import shutil
    import tempfile

    config._mlotspark_home = tempfile.mkdtemp(prefix="mlotspark-test-home-")
    config._mlotspark_home_before = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = config._mlotspark_home
    config.add_cleanup(lambda: shutil.rmtree(config._mlotspark_home, ignore_errors=True))


def pytest_unconfigure(config):
    before = getattr(config, "_mlotspark_home_before", None)
    if before is None:
        os.environ.pop("MLOTSPARK_HOME", None)
    else:
        os.environ["MLOTSPARK_HOME"] = before


@pytest.fixture(autouse=True)
def _seeded_random():
    # Tests draw random inputs; a fixed seed per test makes a failure repeat instead of
    # landing in one CI run of many (a damaged-part test once "damaged" nothing, 1 run in 256).
    import random

    import mlx.core as mx
    import numpy as np

    random.seed(0)
    np.random.seed(0)
    mx.random.seed(0)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MLOTSPARK_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """Path to the real default model's GGUF (SmolLM2-135M-Instruct Q4_1)."""
    from mlotspark.models import catalogue

    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(MODEL_CACHE)
    try:
        return catalogue.resolve(catalogue.DEFAULT_MODEL, progress=False).path
    finally:
        if old is None:
            os.environ.pop("MLOTSPARK_HOME", None)
        else:
            os.environ["MLOTSPARK_HOME"] = old
