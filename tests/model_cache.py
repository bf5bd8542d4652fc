"""Where the real-model tests keep the models they pull (shared across runs).

A module of its own: ``from conftest import ...`` is ambiguous once a test
subdirectory has a conftest.py of its own (tests/reliability).
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_CACHE = Path(os.environ.get("MLOTSPARK_TEST_MODELS") or Path.home() / ".cache" / "mlotspark-test")


def catalogue_path(name: str) -> Path:
    """A catalogue model's file, pulled once per machine into the shared test model cache."""
    from mlotspark.models import catalogue

    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(MODEL_CACHE)
    try:
        return catalogue.resolve(name, progress=False).path
    finally:
        if old is None:
            os.environ.pop("MLOTSPARK_HOME", None)
        else:
            os.environ["MLOTSPARK_HOME"] = old

