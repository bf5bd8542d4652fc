"""One HTTP request on the engine: prompt cache, ``Engine.submit``, events for asyncio.

The engine thread owns MLX and decodes in continuous batches (``runtime/scheduler``);
the HTTP side is asyncio. A :class:`Job` bridges them: a worker thread prepares the
request (prompt-cache lookup on the engine thread), submits it, and forwards every
text piece to an ``asyncio.Queue`` with ``loop.call_soon_threadsafe``; the route
reads the queue. ``cancel()`` (a client that went away, a server shutting down)
stops the request at its next token and frees its batch slot.

Requests naming a ``conversation`` go through ``Engine.conversation(name)``: its
stored history, snapshots and semantic memory are used, and the request's last
message is the new user turn.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from mlotspark.errors import MlotsparkError, OptionError, PromptTooLongError
from mlotspark.server.schemas import APIError, ParsedRequest

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What a finished job hands back: one entry per choice, and the stats."""

    texts: list[tuple[str, str]]  # (text, our finish reason) per choice
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stats: Any  # GenerationStats of the (first) choice
    extra: dict = field(default_factory=dict)


class Job:
    """Runs one parsed request on the engine and streams its events.

    Events put on ``queue``: ``("piece", str)`` per text piece, then
    ``("done", Outcome)`` or ``("error", APIError)``.

    Args:
        server: the :class:`~mlotspark.server.app.ServerState` (engine, prompt cache, metrics).
        request: the checked request.
        loop: the event loop the queue belongs to.
    """

    def __init__(self, server: Any, request: ParsedRequest, loop: asyncio.AbstractEventLoop):
        self.server = server
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self._handle: Any = None
        self._thread = threading.Thread(target=self._run, name="mlotspark-http-job", daemon=True)

    def start(self) -> "Job":
        self._thread.start()
        return self

    def cancel(self) -> None:
        """Stop the request at its next token (thread-safe, idempotent)."""
        self._cancel.set()
        handle = self._handle
        if handle is not None:
            handle.cancel()
        # A conversation's turn is cancelled by the worker at its next piece: the
        # conversation may be running another request's turn before ours starts.

    def fail(self, error: APIError) -> None:
        """End the request with ``error`` (its stream gets an error event); thread-safe."""
        self._put("error", error)
        self.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # ---------------------------------------------------------------- worker
    def _put(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _run(self) -> None:
        try:
            if self.request.conversation is not None:
                outcome = self._run_conversation()
            else:
                outcome = self._run_plain()
            self._put("done", outcome)
        except APIError as e:
            self._put("error", e)
        except PromptTooLongError as e:
            self._put("error", APIError(400, str(e), param="messages" if self.request.kind == "chat" else "prompt",
                                        code="context_length_exceeded"))
        except OptionError as e:
            self._put("error", APIError(400, str(e), param=_param_of(str(e))))
        except MlotsparkError as e:
            self._put("error", APIError(500, str(e), type="server_error"))
        except Exception as e:  # noqa: BLE001  one request fails, the server keeps serving
            log.exception("request failed")
            self._put("error", APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error"))

    def _prompt_ids(self) -> list[int]:
        req, engine = self.request, self.server.engine
        if req.prompt_ids is not None:
            vocab = engine.vocab_size
            if vocab is not None and max(req.prompt_ids) >= vocab:
                raise APIError(400, f"invalid 'prompt': token id {max(req.prompt_ids)} is not in the vocabulary "
                                    f"of {vocab} tokens", param="prompt")
            return list(req.prompt_ids)
        if req.kind == "chat":
            return engine.encode(req.messages)
        return engine.encode(req.prompt, raw=True)

    def _run_plain(self) -> Outcome:
        req, engine, pc = self.request, self.server.engine, self.server.prompt_cache
        opts = engine.options(**req.options)  # bad values fail here, before any MLX work
        ids = self._prompt_ids()
        cache, cached = None, 0
        if pc is not None and pc.enabled and opts.num_return_sequences == 1:
            cache, cached = engine.run_on_engine(pc.take, ids, opts.max_tokens)
        if self._cancel.is_set():
            raise APIError(499, "client closed the request", code="cancelled")

        def on_finish(gen: Any) -> None:  # engine thread: keep what the model consumed
            if pc is not None and gen.result is not None and gen.result.stats.finish_reason != "cancelled":
                pc.add(ids[:cached] + list(gen.fed_tokens), gen.cache)

        handle = engine.submit(prompt_ids=ids[cached:], cache=cache, cached_tokens=cached,
                               on_finish=on_finish, **req.options)
        self._handle = handle
        if self._cancel.is_set():
            handle.cancel()
        for piece in handle:
            self._put("piece", piece)
        result = handle.result()
        stats = result.stats
        if result.sequences:  # n > 1
            texts = [(h.text, getattr(h, "finish_reason", stats.finish_reason)) for h in result.sequences]
            completion = sum(len(h.tokens) for h in result.sequences)
        else:
            texts = [(result.text, stats.finish_reason)]
            completion = stats.generation_tokens
        return Outcome(texts, stats.prompt_tokens, completion, stats.cached_tokens, stats)

    def _run_conversation(self) -> Outcome:
        req, engine = self.request, self.server.engine
        msgs = list(req.messages or [])
        if msgs[-1]["role"] != "user":
            raise APIError(400, "with a conversation, the last message must be the user's new turn",
                           param="messages")
        system = next((m["content"] for m in msgs if m["role"] == "system"), None)
        try:
            conv = engine.conversation(req.conversation, system=system)
        except OptionError as e:
            raise APIError(400, str(e), param="conversation") from None
        if not conv.messages:  # a new conversation starts from the history the client sent
            for m in msgs[:-1]:
                if m["role"] in ("user", "assistant"):
                    conv.add(m["role"], m["content"])
        stats = None
        stream = conv.stream(msgs[-1]["content"], **req.options)
        try:
            for piece in stream:
                if isinstance(piece, str):
                    self._put("piece", piece)
                else:
                    stats = piece
                if self._cancel.is_set():
                    conv.cancel()
        finally:
            stream.close()
        if stats is None:
            raise APIError(499, "client closed the request", code="cancelled")
        text = conv.messages[-1]["content"] if conv.messages and conv.messages[-1]["role"] == "assistant" else ""
        return Outcome([(text, stats.finish_reason)], stats.prompt_tokens, stats.generation_tokens,
                       stats.cached_tokens, stats)


def _param_of(message: str) -> str | None:
    """The option an OptionError names (``invalid max_tokens 0: ...`` -> ``max_tokens``)."""
    words = message.split()
    if len(words) > 1 and words[0] == "invalid":
        return words[1].strip("'\"")
    return None


__all__ = ["Job", "Outcome"]
