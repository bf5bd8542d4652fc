"""How the engine thread steps its running requests, once per turn: ``Scheduler``'s decode half.

One list holds every running request (``Scheduler._running``). Each turn the ones under the
governor's cap take one step: those that decode a token at a time together, in one batched
step (``batching.DecodeBatch``, pipelined on a GPU), then each stepper (beam search,
speculative decoding, several returns: ``Request.stepper``, its ``Sequence.pieces``) one
step of its own loop, so no request holds the thread for its whole reply. Each token goes
through its ``Sequence``'s acceptance; a finished request goes to ``Scheduler._finish``.

A mixin, split from ``scheduler.py`` along this concern: the scheduler owns the state it
uses (``_running``, ``_batch``, ``mirror``, ``pipelined``, the clocks, meter and timeline).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlotspark.runtime.scheduled import Request, StepRecord

__all__ = ["Stepping"]


class Stepping:
    """The decode half of ``scheduler.Scheduler``: one step of every running request per turn."""

    _running: list[Request]
    _batch: Any  # batching.DecodeBatch
    _batch_size: int
    _tokens: int
    _last_collect: float
    _queue: list
    _meter: Any  # scheduler_config.ThroughputMeter
    timeline: Any  # deque[StepRecord]
    mirror: Any  # mirror.StepMirror
    pipelined: bool | None
    cpu_clock: Any
    _clock: Any
    # and the scheduler's ``_finish(request)`` and ``_fail(request, error)``, which end a request

    def _decode(self, state: str, cap: int) -> None:
        """Step the running requests once: launch the next batched step, take in the tokens
        of the one before (pipelined, on a GPU) or of this one (on the CPU: see
        ``pipelined``), then step each stepper once.

        This turn's requests are the running ones in priority order up to the cap; those
        beyond it keep their KV and wait. Pipelined, a request that finishes was also
        fed to the step just launched (as in mlx-lm's loop): one wasted row, no stall.
        """
        self._running.sort(key=lambda r: r.sort_key)
        turn = self._running[:cap]
        self._batch_size = len(turn)
        batch = [r for r in turn if r.stepper is None]
        if batch:
            self._step_batch(batch, state, cap)
        else:
            self._drain()  # only steppers this turn: the batch's last step is taken in now
        for r in turn:
            if r.stepper is not None:
                self._step_own(r)

    def _step_batch(self, batch: list[Request], state: str, cap: int) -> None:
        """Launch the batch's next step over ``batch`` and take in the tokens that are ready."""
        c0 = self.cpu_clock()
        with self.mirror.decode(batch):
            prev = self._batch.launch([r.state for r in batch])
        step = self._batch.inflight
        step.tag = (state, cap)  # type: ignore[union-attr]  # what it ran under
        self._take(self._batch.collect(prev), prev, c0)
        pipelined = self.pipelined
        if pipelined is None:
            pipelined = mx.default_device().type == mx.DeviceType.gpu
        if not pipelined:  # take this step's tokens now (prev was None: drained last turn)
            self._take(self._batch.drain(), step, c0)

    def _drain(self) -> None:
        """Take in the step in flight, if any (before a pause, or with no one left)."""
        prev = self._batch.inflight
        if prev is not None:
            self._take(self._batch.drain(), prev, self.cpu_clock())

    def _take(self, results: list, step: Any, c0: float) -> None:
        """Account a collected step and hand each running request its token."""
        if step is None:
            return
        now = self._clock()
        owners = {id(r.state): r for r in self._running}
        b = sum(id(seq) in owners for seq, _ in results)  # rows still wanted: real tokens
        if b:
            # The stream ran this step from its launch or from the previous step's end.
            step_s = now - max(step.t_launch, self._last_collect)
            cpu_s = self.cpu_clock() - c0
            state, cap = step.tag
            self._meter.add(b, step_s, cpu_s, context=max(  # a longer context is slower, not hotter
                (r.generation.cached_tokens + len(r.generation.prompt) + r.state.steps for r in self._running), default=0))
            self.timeline.append(StepRecord(now, state, cap, b, step_s, len(self._queue), cpu_s=cpu_s))
            self._tokens += b
        self._last_collect = now
        for seq, tok in results:
            r = owners.get(id(seq))
            if r is None:  # finished or cancelled meanwhile: nothing to hand over
                continue
            piece = r.state.accept(tok)
            if piece:
                r.handle.emit(piece)
            if r.state.finish is not None:
                self._running.remove(r)
                self._finish(r)

    def _step_own(self, r: Request) -> None:
        """One step of a request that decodes in its own loop (a stepper)."""
        try:
            piece = next(r.stepper, None)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001  that request fails, the others go on
            self._running.remove(r)
            self._fail(r, e)
            return
        if piece is None:  # its loop ended: the result is made
            self._running.remove(r)
            self._finish(r)
        elif piece:
            r.handle.emit(piece)
