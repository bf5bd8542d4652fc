"""Requests across ranks: rank 0 leads, the other ranks follow.

Rank 0 takes requests from a queue and runs them one at a time on a worker thread
that owns MLX. Before each request it broadcasts the prompt ids, options, its cascade
choice and the conversation whose caches the ranks continue (JSON); every other rank
sits in ``follow``, receives them and runs the same token loop on its share of the
model, so every rank makes the same sequence of collective calls. Each request has
two gathers around its token loop: "ready" (a rank that cannot set up its share, e.g.
has no cache of that conversation, says why and rank 0 fails the request before any
token) and "done" (each rank's snapshot outcome and figures: memory, heat, step time).
Rank 0's sampler decides each token for all (``pipeline.broadcast_sampler``): a
cancel on rank 0 turns into an end-of-sequence token for every rank at the same step.

A rank that dies breaks its connections, and MLX raises at once; a rank that stalls
(a stopped process, a hung machine) leaves rank 0 blocked inside MLX, where no
Python timeout reaches. So a watchdog thread times each request's progress: when no
token has arrived for ``timeout`` seconds it fails the request with a
``DistributedError`` and marks the runner broken (the blocked worker thread is a
daemon, left behind); every later request fails at once with the same error.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import psutil

from mlotspark.errors import DistributedError, MlotsparkError, SnapshotError
from mlotspark.memory.cascade import CascadeConfig, is_cascade
from mlotspark.memory.kv_state import cache_kind
from mlotspark.options import GenerationOptions
from mlotspark.platform.device import peak_memory_mb
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.request_handle import RequestHandle
from mlotspark.thermal.governor import Thresholds
from mlotspark.thermal.probes import Reading, default_probes
from mlotspark.distributed.group import RankGroup, host_name, is_rank_failure
from mlotspark.distributed.pipeline import broadcast_sampler
from mlotspark.distributed.rank_memory import RankMemory

#: ``Thresholds.assess`` levels by name, coolest first.
THERMAL_STATES = ("nominal", "fair", "serious", "critical")

#: seconds without a new token before rank 0 gives up on the other ranks.
DEFAULT_TIMEOUT_S = 120.0

#: ``(prompt ids, options, cascade config or None, cache or None, cached tokens) -> Generation``:
#: a follower's request (the cache, when given, is its share of a conversation).
MakeGeneration = Callable[[list[int], GenerationOptions, "CascadeConfig | None", "list | None", int], Generation]


@dataclass
class RankRequest:
    """What rank 0 sends with a request besides prompt and options.

    Args:
        key: the conversation whose caches every rank continues (None: a fresh cache).
        cached: how many tokens rank 0's cache holds already.
        save: every other rank saves its share as a snapshot after the request.
        on_finish: called with the finished Generation on rank 0's worker thread.
    """

    key: str | None = None
    cached: int = 0
    save: bool = False
    on_finish: Callable[[Generation], None] | None = None


def options_message(options: GenerationOptions) -> dict:
    """Options as JSON-safe data for the other ranks."""
    return options.to_dict()


def options_from_message(data: dict) -> GenerationOptions:
    """Options back from ``options_message`` (validated again)."""
    return GenerationOptions(**data)


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


class RankStatus:
    """This rank's figures for ``mlotspark info --distributed`` and the TUI."""

    def __init__(self, group: RankGroup, layers: tuple[int, int], weights_bytes: int):
        self.group, self.layers, self.weights_bytes = group, layers, weights_bytes
        self.last_step_ms: float | None = None

    def read(self) -> dict:
        """Rank, host, layers, weight bytes, memory, thermal state and last step time."""
        reading = Reading.combine(p.read() for p in default_probes())
        level, why = Thresholds().assess(reading)
        vm = psutil.virtual_memory()
        return {
            "rank": self.group.rank, "host": host_name(), "layers": list(self.layers),
            "weights_mb": round(self.weights_bytes / 1e6, 1),
            "rss_mb": round(psutil.Process().memory_info().rss / 1e6, 1),
            "peak_mlx_mb": round(peak_memory_mb(), 1),
            "available_mb": round(vm.available / 1e6, 1),
            "thermal": THERMAL_STATES[level], "thermal_reason": why,
            "last_step_ms": self.last_step_ms,
        }


def _timed(gen: Generation, status: RankStatus, beat: Callable[[], None]):
    """Iterate ``gen``, recording step times and calling ``beat`` after each piece."""
    last = time.perf_counter()
    for piece in gen:
        now = time.perf_counter()
        status.last_step_ms = round((now - last) * 1000, 2)
        last = now
        beat()
        yield piece


