"""A submitted request: iterate it for text pieces, wait on it, or cancel it."""

from __future__ import annotations

import threading
from typing import Callable, Iterator

from .generate import Generation, GenerationResult, GenerationStats


class RequestHandle:
    """What ``Engine.submit`` returns.

    Iterating yields the reply's text pieces as they decode; ``result()`` waits for
    the end; ``cancel()`` stops it at the next token (finish reason ``cancelled``).
    This implementation runs the generation on the thread that consumes it, under
    the engine's lock; the scheduler runs it on the engine thread instead.
    """

    def __init__(self, make: Callable[[threading.Event], Generation], lock: threading.RLock,
                 on_finish: Callable[[Generation], None] | None = None):
        self._make = make
        self._lock = lock
        self._on_finish = on_finish
        self.cancel_event = threading.Event()
        self.generation: Generation | None = None
        self._result: GenerationResult | None = None
        self._started = False

    def __iter__(self) -> Iterator[str]:
        if self._started:
            raise RuntimeError("a request handle can be iterated only once")
        self._started = True
        with self._lock:
            gen = self.generation = self._make(self.cancel_event)
            yield from gen
            self._result = gen.result
            if self._on_finish is not None:
                self._on_finish(gen)

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Run (or wait for) the request to the end and return its result."""
        if self._result is None:
            if self._started:
                raise RuntimeError("request is being consumed elsewhere")
            for _ in self:
                pass
        assert self._result is not None
        return self._result

    def cancel(self) -> None:
        """Stop at the next token; the text so far is kept."""
        self.cancel_event.set()

    @property
    def done(self) -> bool:
        return self._result is not None

    @property
    def stats(self) -> GenerationStats | None:
        return self._result.stats if self._result else None
