"""The reliability suite (issue 16): kills, corrupt files, bad input, disk trouble,
concurrency, soak and security. Every test here is marked ``reliability``.

CI runs a bounded, seeded sample (``rel_common.count`` picks the small count);
``benchmarks/reliability.py`` sets ``MLOTSPARK_RELIABILITY_FULL=1`` and runs the
full counts. Tests use the tiny random GGUF model of ``tests/tiny.py`` (a byte-level
vocabulary with ChatML specials), never the real model: what is tested is the
storage, not the replies.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))  # tests/tiny.py
sys.path.insert(0, str(HERE))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny random llama GGUF (2 layers, 300 tokens, ChatML template)."""
    from rel_common import make_tiny_gguf

    return make_tiny_gguf(tmp_path_factory.mktemp("rel-model") / "tiny.gguf")
