"""A submitted request: iterate it for text pieces, wait on it, or cancel it.

The engine thread hands pieces over through a queue. A thread iterates the handle
(``for piece in handle``); an asyncio caller iterates it without a thread of its own
(``async for piece in handle.aiter()``): the engine thread then also schedules a
wake-up on the caller's loop with ``call_soon_threadsafe`` after each piece.

A reasoning model's reply is split as it is read (``decoding.reasoning``): its thinking
comes as ``ReasoningPiece``s, its answer as ``str``, and no tag in either.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, AsyncIterator, Callable, Iterator

from mlotspark.decoding.reasoning import ReasoningSplitter, splitter_of
from mlotspark.results import GenerationResult, GenerationStats, ReasoningPiece
from mlotspark.runtime.generation import Generation
from mlotspark.runtime.progress import PrefillProgress, ProgressListener

_END = object()  # marks the end of a stream in the piece queue


class RequestHandle:
    """What ``Engine.submit`` returns; the engine thread runs the request.

    Iterating yields the reply's text pieces as they decode (once per handle);
    ``result(timeout)`` waits for the end; ``cancel()`` stops the request at once
    (finish reason ``cancelled``, the text so far kept, its KV released).
    ``progress`` is the latest ``PrefillProgress`` of the prompt, for callers that poll.

    The engine thread talks to the handle through three calls, and only these: ``emit``
    (a text piece), ``progressed`` (a ``PrefillProgress``) and ``finish``; it reaches the
    handle through the request record it holds (``scheduled.Request.handle``). The handle
    sets nothing on the generation, so nothing the engine keeps points back at it.

    Args:
        generation: the request's Generation (prompt, cache, options; the engine
            thread writes ``result`` and ``fed_tokens`` there when the request ends).
        wake: called after ``cancel()`` so the engine thread notices at once.
        on_progress: called with each ``PrefillProgress`` (on the engine thread).
        progress_events: also yield the ``PrefillProgress`` events when iterating,
            in order, before the first text piece.
    """

    def __init__(self, generation: Generation, wake: Callable[[], None] | None = None, *,
                 on_progress: ProgressListener | None = None, progress_events: bool = False):
        self.generation = generation
        self.progress: PrefillProgress | None = None
        self._on_progress = on_progress
        self._progress_events = progress_events
        self.cancel_event = generation.cancel
        self._wake = wake
        self._pieces: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._started = False
        self._waker: Callable[[], None] | None = None  # set by aiter(): wakes the asyncio reader

    # ------------------------------------------------------- engine thread
    def emit(self, piece: str) -> None:
        """[engine thread] Hand a text piece to the reader."""
        self._put(piece)

    def finish(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        """[engine thread] End the stream with ``result`` (or ``error``)."""
        self._result, self._error = result, error
        self._put(_END)
        self._done.set()

    def progressed(self, event: PrefillProgress) -> None:
        """[engine thread] Take a ``PrefillProgress`` of the prompt: kept in ``progress``,
        queued for the reader when the handle was made with ``progress_events``, and
        handed to ``on_progress``."""
        self.progress = event
        if self._progress_events:
            self._put(event)
        if self._on_progress is not None:
            self._on_progress(event)

    def _put(self, item: Any) -> None:
        self._pieces.put(item)
        waker = self._waker
        if waker is not None:
            waker()

    # -------------------------------------------------------------- caller
    def _splitter(self) -> ReasoningSplitter | None:
        """The reply's reasoning splitter; None for a model that does not think (or a
        request with no tokenizer: bare token ids)."""
        tokenizer = getattr(self.generation, "tokenizer", None)
        return splitter_of(tokenizer, self.generation.prompt) if tokenizer is not None else None

    @staticmethod
    def _split(splitter: ReasoningSplitter | None, piece: Any) -> list[Any]:
        """What the reader sees of one queued item: a text piece split into its thinking
        and its answer (``_END``: what the splitter held back), anything else as it is."""
        if splitter is None:
            return [] if piece is _END else [piece]
        if piece is _END:
            reasoning, answer = splitter.close()
        elif isinstance(piece, str):
            reasoning, answer = splitter.feed(piece)
        else:
            return [piece]
        return ([ReasoningPiece(reasoning)] if reasoning else []) + ([answer] if answer else [])

    def __iter__(self) -> Iterator[Any]:
        """Text pieces of the answer (``str``), of a reasoning model's thinking
        (``ReasoningPiece``), and ``PrefillProgress`` events if the handle was made with
        ``progress_events``."""
        if self._started:
            raise RuntimeError("a request handle can be iterated only once")
        self._started = True
        splitter = self._splitter()
        while True:
            piece = self._pieces.get()
            yield from self._split(splitter, piece)
            if piece is _END:
                break
        if self._error is not None:
            raise self._error

    async def aiter(self) -> AsyncIterator[Any]:
        """Iterate the pieces from asyncio, without a thread: ``async for p in handle.aiter()``.

        Yields what ``for p in handle`` yields; raises what it raises. Leaving the loop
        early does not cancel the request (call ``cancel()``).
        """
        if self._started:
            raise RuntimeError("a request handle can be iterated only once")
        self._started = True
        splitter = self._splitter()
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()

        def wake() -> None:  # engine thread
            try:
                loop.call_soon_threadsafe(ready.set)
            except RuntimeError:  # the loop closed: nobody reads any more
                pass

        self._waker = wake  # pieces put before this are in the queue already
        try:
            while True:
                try:
                    piece = self._pieces.get_nowait()
                except queue.Empty:
                    ready.clear()
                    if self._pieces.empty():  # a put after the clear sets it again
                        await ready.wait()
                    continue
                for item in self._split(splitter, piece):
                    yield item
                if piece is _END:
                    break
        finally:
            self._waker = None
        if self._error is not None:
            raise self._error

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the request to end and return its result.

        Args:
            timeout: seconds to wait; None waits as long as it takes.

        Raises:
            TimeoutError: not finished within ``timeout``.
            MlotsparkError: the request failed (e.g. it can never fit the memory limit).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"request not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stop the request now; the text so far is kept (finish reason ``cancelled``)."""
        self.cancel_event.set()
        if self._wake is not None:
            self._wake()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def stats(self) -> GenerationStats | None:
        return self._result.stats if self._result else None
