"""The conversation writer: a turn's storing runs beside the engine thread, not on it.

When a turn ends, the engine thread captures what only it may touch (the snapshot's
new arrays, the shared prefix's KV: MLX work, evaluated there) and hands the rest to
this writer: the messages' JSON, the snapshot and prefix-cache files, the semantic
memory's SQLite rows and their embeddings. Other requests keep decoding meanwhile.

One thread, first in first out, so writes keep the order turns finished in; each
write stays atomic (``storage``) and a turn's own order stays messages, snapshot,
prefix cache, memory. The caller of ``Conversation.send`` waits for its turn's
writes before it returns (and before the conversation's lock is released), so a
returned turn is on disk, as before. After ``close`` jobs run at once in the
caller's thread: nothing handed over late (a turn cancelled by ``Engine.close``) is lost.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

log = logging.getLogger(__name__)

__all__ = ["Writer"]


class Writer:
    """Runs jobs one at a time, in the order given, on its own thread."""

    def __init__(self, name: str = "mlotspark-writer") -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queue ``fn``; the returned future holds its value or exception."""
        with self._lock:
            if not self._closed:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
                return self._pool.submit(fn)
        done: Future = Future()  # closed: run it here
        try:
            done.set_result(fn())
        except BaseException as e:  # noqa: BLE001  handed to whoever waits on it
            done.set_exception(e)
        return done

    def close(self) -> None:
        """Run what is queued, stop the thread; later jobs run in their caller's thread."""
        with self._lock:
            self._closed, pool, self._pool = True, self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
