"""Helpers shared by the reliability tests and ``benchmarks/reliability.py``."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FULL = os.environ.get("MLOTSPARK_RELIABILITY_FULL", "") not in ("", "0")
SEED = int(os.environ.get("MLOTSPARK_RELIABILITY_SEED") or 16)


def count(sample: int, full: int) -> int:
    """``full`` under ``MLOTSPARK_RELIABILITY_FULL=1`` (the benchmark), else ``sample``."""
    return full if FULL else sample


def rng(salt: str) -> random.Random:
    """A seeded generator per test (reproducible with ``MLOTSPARK_RELIABILITY_SEED``)."""
    return random.Random(f"{SEED}-{salt}")


def make_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write tests/tiny.py's random model as a GGUF file (float32, 2 layers; a long
    context, since its byte-level vocabulary spends a token per character)."""
    sys.path.insert(0, str(HERE.parent))
    from tiny import tiny_model, write_tiny_gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_tiny_gguf(path, tiny_model(seed, max_position_embeddings=1 << 16))


def child_env(home: Path, **extra: Any) -> dict[str, str]:
    """Environment of a child process: its own home, the repository importable."""
    env = dict(os.environ)
    env.update(MLOTSPARK_HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), str(HERE.parent)]))
    env.pop("MLOTSPARK_FAULT_KILL_AT", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def temp_leftovers(home: Path) -> list[Path]:
    """Temp files a writer left behind (``.name.xxxx.tmp`` / ``.name.xxxx.suffix``)."""
    return [p for p in home.rglob(".*") if p.is_file() and p.name not in (".lock",) and not p.name.endswith(".lock")]


def record(part: str, **figures: Any) -> None:
    """Append a part's figures for ``benchmarks/reliability.py`` (when it asked for them)."""
    path = os.environ.get("MLOTSPARK_RELIABILITY_REPORT")
    if path:
        import json

        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"part": part, **figures}) + "\n")
