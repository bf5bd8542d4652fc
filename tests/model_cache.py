"""Where the real-model tests keep the models they pull (shared across runs).

A module of its own: ``from conftest import ...`` is ambiguous once a test
subdirectory has a conftest.py of its own (tests/reliability).
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_CACHE = Path(os.environ.get("MLOTSPARK_TEST_MODELS") or Path.home() / ".cache" / "mlotspark-test")
