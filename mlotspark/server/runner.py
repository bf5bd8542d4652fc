"""One HTTP request on the engine: prompt cache, ``Engine.submit``, events for asyncio.

The engine thread owns MLX and decodes in continuous batches (``runtime/scheduler``);
the HTTP side is asyncio. A :class:`Job` runs one checked request: it looks the
prompt up in the server's prompt cache (one call on the engine thread, awaited), submits
it and iterates the request handle asynchronously (``RequestHandle.aiter``: the engine
thread wakes the event loop per piece), so a request holds no thread of its own.
``cancel()`` (a client that went away) stops the request at its next token and frees
its batch slot; ``fail()`` (a server shutting down) also ends its events with an error.

Requests naming a ``conversation`` go through ``Engine.conversation(name)``: its
stored history, snapshots and semantic memory are used, and the request's last
message is the new user turn. A conversation's turn is a blocking generator that
holds the conversation's lock for the turn (an ``RLock``: one thread), so that path
alone runs its turn on a worker thread and forwards the pieces to the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from mlotspark.decoding.logprobs import LogprobRecorder, recorder_of
from mlotspark.decoding.tool_calls import parse_calls, require_format, tool_names
from mlotspark.errors import MlotsparkError, OptionError, PromptTooLongError
from mlotspark.results import ReasoningPiece
from mlotspark.server.responses import Choice
from mlotspark.server.schemas import APIError, ParsedRequest, option_error

log = logging.getLogger(__name__)

_END = object()


@dataclass
class Outcome:
    """What a finished job hands back: one entry per choice, and the stats."""

    choices: list[Choice]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    stats: Any  # GenerationStats of the (first) choice


class Job:
    """Runs one checked request on the engine; ``events()`` streams it.

    Args:
        server: the model the request runs on: a :class:`~mlotspark.server.models.Slot`
            (``engine``, ``prompt_cache``).
        request: the checked request (``request.checked``: its validated options, except
            for a conversation, which validates them itself).
    """

    def __init__(self, server: Any, request: ParsedRequest):
        self.server = server
        self.request = request
        self.failure: APIError | None = None
        self._cancel = threading.Event()
        self._handle: Any = None
        self._conversation: Any = None
        self.recorder: LogprobRecorder | None = None  # the request's logprobs, as they are recorded
        self.prompt_tokens = 0  # known once begin() has run

    def cancel(self) -> None:
        """Stop the request at its next token (thread-safe, idempotent)."""
        self._cancel.set()
        for target in (self._handle, self._conversation):
            if target is not None:
                target.cancel()

    def fail(self, error: APIError) -> None:
        """End the request with ``error`` (its stream gets an error event); thread-safe."""
        self.failure = error
        self.cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    async def begin(self) -> None:
        """Prompt, prompt cache and ``Engine.submit`` of a plain request, before any byte of
        the reply is sent (so a bad schema or too long a prompt is a 4xx, even streamed).

        Raises:
            APIError: the request cannot run.
        """
        if self.request.conversation is not None:
            return  # a conversation's turn runs whole in events()
        try:
            await self._submit()
        except Exception as e:  # noqa: BLE001  mapped to the API's error
            raise self._api_error(e) from None

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        """``("piece", str)`` per text piece, then ``("done", Outcome)``.

        Raises:
            APIError: the request failed (4xx/5xx), or the server is shutting down.
        """
        try:
            run = self._run_conversation if self.request.conversation is not None else self._run_plain
            async for event in run():
                if self.failure is not None:
                    raise self.failure
                yield event
            if self.failure is not None:
                raise self.failure
        except Exception as e:  # noqa: BLE001  mapped to the API's error
            raise self._api_error(e) from None

    def _api_error(self, e: Exception) -> APIError:
        if isinstance(e, APIError):
            return e
        if isinstance(e, PromptTooLongError):
            return APIError(400, str(e), param="messages" if self.request.kind == "chat" else "prompt",
                            code="context_length_exceeded")
        if isinstance(e, OptionError):  # a conversation's options, a schema, tools the template lacks
            return option_error(e, self.request.fields)
        if isinstance(e, MlotsparkError):
            return APIError(500, str(e), type="server_error")
        log.error("request failed", exc_info=e)  # one request fails, the server keeps serving
        return APIError(500, f"internal error: {type(e).__name__}: {e}", type="server_error")

    # ------------------------------------------------------------- plain requests
    def _prompt_ids(self) -> list[int]:
        req, engine = self.request, self.server.engine
        if req.prompt_ids is not None:
            vocab = engine.vocab_size
            if vocab is not None and max(req.prompt_ids) >= vocab:
                raise APIError(400, f"invalid 'prompt': token id {max(req.prompt_ids)} is not in the vocabulary "
                                    f"of {vocab} tokens", param="prompt")
            return list(req.prompt_ids)
        if req.kind == "chat":
            return engine.encode(req.messages, tools=req.checked.tools if req.checked else None,
                                 think=req.checked.think if req.checked else None)
        return engine.encode(req.prompt, raw=True)

    async def _submit(self) -> None:
        arrived = time.perf_counter()  # queue_s counts the wait for the lookup below too
        req, engine, pc = self.request, self.server.engine, self.server.prompt_cache
        opts = req.checked
        assert opts is not None, "parse_chat / parse_completion validate the options"
        if opts.tools is not None:
            require_format(engine.tokenizer, req.model)
        ids = self._prompt_ids()
        self.prompt_tokens = len(ids)
        cache, cached = None, 0
        kv = req.kv
        use_pc = pc is not None and pc.enabled and opts.num_return_sequences == 1

        def lookup() -> tuple[list | None, int]:  # engine thread: the longer of the two hits
            found, n = pc.take(ids, opts) if use_pc else (None, 0)
            if kv is not None:
                kept, m = kv.take(ids, opts, beyond=n)
                if kept is not None:
                    return kept, m
            return found, n

        if use_pc or kv is not None:
            # One engine call between decode steps; awaited on the loop's executor.
            loop = asyncio.get_running_loop()
            cache, cached = await loop.run_in_executor(None, engine.scheduler.call, lookup)
        if self._cancel.is_set():
            raise self.failure or APIError(499, "client closed the request", code="cancelled")

        def on_finish(gen: Any) -> None:  # engine thread: keep what the model consumed
            if gen.result is None or gen.result.stats.finish_reason == "cancelled":
                return
            consumed = ids[:cached] + list(gen.fed_tokens)
            if pc is not None:
                pc.add(consumed, gen.cache)
            if kv is not None:
                kv.keep(consumed, gen.cache)

        handle = engine.submit(prompt_ids=ids[cached:], cache=cache, cached_tokens=cached,
                               on_finish=on_finish, validated=opts, arrived_at=arrived)
        self._handle = handle
        self.recorder = recorder_of(handle.generation.constraint)
        if self._cancel.is_set():
            handle.cancel()

    async def _run_plain(self) -> AsyncIterator[tuple[str, Any]]:
        if self._handle is None:
            await self._submit()
        handle, opts = self._handle, self.request.checked
        async for piece in handle.aiter():
            yield "piece", piece
        result = handle.result()
        stats = result.stats
        if result.sequences:  # n > 1
            choices = [Choice(h.text, getattr(h, "finish_reason", stats.finish_reason),
                              reasoning=getattr(h, "reasoning", "")) for h in result.sequences]
            completion = sum(len(h.tokens) for h in result.sequences)
        else:
            text, calls = result.text, []
            if opts.tools is not None:
                text, calls = parse_calls(require_format(self.server.engine.tokenizer), text, tool_names(opts.tools))
            entries = self.recorder.finish(result.tokens) if self.recorder is not None else None
            choices = [Choice(text, stats.finish_reason, calls, entries, stats.stop_sequence, result.reasoning)]
            completion = stats.generation_tokens
        yield "done", Outcome(choices, stats.prompt_tokens, completion, stats.cached_tokens, stats)

    # ------------------------------------------------------------- conversations
    async def _run_conversation(self) -> AsyncIterator[tuple[str, Any]]:
        req, engine = self.request, self.server.engine
        msgs = list(req.messages or [])
        for name in ("tools", "logprobs"):
            if req.options.get(name) is not None:
                raise APIError(400, f"invalid '{name}': not supported with a conversation (send the history "
                                    "without 'conversation')", param=name)
        if msgs[-1]["role"] != "user":
            raise APIError(400, "with a conversation, the last message must be the user's new turn",
                           param="messages")
        system = next((m["content"] for m in msgs if m["role"] == "system"), None)
        try:
            conv = engine.conversation(req.conversation, system=system)
        except OptionError as e:
            raise APIError(400, str(e), param="conversation") from None
        self._conversation = conv
        if self._cancel.is_set():
            conv.cancel()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

        def turn() -> None:  # worker thread: the conversation's turn holds its lock throughout
            stats = None
            try:
                if not conv.messages:  # a new conversation starts from the history the client sent
                    for m in msgs[:-1]:
                        if m["role"] in ("user", "assistant"):
                            conv.add(m["role"], m["content"])
                stream = conv.stream(msgs[-1]["content"], **req.options)
                try:
                    for piece in stream:
                        if isinstance(piece, (str, ReasoningPiece)):
                            put(("piece", piece))
                        else:
                            stats = piece
                        if self._cancel.is_set():
                            conv.cancel()
                finally:
                    stream.close()
            except BaseException as e:  # noqa: BLE001  handed to the loop, raised there
                put(("error", e))
            else:
                put(("stats", stats))
            put(_END)

        worker = threading.Thread(target=turn, name="mlotspark-http-conversation", daemon=True)
        worker.start()
        stats = None
        thought: list[str] = []
        while True:
            item = await queue.get()
            if item is _END:
                break
            kind, value = item
            if kind == "piece":
                if isinstance(value, ReasoningPiece):
                    thought.append(value.text)
                yield "piece", value
            elif kind == "error":
                raise value
            else:
                stats = value
        if stats is None:
            raise self.failure or APIError(499, "client closed the request", code="cancelled")
        text = conv.messages[-1]["content"] if conv.messages and conv.messages[-1]["role"] == "assistant" else ""
        choice = Choice(text, stats.finish_reason, stop_sequence=stats.stop_sequence, reasoning="".join(thought))
        yield "done", Outcome([choice], stats.prompt_tokens, stats.generation_tokens,
                              stats.cached_tokens, stats)


__all__ = ["Job", "Outcome"]
