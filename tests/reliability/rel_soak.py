"""Soak: many short turns in one process, watching memory, descriptors and spill files.

Two engines share the process and the home: one with plain attention (``auto``),
one with the memory cascade forced on with a tiny window and episodic budget, so
its blocks spill to disk every few turns. A new conversation starts every
``per_conversation`` turns (on alternating engines).
"""

from __future__ import annotations

import ctypes
import gc
import os
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
import psutil

WARM_MB = 4.0  # conversation caches kept in memory (per engine)


def _settle() -> None:
    # Freed MLX buffers stay in MLX's cache for reuse (sizes vary with each turn's
    # length), and glibc keeps freed heap pages until malloc_trim: what is measured is
    # what the process holds, not those caches (a leak survives both).
    gc.collect()
    mx.clear_cache()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> "ctypes.CDLL | None":
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # macOS, musl: RSS as it is
        return None


_LIBC = _glibc()


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def run_soak(model: Path, home: Path, turns: int, per_conversation: int = 50) -> dict:
    """Take ``turns`` turns; return RSS/fds/spill figures (RSS in MB, measured after
    dropping MLX's buffer cache and glibc's free pages) after the warm-up (below).

    Returns:
        ``rss_warm_mb``, ``rss_end_mb``, ``rss_growth`` (fraction after warm-up),
        ``fds_warm``, ``fds_end``, ``fds_max``, ``spill_max_bytes``, ``spill_budget_bytes``,
        ``spill_end_bytes``, ``turns``.
    """
    from mlotspark import Engine
    from mlotspark.memory.cascade import CascadeConfig

    os.environ["MLOTSPARK_HOME"] = str(home)
    proc = psutil.Process()
    budget_mb = 0.05  # per cascade cache: spills every few turns
    plain = Engine.load(str(model), progress=False, temperature=0.0, max_tokens=4)
    cascade = Engine.load(str(model), progress=False, temperature=0.0, max_tokens=4, cascade=CascadeConfig.for_model(
        65536, window=64, sinks=4, block_size=16, top_k=2, episodic_budget_mb=budget_mb))
    # Warm caches are kept by design up to warm_mb (default 512 MB): a small budget
    # evicts old conversations' caches, so growth past it would be a leak.
    for engine in (plain, cascade):
        engine.persistence.set_budgets(warm_mb=WARM_MB)
    spill = home / "spill"
    # Warm-up: the first 30% of the turns (at least two conversations, one per engine),
    # by when the warm-cache budgets are full (measured: ~300 of 1,000 turns).
    warm_at = min(turns, max(2 * per_conversation, int(0.3 * turns)))
    out: dict = {"turns": turns, "spill_max_bytes": 0, "fds_max": 0}
    try:
        for i in range(turns):
            k = i // per_conversation
            engine = cascade if k % 2 else plain
            engine.conversation(f"soak-{k}").send(f"Turn {i}: tell me something short.")
            if i % 10 == 0 or i == turns - 1:
                out["spill_max_bytes"] = max(out["spill_max_bytes"], _tree_bytes(spill))
                out["fds_max"] = max(out["fds_max"], proc.num_fds())
            if i + 1 == warm_at:
                _settle()
                out["rss_warm_mb"], out["fds_warm"] = proc.memory_info().rss / 1e6, proc.num_fds()
                out["mlx_active_warm_mb"] = mx.get_active_memory() / 1e6
        _settle()
        out["rss_end_mb"], out["fds_end"] = proc.memory_info().rss / 1e6, proc.num_fds()
        out["mlx_active_end_mb"] = mx.get_active_memory() / 1e6
        out["spill_end_bytes"] = _tree_bytes(spill)
    finally:
        plain.close()
        cascade.close()
    out["spill_budget_bytes"] = _spill_bound(per_conversation)
    out["rss_growth"] = out["rss_end_mb"] / out["rss_warm_mb"] - 1
    return out


def _spill_bound(per_conversation: int) -> int:
    # Spilled blocks of the cascade conversations the warm budget keeps: at most the
    # warm budget's worth of whole conversations, each at most its whole KV (tokens x
    # layers x k/v x heads x dim x 2 bytes, generously 200 tokens per turn).
    one = per_conversation * 200 * 2 * 2 * 2 * 16 * 2
    return max(int(WARM_MB * 1e6), 2 * one)
