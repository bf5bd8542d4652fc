"""Shared helpers of the memory-cascade benchmarks (``cascade_*.py``).

The real default model is loaded through ``Engine.load`` (model + tokenizer), and
generation runs through mlx-lm's ``generate_step`` with a cache list we build, so a
prompt longer than the model's trained context can run through the cascade.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlotspark  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
from mlx_lm.generate import generate_step

from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)
QUESTION = "\n\nWhat is the pass key? Answer with the number only."


def load_engine(model: str | None = None) -> Any:
    """The engine with the (default) model, weights as ``auto`` picks them."""
    from mlotspark.engine import Engine

    return Engine.load(model, progress=False)


def passkey_prompt(engine: Any, n_tokens: int, depth: float, key: int) -> list[int]:
    """Chat-template token ids of a passkey prompt about ``n_tokens`` long.

    Args:
        n_tokens: target prompt length (filler repeated to reach it).
        depth: where the key sits, 0 (start) .. 1 (end of the filler).
        key: the 5-digit pass key.
    """
    def build(n: int) -> list[int]:
        before = int(round(n * depth))
        text = (
            INTRO
            + FILLER * before
            + f"The pass key is {key}. Remember it. {key} is the pass key. "
            + FILLER * (n - before)
            + QUESTION
        )
        return engine.encode(text)

    unit = len(engine.encode(FILLER * 8, raw=True)) / 8
    n = max(1, int(n_tokens / unit))
    for _ in range(3):  # the chat template and token merges at joins: correct twice
        ids = build(n)
        n = max(1, n + int((n_tokens - len(ids)) / unit))
    return build(n)


def passkey_cases(trials: int, seed: int = 0) -> list[tuple[int, float]]:
    """(key, depth) per trial: depths spread evenly over (0, 1), keys random."""
    rng = random.Random(seed)
    return [(rng.randint(10000, 99999), (i + 0.5) / trials) for i in range(trials)]


def make_cache(engine: Any, mode: str, config: CascadeConfig | None) -> list:
    """Per-layer caches: ``full`` = plain KV, ``streaming`` = top_k 0, ``cascade`` = config."""
    model = engine.loaded.model
    if mode == "full":
        return model.make_cache()
    assert config is not None
    if mode == "streaming":
        config = CascadeConfig(**{**config.to_dict(), "top_k": 0})
    return make_cascade_cache(model, config)


@dataclass
class Run:
    """What one greedy generation did."""

    text: str
    tokens: list[int]
    prefill_s: float
    decode_ms: list[float]  # per decoded token
    peak_mb: float


def run_greedy(engine: Any, ids: list[int], cache: list, max_tokens: int, chunk: int = 512, stop: bool = True) -> Run:
    """Greedy-generate ``max_tokens`` through ``cache`` (stopping at EOS if ``stop``)."""
    eos = set(engine.tokenizer.eos_token_ids or ()) if stop else set()
    mx.reset_peak_memory()
    toks, stamps = [], []
    t0 = time.perf_counter()
    for t, _ in generate_step(mx.array(ids), engine.loaded.model, max_tokens=max_tokens, prompt_cache=cache, prefill_step_size=chunk):
        stamps.append(time.perf_counter())
        if t in eos:
            break
        toks.append(t)
    decode_ms = [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]
    return Run(engine.tokenizer.decode(toks), toks, stamps[0] - t0, decode_ms, mx.get_peak_memory() / 1e6)


def emit(record: dict, out: Path | None) -> None:
    """Print a JSON line and append it to ``out``."""
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(line + "\n")


def command_line() -> str:
    return "python " + " ".join(sys.argv)
