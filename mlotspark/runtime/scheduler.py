"""The engine thread: a priority queue, continuous batching and the thermal governor.

One thread owns MLX (DESIGN §5). Callers put requests in a priority queue (lower
``priority`` first, then arrival) and read token streams from their handles. Each
turn of the loop:

1. runs jobs other code asked to run on this thread (``Scheduler.call``);
2. drops cancelled requests at once, releasing the KV they hold;
3. asks the governor for a decision: a cool-down pause sleeps here, and the batch
   never exceeds ``Decision.cap`` (sequences beyond the cap keep their KV and wait);
4. admits queued requests while the batch has room and ``governor.admit`` agrees
   (projected KV + weights under the memory limit); a refused request stays queued
   and no running request is touched;
5. runs one prefill chunk of the oldest admitted request, in one forward pass with
   the chunks of the next admitted ones when their caches are plain KV
   (``runtime/prefill.py``, as mlx-lm's ``BatchGenerator`` prefills), so a burst of
   requests joins the batch together and a long prompt stalls the streams briefly;
6. runs one decode step of every running request: one batched step
   (``batching.DecodeBatch``) over those that decode a token at a time, then one step of
   each that decodes in its own loop; a request joins after its prefill and leaves when
   it finishes.

Each admitted request is one ``sequence.Sequence`` and prefills as above, then runs in
the one list of running requests. Beam search, speculative decoding and several returns
(``Generation.own_loop``) are steppers there: each turn takes one step of their loop
(``Sequence.pieces``: a decode step of every beam, or one token), right after the
batch's step, so a beam request never holds the thread for its whole length. Every other
request joins the batch, also for a model whose attention does not go through
``cache.attend`` (mlx-lm's classes): its rows then each take a step of their own
(``DecodeBatch``), and a lone request is a batch of one.

The engine thread's loop, admission and cancellation share one lock and one queue here;
how the running requests step each turn is ``stepping.py`` (a mixin of ``Scheduler``), the
batch step ``batching.py``, what the thread holds (requests, jobs, step records)
``scheduled.py``.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

import mlx.core as mx

from mlotspark.models.execution import runner_for
from mlotspark.runtime.batching import DecodeBatch, supports_batching
from mlotspark.runtime.mirror import StepMirror
from mlotspark.runtime.prefill import MAX_PREFILL_BATCH, prefill_batch, prefill_chunk
from mlotspark.platform import blas
from mlotspark.platform.device import is_metal, release_idle_memory
from mlotspark.errors import MlotsparkError, OptionError
from mlotspark.runtime.scheduled import Job, Request, StepRecord, cache_bytes
from mlotspark.runtime.sequence import Sequence
from mlotspark.runtime.stepping import Stepping
from mlotspark.runtime.scheduler_config import (
    SchedulerConfig,
    ThroughputMeter,
    governor_snapshot,
    kv_bytes_per_token,
    parse_memory_limit,
)
from mlotspark.thermal.governor import ThermalGovernor

log = logging.getLogger(__name__)

__all__ = ["SchedulerConfig", "Scheduler", "governor_snapshot", "parse_memory_limit",
           "kv_bytes_per_token"]

_KV_STEP = 256  # mlx-lm's KVCache grows in steps of this many tokens
_IDLE_WAIT_S = 0.5  # wake-up period while idle or paused (cancels are noticed sooner: notify)

# Engine threads still running at exit are stopped first, so each clears its MLX
# streams before the runtime goes (else MLX may abort the process at exit).
_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_engine_threads() -> None:
    for scheduler in list(_LIVE):
        scheduler.close(timeout=2.0)


class Scheduler(Stepping):
    """Runs requests on one engine thread, batching their decode steps.

    Args:
        model: the loaded model's runner (``LoadedModel.runner``); a bare model runs plainly.
        governor: the thermal governor (cap, pauses, admissions).
        lock: held around each turn's MLX work, so code that serialises on the
            engine's lock stays safe (never hold it while waiting on a request).
        weights_bytes: bytes of the weights (counted as in use by the memory guard).
        eos: end-of-sequence token ids.
        clock: seconds, for pauses and throughput (default ``time.perf_counter``).
        mirror: told of every step, for processes that run the same steps (the
            other ranks of a distributed run); default none.
    """

    def __init__(
        self,
        model: Any,
        governor: ThermalGovernor,
        *,
        lock: threading.RLock | None = None,
        weights_bytes: int = 0,
        eos: set[int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        mirror: StepMirror | None = None,
    ) -> None:
        self.runner = runner_for(model)  # what every step calls (models/execution.py)
        model = self.runner.model
        self.mirror = mirror or StepMirror()
        self.governor = governor
        self.lock = lock or threading.RLock()
        self.weights_bytes = weights_bytes
        self.eos = set(eos or ())
        self.batching = supports_batching(model)
        #: Launch step N+1 before taking in step N's tokens (mlx-lm's pipelining): True,
        #: False, or None = on a GPU only. On MLX's CPU backend ``mx.async_eval`` of a
        #: decode step's ~600 ops returns only when ~all of them have run (it bounds the
        #: tasks in flight), so there is nothing to overlap and the order would hand every
        #: token over one step late: the first one too (TTFT), and a finished request
        #: would pay one wasted step.
        self.pipelined: bool | None = None
        self.kv_per_token = kv_bytes_per_token(model)
        self._batch = DecodeBatch(self.runner)
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[tuple[tuple[int, int], Request]] = []  # heap by (priority, seq_no)
        self._jobs: list[Job] = []
        self._prefilling: list[Request] = []
        self._running: list[Request] = []  # batched rows and steppers (``Request.stepper``) alike
        self._counter = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._aborted: BaseException | None = None
        self._running_jobs: list[Job] = []
        self._batch_size = 0
        self._paused_until = 0.0
        self._admission = "no request yet"
        self._completed = 0
        self._tokens = 0
        self._meter = ThroughputMeter(governor, cpu_backend=not is_metal())
        self._last_collect = 0.0
        self.cpu_clock: Callable[[], float] = time.process_time
        self.pause_wait_s = _IDLE_WAIT_S  # longest single wait of a pause (tests shorten it)
        #: recent decode steps and pauses, oldest first (for the bench's plot)
        self.timeline: deque[StepRecord] = deque(maxlen=20000)

    # ------------------------------------------------------------ caller side
    def submit(self, request: Request) -> None:
        """Queue a request; the engine thread picks it up by priority."""
        if self._aborted is not None:
            raise self._aborted
        if self._closed:
            raise RuntimeError("the engine's scheduler is closed")
        g = request.generation
        new_tokens = len(g.prompt) + g.max_new_tokens()
        held = cache_bytes(g.cache)
        request.projected_bytes = held + self.kv_per_token * (-(-new_tokens // _KV_STEP) * _KV_STEP)
        request.seq_no = next(self._counter)
        with self._cond:
            heapq.heappush(self._queue, (request.sort_key, request))
            self._ensure_thread()
            self._cond.notify_all()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the engine thread between steps; return its value.

        Use it for any MLX work outside a request (saving or restoring caches).
        Called on the engine thread itself (e.g. from ``on_finish``), it runs at once.

        Raises:
            Whatever ``fn`` raises.
        """
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        job = Job(lambda: fn(*args, **kwargs))
        with self._cond:
            if self._aborted is not None:
                raise self._aborted
            if self._closed:
                raise RuntimeError("the engine's scheduler is closed")
            self._jobs.append(job)
            self._ensure_thread()
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return job.value

    def start(self) -> None:
        """Start the engine thread now, not at the first request (a mirror's idle beat)."""
        with self._cond:
            if not self._closed:
                self._ensure_thread()

    def wake(self) -> None:
        """Make the engine thread look at its requests now (after a cancel)."""
        with self._cond:
            self._cond.notify_all()

    def close(self, timeout: float | None = 5.0) -> bool:
        """Cancel everything, stop the engine thread and wait for it.

        Returns:
            True when the engine thread has stopped (or never ran); False when it is still
            busy after ``timeout`` (e.g. blocked inside MLX on a stalled distributed rank).
        """
        with self._cond:
            self._closed = True
            for _, r in self._queue:
                r.generation.cancel.set()
            for r in self._prefilling + self._running:
                r.generation.cancel.set()
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        return t is None or not t.is_alive()

    def status(self) -> dict[str, Any]:
        """State, cap, batch size, queue length and the last reasons (for API, TUI, bench).

        Returns:
            ``state``, ``cap``, ``mode``, ``batch_size``, ``running``, ``prefilling``,
            ``queued``, ``paused_s``, ``reason`` (the governor's last one-line reason),
            ``admission`` (the last admission decision), ``kv_bytes`` (KV held by
            requests in flight), ``completed``, ``decoded_tokens``, ``decode_tps``
            (aggregate, last window)
            and ``governor`` (the governor's full status).
        """
        gov = self.governor.status(last=5)
        with self._cond:
            in_flight = self._prefilling + self._running
            out = {
                "state": gov["state"],
                "cap": gov["cap"],
                "mode": gov["effective_mode"],
                "batch_size": self._batch_size,
                "running": len(self._running),
                "prefilling": len(self._prefilling),
                "queued": len(self._queue),
                "paused_s": max(0.0, self._paused_until - self._clock()),
                "reason": gov["reason"],
                "admission": self._admission,
                "completed": self._completed,
                "decoded_tokens": self._tokens,
                "decode_tps": round(self._meter.last_tps, 2),
                "batching": self.batching,
            }
        out["kv_bytes"] = self._batch.nbytes + sum(cache_bytes(r.generation.cache) for r in in_flight)
        out["governor"] = gov
        return out

    # ------------------------------------------------------------ engine side
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="mlotspark-engine", daemon=True)
            self._thread.start()
            _LIVE.add(self)

    def _idle(self) -> bool:
        return not (self._queue or self._jobs or self._prefilling or self._running)

    def _loop(self) -> None:
        try:
            while True:
                beat = self.mirror.beat_s
                with self._cond:
                    while self._idle() and not self._closed:
                        self._cond.wait(beat or _IDLE_WAIT_S)
                        if beat is not None and self._idle() and not self._closed:
                            break  # the mirror's beat, below
                    if self._closed and self._idle():
                        return
                    idle = self._idle()
                    jobs, self._jobs = self._jobs, []
                    self._running_jobs = jobs
                if idle:
                    with self.lock:
                        self.mirror.idle()
                    continue
                try:
                    with self.lock:
                        for job in jobs:
                            self._run_job(job)
                        self._turn()
                        if self._idle():
                            release_idle_memory()  # gone idle: MLX's buffer cache back to the system
                except Exception as e:  # noqa: BLE001  fail the requests, keep the thread alive
                    log.exception("engine step failed")
                    self._fail_all(e)
        finally:
            # MLX wants a thread's streams destroyed before it ends, or the process
            # may abort at exit ("terminate called without an active exception").
            clear = getattr(mx, "clear_streams", None)
            if clear is not None:
                clear()

    @staticmethod
    def _run_job(job: Job) -> None:
        try:
            job.value = job.fn()
        except BaseException as e:  # noqa: BLE001  handed to the caller
            job.error = e
        job.done.set()

    def _turn(self) -> None:
        """One turn: cancels, governor, admissions, a prefill chunk, a decode step."""
        self._sweep_cancelled()
        if self._idle():
            return
        self.mirror.turn()
        decision = self.governor.update()
        if decision.threads is not None and blas.fit_threads(decision.threads):
            throughput = getattr(self.governor, "throughput", None)
            if throughput is not None:  # a rate at the old thread count is no reference now
                throughput.rebase()
        if decision.pause_s > 0:
            self._drain()
            t0 = self._clock()
            self._paused_until = t0 + decision.pause_s
            self._batch_size = 0
            with self._cond:  # a cancel or a submit cuts the wait short
                self._cond.wait(min(decision.pause_s, self.pause_wait_s))
            self._meter.reset()
            self.timeline.append(StepRecord(self._clock(), decision.state, decision.cap, 0,
                                            self._clock() - t0, len(self._queue), paused=True))
            return
        cap = max(1, decision.cap)
        self._admit(cap)
        if self._prefilling:
            self._prefill()
            if not self._running:
                return
        if self._running:
            self._decode(decision.state, cap)
        if not self._running:
            self._drain()  # its rows all finished: discard the extra step
            self._batch_size = 0

    def _prefill(self) -> None:
        """Run one prefill chunk: of the oldest admitted request, together with the
        next ones (up to ``MAX_PREFILL_BATCH``) when their caches are all plain KV;
        requests with nothing left to prefill join the decode batch."""
        first = self._prefilling[0]
        if first.state.plain and self.batching:
            group = [r for r in self._prefilling if r.state.plain][:MAX_PREFILL_BATCH]
            with self.mirror.prefill(group, batched=True):
                prefill_batch(self.runner, [r.state for r in group])
        else:  # a cascade or quantized cache, or a model without cache.attend: alone
            group = [first]
            with self.mirror.prefill(group, batched=False):
                prefill_chunk(self.runner, first.state)
        for r in group:
            if r.state.prefill_left == 0:
                if r.state.meter is not None:
                    r.state.meter.finish()  # a one-token prompt had no chunk to report
                self._prefilling.remove(r)
                if r.generation.own_loop:  # beams, speculation, several returns: a stepper
                    r.stepper = r.state.pieces()
                self._running.append(r)

    def _admit(self, cap: int) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    return
                in_flight = self._prefilling + self._running
                active = len(in_flight)
                if active >= cap:
                    return
                r = self._queue[0][1]
                in_use = self.weights_bytes + sum(x.projected_bytes for x in in_flight)
                ok, why = self.governor.admit(r.projected_bytes, in_use, active)
                self._admission = why
                if not ok:
                    if active == 0:  # nothing to wait for: it can never fit
                        heapq.heappop(self._queue)
                        self._fail(r, OptionError(f"request cannot run under the memory limit: {why}"))
                        continue
                    return
                heapq.heappop(self._queue)
            try:
                r.state = Sequence(r.generation, self.eos, r.handle.progressed)
            except Exception as e:  # noqa: BLE001  e.g. a grammar that cannot be built: that request fails
                self._fail(r, e)
                continue
            r.state.stats.extra["queue_s"] = round(time.perf_counter() - r.submitted_at, 4)
            self._prefilling.append(r)
            try:
                self.mirror.joined(r)
            except MlotsparkError as e:  # e.g. another rank cannot hold its share: this request fails
                self._prefilling.remove(r)
                self._fail(r, e)

    # ----------------------------------------------------------- finishing
    def _sweep_cancelled(self) -> None:
        with self._cond:
            queued = [r for _, r in self._queue if r.generation.cancel.is_set()]
            if queued:
                self._queue = [(k, r) for k, r in self._queue if not r.generation.cancel.is_set()]
                heapq.heapify(self._queue)
        for r in queued:
            r.state = Sequence(r.generation, self.eos, r.handle.progressed)
            self._finish(r, "cancelled")
        for group in (self._prefilling, self._running):
            for r in [r for r in group if r.generation.cancel.is_set()]:
                if r.stepper is not None:  # its loop sees the cancel and ends with what it has
                    self._step_own(r)
                    continue
                group.remove(r)
                self._finish(r, "cancelled")

    def _finish(self, r: Request, reason: str | None = None) -> None:
        """End a request, however it ran: its result to the record, its text's tail and the
        result to the handle; a cancelled request's KV is dropped unless the caller owns it."""
        seq = r.state
        assert seq is not None
        if r.stepper is not None:  # its own loop: ended, or stopped now at the current token
            r.stepper.close()
            seq.cut()  # the text so far, when the loop had not made its result
        else:
            cancelled = (reason or seq.finish) == "cancelled"
            self._batch.release(seq, write_back=not (cancelled and r.owns_cache))
            if not seq.decoded:
                seq.fed_prompt(seq.prefilled)  # what the cache really holds
            piece = seq.close(reason)
            if piece:
                r.handle.emit(piece)
        try:
            self.mirror.left(r)
        except MlotsparkError as e:  # the reply is whole; only what the others kept of it is not
            seq.stats.extra["mirror_error"] = str(e)
        if seq.stats.finish_reason == "cancelled":
            self._release(r)
        self._completed += 1
        self._deliver(r)

    def _release(self, r: Request) -> None:
        """Drop the engine's references to a cancelled request's KV and return the memory."""
        if r.owns_cache:
            self._drop_cache(r)
        mx.clear_cache()

    @staticmethod
    def _drop_cache(r: Request) -> None:
        if r.state is not None:
            r.state.drop_cache()
        else:
            r.generation.cache = []

    def _deliver(self, r: Request) -> None:
        error = None
        if r.on_finish is not None:
            try:
                r.on_finish(r.generation)
            except Exception as e:  # noqa: BLE001  the caller sees it from result()
                error = e
        r.handle.finish(r.generation.result, error)

    def _fail(self, r: Request, error: BaseException) -> None:
        self.mirror.dropped(r)
        if r.owns_cache:
            self._drop_cache(r)
        self._completed += 1
        r.handle.finish(None, error)

    def _fail_all(self, error: BaseException) -> None:
        with self._cond:
            failed = self._prefilling + self._running
            self._prefilling, self._running = [], []
        self._batch = DecodeBatch(self.runner)  # whatever it packed is gone with them
        self.mirror.reset()
        for r in failed:
            self._fail(r, error)

    def abort(self, error: BaseException) -> None:
        """Fail everything queued, running or waiting on this thread with ``error``, and
        refuse new work: for an engine thread that cannot come back (blocked inside MLX
        on a distributed rank that stalled). Callable from any thread."""
        with self._cond:
            self._aborted, self._closed = error, True
            failed = [r for _, r in self._queue] + self._prefilling + self._running
            self._queue, self._prefilling, self._running = [], [], []
            jobs, self._jobs = self._jobs + self._running_jobs, []
            self._cond.notify_all()
        for r in failed:
            r.handle.finish(None, error)
        for job in jobs:
            if not job.done.is_set():
                job.error = error
                job.done.set()
