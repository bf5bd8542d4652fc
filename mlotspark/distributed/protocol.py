"""The step protocol between rank 0 and the other ranks: messages and shared decisions.

Rank 0's scheduler decides; before each piece of MLX work that touches the batch it
broadcasts one small JSON message (``RankGroup.broadcast_json``), and every other rank
does the same work on its share of the model (``follower.py``). Only hidden states
cross ranks as tensors (``pipeline.py``). Messages, by ``op``:

| op | sent when | carries | then |
|---|---|---|---|
| ``join`` | a request is admitted | id, prompt ids, prefill chunk, cascade config, conversation | gather: can each rank hold its share? |
| ``replay`` (no op field) | a rank lacks its share of a conversation | the cached token ids | every rank re-runs them (``replay``) |
| ``prefill`` | a prefill chunk | ids, batched or alone | the same chunk on every rank |
| ``decode`` | a decode step | ids in row order | the same step on every rank |
| ``leave`` | a request finished or was cancelled | id, tokens fed after the prompt, save | gather: snapshot outcome, figures |
| ``drop`` | a request failed | id | |
| ``status`` | about once a second while busy, or when asked | | gather: every rank's figures |
| ``reset`` | rank 0 dropped its batch after an error | | |
| ``idle`` | every ``IDLE_BEAT_S`` while rank 0 has no work | sleep_s | the others sleep, not poll |
| ``stop`` | rank 0 closes | | the others return from ``follow`` |

Chunk lengths and the batch's packing are not sent: every rank runs the same
``runtime`` code (``prefill_batch``, ``DecodeBatch``) on the same counters, so they
come out the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import mlx.core as mx

from mlotspark.memory.cascade import CascadeConfig, is_cascade, make_cascade_cache
from mlotspark.models.execution import runner_for

#: seconds without progress before rank 0 gives up on the other ranks.
DEFAULT_TIMEOUT_S = 120.0
#: While rank 0 is idle it sends an ``idle`` message this often, and the others sleep that
#: long before they wait for the next one: MLX's ring backend polls inside a collective, so
#: a rank waiting there for rank 0's next step would keep a core busy for as long as it
#: waited. The cost: a request that arrives while the others sleep starts up to this much
#: later. After ``Engine.load``, the group is the engine's: rank 0's own code must not run
#: collectives on it until ``close``, nor the others' before ``follow`` returns.
IDLE_BEAT_S = 0.1


def cascade_message(cache: list) -> dict | None:
    """Rank 0's cascade settings for a request (None: plain KV caches), as JSON-safe data.

    Every rank must hold the same kind of memory for its layers, so the followers take
    rank 0's choice rather than deciding again. The spill directory is a local path: left out.
    """
    if not is_cascade(cache):
        return None
    return {k: v for k, v in asdict(cache[0].config).items() if k != "spill_dir"}


def cascade_from_message(data: dict | None, local: "CascadeConfig | None" = None) -> "CascadeConfig | None":
    """The CascadeConfig of ``cascade_message`` (validated again), with this rank's own
    spill directory (``local.spill_dir``, else the default)."""
    if data is None:
        return None
    return CascadeConfig(**data, spill_dir=local.spill_dir if local is not None else None)


def join_plan(answers: list[dict], replayable: bool) -> tuple[str, list[int], str]:
    """What every rank does after the ``join`` gather; each rank decides alone, the same way.

    Args:
        answers: every rank's ``{"ok", "error", "lacks"}``, in rank order.
        replayable: rank 0 has the token ids of the conversation's cached prefix.

    Returns:
        ``(plan, lacking ranks, error)``: ``go``; ``replay`` (the lacking ranks rebuild
        their share from the tokens); or ``refuse`` with the first rank's error.
    """
    bad = [(r, a) for r, a in enumerate(answers) if not a.get("ok")]
    if not bad:
        return "go", [], ""
    if replayable and all(a.get("lacks") for _, a in bad):
        return "replay", [r for r, _ in bad], ""
    r, a = bad[0]
    return "refuse", [r for r, _ in bad], f"rank {r} cannot continue this request: {a.get('error')}"


def fresh_cache(model: Any, cascade: "CascadeConfig | None") -> list:
    """An empty cache of this rank's layers: the cascade of ``cascade``, else plain KV, with
    the attention of the share's runner (``model``: the runner, or a bare share)."""
    runner = runner_for(model)
    if cascade is not None:
        return make_cascade_cache(runner.model, cascade, attention=runner.attention)
    return runner.make_cache()


def replay(model: Any, cache: list, tokens: list[int], chunk: int, beat: Callable[[], None] = lambda: None) -> None:
    """Run ``tokens`` through this rank's layers (``model``: the share's runner) into ``cache``,
    in chunks, as a prefill does.

    Every rank runs it together (the hidden states cross ranks): a rank that lacks its
    share of a conversation rebuilds it into its real cache; the others into a scratch one.

    Args:
        chunk: tokens per forward pass (the request's ``prefill_chunk``).
        beat: called after each chunk (rank 0's watchdog counts it as progress).
    """
    for i in range(0, len(tokens), max(1, chunk)):
        model(mx.array(tokens[i : i + chunk])[None], cache=cache)  # (1, L): only the cache is kept
        mx.eval([c.state for c in cache])
        beat()
