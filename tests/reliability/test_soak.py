"""Soak (issue 16 §6): many turns in one process, RSS, file descriptors and the
cascade's spill directory stay bounded. The sample runs 80 turns; the benchmark
1,000 (new conversations every 50, the cascade on for every other one)."""

from __future__ import annotations

from rel_common import FULL, count, record
from rel_soak import run_soak


def test_many_turns_keep_memory_descriptors_and_spill_bounded(tiny_gguf, tmp_path):
    per = count(10, 50)
    figures = run_soak(tiny_gguf, tmp_path / "home", turns=count(80, 1000), per_conversation=per)
    record("soak", **figures)
    assert figures["fds_end"] <= figures["fds_warm"] + 2 and figures["fds_max"] <= figures["fds_warm"] + 4, figures
    assert figures["spill_max_bytes"] <= figures["spill_budget_bytes"], figures
    # A short sample is still warming up (allocator pools, a new conversation's KV).
    assert figures["rss_growth"] < (0.05 if FULL else 0.25), figures
