"""What the engine thread tells other processes that run the same steps.

In a distributed run (``mlotspark.distributed``) the scheduler on rank 0 decides every
step, and every other rank holds the KV of its own share of the model: they must run
the same batched prefill and decode steps, in the same order, on the same requests.
The scheduler calls a ``StepMirror`` at each point where its MLX work changes what the
batch holds; the distributed leader sends those decisions to the other ranks (request
ids and lengths, never tensors). This base class does nothing: a single process.

The hooks run on the engine thread, in the order the scheduler does the work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ContextManager

__all__ = ["StepMirror"]


class StepMirror:
    """The scheduler's hooks for followers (no-ops here). ``request``: a scheduler ``Request``.

    Attributes:
        beat_s: while the engine is idle, call :meth:`idle` about this often (None: never).
    """

    beat_s: float | None = None

    def idle(self) -> None:
        """About every ``beat_s`` while the engine has no work (on the engine thread, under the
        engine's lock, not its queue's). Never raises."""

    def turn(self) -> None:
        """At the start of each engine-thread turn that has work (before the governor decides)."""

    def joined(self, request: Any) -> None:
        """``request`` was admitted and is about to prefill.

        Raises:
            MlotsparkError: the request cannot run (the scheduler fails it alone).
        """

    def prefill(self, requests: Sequence[Any], batched: bool) -> ContextManager[None]:
        """Around one prefill chunk of ``requests`` (``batched``: ``prefill_batch``, else
        ``prefill_chunk`` of the first)."""
        return contextlib.nullcontext()

    def decode(self, requests: Sequence[Any]) -> ContextManager[None]:
        """Around the launch of one decode step over ``requests``, in row order."""
        return contextlib.nullcontext()

    def left(self, request: Any) -> None:
        """``request`` finished or was cancelled; its KV was written back. Before ``on_finish``.

        Raises:
            MlotsparkError: the others could not be told; the reply is delivered whole, with
                the error in ``stats.extra["mirror_error"]`` (later requests fail on their own).
        """

    def dropped(self, request: Any) -> None:
        """``request`` failed; whatever it held elsewhere can go. Never raises."""

    def reset(self) -> None:
        """The scheduler dropped its whole batch after an error. Never raises."""
