"""Rank 0: the scheduler's steps, told to every other rank; the watchdog over them.

Rank 0 runs the ordinary engine thread (``runtime/scheduler.py``): continuous batching,
the thermal governor's cap, admissions. ``RankLeader`` is its ``StepMirror``: before each
join, prefill chunk and decode step it broadcasts what the step is (``protocol.py``), so
the other ranks run the same batched step on their layers. Only rank 0 samples; the
others never see a logit or a token they need to decide anything on.

A rank that dies breaks its connections and MLX raises at once; a rank that stalls (a
stopped process, a hung machine) leaves rank 0 blocked inside MLX, where no Python
timeout reaches. So a watchdog thread times each step: when one has made no progress
for ``timeout`` seconds it marks the group failed and calls ``on_broken`` (the engine
fails every request and refuses new ones); the blocked engine thread is left behind.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mlotspark.errors import DistributedError, SnapshotError
from mlotspark.memory.kv_state import cache_kind
from mlotspark.runtime.mirror import StepMirror
from mlotspark.distributed.group import RankGroup, is_rank_failure
from mlotspark.distributed.protocol import (DEFAULT_TIMEOUT_S, IDLE_BEAT_S, cascade_message, fresh_cache,
                                            join_plan, replay)
from mlotspark.distributed.rank_status import RankStatus

#: figures older than this are asked for again at the start of a turn (they feed the governor).
STATUS_INTERVAL_S = 1.0


class RankLeader(StepMirror):
    """Rank 0's side of the step protocol (see the module docstring).

    Args:
        group: the rank group (this process is rank 0).
        model: rank 0's share of the model (for a replay's scratch cache).
        status: this rank's RankStatus.
        timeout: seconds a step may go without progress before the others count as gone.
    """

    def __init__(self, group: RankGroup, model: Any, status: RankStatus, timeout: float = DEFAULT_TIMEOUT_S):
        if not timeout > 0:
            raise DistributedError(f"invalid rank timeout {timeout!r}: must be > 0 seconds")
        self.group, self.model, self.status, self.timeout = group, model, status, timeout
        self.failed: DistributedError | None = None
        #: called once with the error when the watchdog gives up (the engine fails everything).
        self.on_broken: Callable[[DistributedError], None] | None = None
        #: every rank's ``RankStatus.read()``, rank 0 first, as of ``status_t``.
        self.last_ranks: list[dict] = []
        self.status_t = float("-inf")
        self._joined: set[int] = set()
        self._busy_since: float | None = None
        self._closed = False
        self._watchdog = threading.Thread(target=self._watch, name="mlotspark-rank-watchdog", daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------- the steps
    @property
    def beat_s(self) -> float | None:  # type: ignore[override]
        """The idle beat (``protocol.IDLE_BEAT_S``); None once the group failed or closed."""
        return IDLE_BEAT_S if self.failed is None and not self._closed else None

    def idle(self) -> None:
        """While the engine is idle: let the others sleep a beat instead of polling for the
        next step inside MLX (``protocol.IDLE_BEAT_S``). A rank lost meanwhile is found here,
        before the next request. Never raises."""
        if not self._closed:
            self._quietly({"op": "idle", "sleep_s": IDLE_BEAT_S})

    def turn(self) -> None:
        """Refresh every rank's figures when they are older than ``STATUS_INTERVAL_S``.

        Never raises: a failure marks the group failed, and each request then fails at its
        own next step (a queued one at its join), as the scheduler handles step errors."""
        if self.failed is None and time.monotonic() - self.status_t >= STATUS_INTERVAL_S:
            try:
                self.gather_status()
            except DistributedError:
                pass

    def joined(self, request: Any) -> None:
        """Tell every rank of a new request; replay a conversation a rank lost.

        Raises:
            SnapshotError: a rank cannot hold its share and it cannot be rebuilt.
            DistributedError: the ranks are gone.
        """
        gen, meta = request.generation, request.meta
        memory, context = None, meta.get("context")
        if meta.get("key") is not None:
            memory = {"key": meta["key"], "cached": gen.cached_tokens, "kind": cache_kind(gen.cache)}
        replayable = context is not None and len(context) == gen.cached_tokens > 0
        message = {"op": "join", "id": request.seq_no, "prompt": list(gen.prompt),
                   "chunk": gen.options.prefill_chunk, "max_tokens": gen.options.max_tokens,
                   "cascade": cascade_message(gen.cache), "memory": memory, "replayable": replayable}
        with self._op("setting up a request"):
            self.group.broadcast_json(message)
            answers = self.group.gather_json({"ok": True})
            plan, lacking, error = join_plan(answers, replayable)
            if plan == "replay":
                self.group.broadcast_json(list(context))
                # Rank 0 keeps its own cache: its layers run into a scratch one, for the hidden states.
                config = gen.cache[0].config if message["cascade"] is not None else None
                replay(self.model, fresh_cache(self.model, config), list(context), gen.options.prefill_chunk,
                       self._beat)
        if plan == "refuse":
            raise SnapshotError(error)
        if plan == "replay":
            request.state.stats.extra["rank_replayed"] = {"ranks": lacking, "tokens": len(context)}
        self._joined.add(request.seq_no)

    def prefill(self, requests: Sequence[Any], batched: bool) -> contextlib.AbstractContextManager[None]:
        return self._step("prefilling", {"op": "prefill", "ids": [r.seq_no for r in requests], "batched": batched})

    def decode(self, requests: Sequence[Any]) -> contextlib.AbstractContextManager[None]:
        return self._step("decoding", {"op": "decode", "ids": [r.seq_no for r in requests]})

    def left(self, request: Any) -> None:
        """Tell every rank a request ended: they keep (and save) their share of its
        conversation; their snapshot outcomes go to ``stats.extra["rank_snapshots"]``."""
        if request.seq_no not in self._joined:
            return
        self._joined.discard(request.seq_no)
        seq = request.state
        message = {"op": "leave", "id": request.seq_no, "fed": len(seq.fed_tokens),
                   "extra": list(seq.fed_tokens[len(seq.prompt):]), "save": bool(request.meta.get("save"))}
        with self._op("ending a request"):
            self.group.broadcast_json(message)
            after = self.group.gather_json({"status": self.status.read()})
        self._took_status([a["status"] for a in after])
        if request.meta.get("key") is not None:
            seq.stats.extra["rank_snapshots"] = [a.get("saved") for a in after[1:]]

    def dropped(self, request: Any) -> None:
        if request.seq_no in self._joined:
            self._joined.discard(request.seq_no)
            self._quietly({"op": "drop", "id": request.seq_no})

    def reset(self) -> None:
        self._joined.clear()
        self._quietly({"op": "reset"})

    # ----------------------------------------------------------- other work
    def gather_status(self) -> list[dict]:
        """Every rank's figures now (on the engine thread: a collective like the steps)."""
        with self._op("asking the ranks for their figures"):
            self.group.broadcast_json({"op": "status"})
            rows = self.group.gather_json(self.status.read())
        self._took_status(rows)
        return rows

    def stop(self) -> None:
        """Let the other ranks return from ``follow`` (once; not after a failure)."""
        if self._closed:
            return
        if self.failed is None:
            self._quietly({"op": "stop"})
        self._closed = True

    def check(self) -> None:
        """Raises: DistributedError: the ranks failed, or rank 0 closed."""
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise DistributedError("the distributed engine is closed")

    # -------------------------------------------------------------- helpers
    def _took_status(self, rows: list[dict]) -> None:
        self.last_ranks, self.status_t = rows, time.monotonic()

    def _beat(self) -> None:
        if self._busy_since is not None:
            self._busy_since = time.monotonic()

    @contextlib.contextmanager
    def _step(self, what: str, message: dict) -> Iterator[None]:
        """Broadcast ``message``, then let the body run rank 0's share of the step, timed."""
        t0 = time.perf_counter()
        with self._op(what):
            self.group.broadcast_json(message)
            yield
        self.status.last_step_ms = round((time.perf_counter() - t0) * 1000, 2)

    @contextlib.contextmanager
    def _op(self, what: str) -> Iterator[None]:
        """One collective piece of work: timed by the watchdog, its failures made DistributedErrors."""
        self.check()
        self._busy_since = time.monotonic()
        try:
            yield
        except DistributedError as e:
            raise self._fail(f"{e} (while {what})", e) from e
        except Exception as e:
            if self.failed is not None:  # the watchdog gave up meanwhile
                raise self.failed from e
            if is_rank_failure(e):
                raise self._fail(f"lost the connection to another rank while {what} ({e})", e) from e
            # The others are somewhere inside this step, waiting for rank 0: the group cannot go on.
            raise self._fail(f"rank 0 failed while {what} ({type(e).__name__}: {e})", e) from e
        finally:
            self._busy_since = None

    def _quietly(self, message: dict) -> None:
        """Broadcast a message no answer depends on; a failure marks the group failed, never raises."""
        if self.failed is not None:
            return
        try:
            with self._op(f"sending {message['op']!r}"):
                self.group.broadcast_json(message)
        except DistributedError:
            pass

    def _fail(self, why: str, cause: BaseException | None = None) -> DistributedError:
        if self.failed is None:
            others = ", ".join(str(r) for r in range(1, self.group.size)) or "none"
            self.failed = DistributedError(f"{why}; ranks {others} died or stalled, the distributed engine stopped")
            if cause is not None:
                self.failed.__cause__ = cause
        return self.failed

    def _watch(self) -> None:
        while self.failed is None and not self._closed:
            time.sleep(min(0.25, self.timeout / 4))
            since = self._busy_since
            if since is None:
                continue
            silent = time.monotonic() - since
            if silent > self.timeout:
                err = self._fail(f"no progress from the other ranks for {silent:.0f} s (timeout {self.timeout:g} s)")
                if self.on_broken is not None:
                    self.on_broken(err)
                return