class LeaderRunner:
    """Rank 0's request loop (see the module docstring).

    Args:
        group: the rank group (this process is rank 0).
        status: this rank's RankStatus.
        timeout: seconds without progress before the other ranks count as gone.
    """

    def __init__(self, group: RankGroup, status: RankStatus, timeout: float = DEFAULT_TIMEOUT_S):
        if timeout <= 0:
            raise DistributedError(f"invalid rank timeout {timeout!r}: must be > 0 seconds")
        self.group, self.status, self.timeout = group, status, timeout
        self.failed: DistributedError | None = None
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._current: RequestHandle | None = None
        #: every rank's ``RankStatus.read()`` as of the end of the last request (or status call).
        self.last_ranks: list[dict] = []
        self._last_beat = time.monotonic()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="mlotspark-rank0", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="mlotspark-rank-watchdog", daemon=True)
        self._worker.start()
        self._watchdog.start()

    # -------------------------------------------------------------- callers
    def submit(self, gen: Generation, request: RankRequest | None = None) -> RequestHandle:
        """Queue ``gen``; returns its handle (iterate, ``result()``, ``cancel()``).

        Args:
            gen: rank 0's Generation (its cache holds rank 0's layers).
            request: what the other ranks need besides prompt and options (the
                conversation whose caches they continue), and ``on_finish``.

        Raises:
            DistributedError: the ranks already failed, or the runner is closed.
        """
        self._check()
        handle = RequestHandle(gen)
        self._jobs.put(("generate", (gen, request or RankRequest()), handle))
        return handle

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` on the worker thread (the one that runs MLX on rank 0) and return
        its result; from that thread (an ``on_finish``) it runs at once. Rank 0 only."""
        if threading.current_thread() is self._worker:
            return fn()
        self._check()
        done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._jobs.put(("run", fn, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value

    def call(self, op: str, timeout: float | None = None) -> Any:
        """Run a control operation (``status``) on every rank; returns rank 0's result.

        Raises:
            DistributedError: the ranks failed or did not answer within the timeout.
        """
        self._check()
        done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._jobs.put((op, None, done))
        try:
            ok, value = done.get(timeout=timeout or self.timeout)
        except queue.Empty:
            if self._current is not None:  # queued behind a request: the watchdog judges that one
                raise DistributedError(f"{op!r} waited {timeout or self.timeout:g} s behind a running request") from None
            raise self._fail(f"the other ranks did not answer {op!r} within {timeout or self.timeout:g} s") from None
        if not ok:
            raise value
        return value

    @property
    def busy(self) -> bool:
        """True while a request or control operation is queued or running."""
        return self._current is not None or not self._jobs.empty()

    def close(self) -> None:
        """Tell the other ranks to stop (they return from ``follow``) and end the worker."""
        if self._closed:
            return
        self._closed = True
        if self.failed is None:
            self._jobs.put(("stop", None, None))
            self._worker.join(timeout=self.timeout)

    # --------------------------------------------------------- worker thread
    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise DistributedError("the distributed engine is closed")

    def _beat(self) -> None:
        self._last_beat = time.monotonic()

    def _fail(self, why: str, cause: BaseException | None = None) -> DistributedError:
        if self.failed is None:
            others = ", ".join(str(r) for r in range(1, self.group.size)) or "none"
            self.failed = DistributedError(f"{why}; ranks {others} died or stalled, the distributed engine stopped")
            if cause is not None:
                self.failed.__cause__ = cause
        return self.failed

    def _work(self) -> None:
        while True:
            op, gen, handle = self._jobs.get()
            if self.failed is not None:
                if isinstance(handle, RequestHandle):
                    handle._finish(None, self.failed)
                elif handle is not None:
                    handle.put((False, self.failed))
                continue
            self._beat()
            self._current = handle if isinstance(handle, RequestHandle) else None
            try:
                if op == "stop":
                    self.group.broadcast_json({"op": "stop"})
                    return
                if op == "status":
                    self.group.broadcast_json({"op": "status"})
                    self.last_ranks = self.group.gather_json(self.status.read())
                    handle.put((True, self.last_ranks))
                    continue
                if op == "run":
                    try:
                        handle.put((True, gen()))
                    except Exception as e:  # noqa: BLE001 - the caller gets it
                        handle.put((False, e))
                    continue
                self._generate(*gen, handle)
            except Exception as e:  # noqa: BLE001 - every failure ends the request, not the thread
                err = e
                if is_rank_failure(e) or isinstance(e, DistributedError):
                    err = self._fail(f"lost the connection to another rank ({e})", e)
                if isinstance(handle, RequestHandle):
                    handle._finish(None, err if isinstance(err, MlotsparkError) else e)
                elif handle is not None:
                    handle.put((False, err))
            finally:
                self._current = None

    def _generate(self, gen: Generation, request: RankRequest, handle: RequestHandle) -> None:
        user_cancel = handle.cancel_event
        eos = sorted(gen.tokenizer.eos_token_ids or ())
        # Rank 0 stops only where every rank stops: its own loop never sees the cancel;
        # the sampler sends an end-of-sequence token to all instead.
        gen.cancel = threading.Event()

        def forced() -> int | None:
            return eos[0] if eos and user_cancel.is_set() else None

        gen.sampler_wrapper = lambda s: broadcast_sampler(s, self.group.group, forced)
        memory = None
        if request.key is not None:
            memory = {"key": request.key, "cached": request.cached, "save": request.save,
                      "kind": cache_kind(gen.cache)}
        self.group.broadcast_json({"op": "generate", "prompt": list(gen.prompt),
                                   "options": options_message(gen.options),
                                   "cascade": cascade_message(gen.cache), "memory": memory})
        # Every rank says whether it could set up its share before any collective of the
        # token loop: a rank without its part of the conversation fails the request here.
        ready = self.group.gather_json({"ok": True})
        for r, answer in enumerate(ready):
            if not answer.get("ok"):
                raise SnapshotError(f"rank {r} cannot continue this request: {answer.get('error')}")
        for piece in _timed(gen, self.status, self._beat):
            if self.failed is not None:  # the watchdog gave up meanwhile
                return
            handle._emit(piece)
        assert gen.result is not None
        if user_cancel.is_set():
            gen.result.stats.finish_reason = "cancelled"
        # Every rank's figures and snapshot outcome, in the gather that ends each request:
        # rank 0 knows the others' memory, heat and step time without a round trip of its own.
        after = self.group.gather_json({"status": self.status.read()})
        self.last_ranks = [a["status"] for a in after]
        if memory is not None:
            gen.result.stats.extra["rank_snapshots"] = [a.get("saved") for a in after[1:]]
        if request.on_finish is not None:
            request.on_finish(gen)  # on this thread, as the scheduler calls it (MLX work allowed)
        handle._finish(gen.result)

    # ------------------------------------------------------------- watchdog
    def _watch(self) -> None:
        while self.failed is None and not (self._closed and not self._worker.is_alive()):
            time.sleep(min(0.25, self.timeout / 4))
            handle = self._current
            if handle is None:
                continue
            silent = time.monotonic() - self._last_beat
            if silent > self.timeout:
                err = self._fail(f"no progress from the other ranks for {silent:.0f} s (timeout {self.timeout:g} s)")
                handle._finish(None, err)
                return


def follow(group: RankGroup, make_generation: MakeGeneration, status: RankStatus,
           local_cascade: "CascadeConfig | None" = None, memory: RankMemory | None = None) -> int:
    """The loop of every rank but 0: run what rank 0 broadcasts until it says stop.

    Args:
        group: the rank group (this process is not rank 0).
        make_generation: builds a Generation from prompt ids, options and rank 0's
            cascade config (None: plain KV caches).
        status: this rank's RankStatus.
        local_cascade: this rank's own cascade config, for its spill directory.
        memory: this rank's share of the conversations (needed when rank 0 sends one).

    Returns:
        How many requests this rank ran.

    Raises:
        DistributedError: rank 0 (or a neighbour) is gone.
    """
    done = 0
    while True:
        msg = group.broadcast_json(None)
        op = msg.get("op")
        if op == "stop":
            return done
        if op == "status":
            group.gather_json(status.read())
            continue
        if op != "generate":
            raise DistributedError(f"rank {group.rank} got an unknown message {op!r} from rank 0")
        mem = msg.get("memory")
        try:
            cache, context = None, []
            if mem is not None and int(mem["cached"]) > 0:  # a continued conversation (else a fresh cache)
                if memory is None:
                    raise DistributedError(f"rank {group.rank} keeps no conversations (follow without memory)")
                context, cache = memory.take(mem["key"], int(mem["cached"]), mem["kind"])
            gen = make_generation(list(msg["prompt"]), options_from_message(msg["options"]),
                                  cascade_from_message(msg.get("cascade"), local_cascade), cache, len(context))
        except MlotsparkError as e:  # told to rank 0, which fails the request; this rank goes on
            group.gather_json({"ok": False, "error": str(e)})
            continue
        if not all(a.get("ok") for a in group.gather_json({"ok": True})):
            continue  # another rank could not: rank 0 fails the request before any token
        gen.sampler_wrapper = lambda s: broadcast_sampler(s, group.group)
        try:
            for _ in _timed(gen, status, lambda: None):
                pass
            saved = None
            if mem is not None and memory is not None:
                saved = memory.keep(mem["key"], context + list(gen.fed_tokens), gen.cache, bool(mem["save"]))
            group.gather_json({"saved": saved, "status": status.read()})
        except RuntimeError as e:
            if is_rank_failure(e):
                raise DistributedError(f"rank {group.rank} lost the connection to another rank ({e})") from e
            raise
        done += 1
