"""What every API's routes share: the JSON body, a whole reply awaited, a client that
leaves, the figures of a finished request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Callable

from starlette.requests import Request

from mlotspark.decoding.tool_calls import splitter_for
from mlotspark.server.runner import Job, Outcome
from mlotspark.errors import OptionError
from mlotspark.results import ReasoningPiece
from mlotspark.server.schemas import APIError, ParsedRequest

MAX_BODY_BYTES = 32 * 1024 * 1024  # a 128k-token history is ~0.5 MB of JSON; this is a guard, not a limit
#: Seconds of silence after which a stream sends a keep-alive: a long prefill sent nothing for
#: 52-114 s (5k-13k tokens on two cores), past the 30-60 s read timeouts of proxies and clients.
KEEPALIVE_S = 10.0


async def keep_alive(events: AsyncIterator[str], beat: str) -> AsyncIterator[str]:
    """``events``, with ``beat`` sent after each ``KEEPALIVE_S`` of silence (an SSE comment
    or ping event, which clients skip). Closing this closes ``events`` (its ``finally``
    cancels the request when a client leaves).

    Args:
        events: the stream's text pieces.
        beat: what to send while ``events`` is silent.
    """
    pending: asyncio.Task | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=KEEPALIVE_S)
            if not done:
                yield beat
                continue
            task, pending = pending, None
            try:
                item = task.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:  # the client left mid-wait: stop the read, then the stream
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        with contextlib.suppress(RuntimeError):
            await events.aclose()


async def read_json(request: Request) -> Any:
    """The request's JSON body (413 past ``MAX_BODY_BYTES``, 400 when it is not JSON)."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
        raise APIError(413, f"request body of {size} bytes exceeds {MAX_BODY_BYTES}", code="body_too_large")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(413, f"request body of {len(body)} bytes exceeds {MAX_BODY_BYTES}", code="body_too_large")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None


async def admit_job(state: Any, body: Any, parse: Callable[[Any, list[str], Any], ParsedRequest]) -> Job:
    """Parse a request for the model it names and admit it, not begun (``start_job`` begins it).

    The model is made resident first (loaded on first use) and counted as in use until
    ``state.release(job)``; its engine validates the options, once.

    Args:
        state: the :class:`~mlotspark.server.app.ServerState`.
        body: the decoded JSON body.
        parse: ``parse(body, served, options) -> ParsedRequest`` of the API.

    Raises:
        APIError: a bad field, an unknown model, a full queue.
    """
    slot = await state.open_model(body)
    try:
        engine = (slot or state.pool.default).engine
        parsed = parse(body, state.served if slot is None else [body["model"]], engine.defaults.merged)
        if parsed.model == "default" and slot is not None:
            parsed.model = slot.name  # replies name the model that answered, as OpenAI's name a dated model
        job = Job(slot, parsed)
        state.admit(job)
    except BaseException:
        if slot is not None:
            state.pool.release(slot)
        raise
    return job


async def start_job(state: Any, body: Any, parse: Callable[[Any, list[str], Any], ParsedRequest],
                    check: Callable[[Job], None] | None = None) -> Job:
    """``admit_job``, then begin the request on its engine (after ``check(job)``: what an
    API refuses for the model it reached, raising APIError).

    Raises:
        APIError: as ``admit_job``; a request that cannot run (a 4xx, streamed or not).
    """
    job = await admit_job(state, body, parse)
    try:
        if check is not None:
            check(job)
        await job.begin()  # a request that cannot run is a 4xx, streamed or not
    except BaseException:
        state.release(job)
        raise
    return job


async def whole_outcome(request: Any, state: Any, job: Job, endpoint: str, t0: float) -> Outcome:
    """The outcome of a request answered whole: a client that hangs up cancels it; the job
    is released and counted."""
    watcher = asyncio.create_task(watch_disconnect(request, job))
    try:
        outcome = await wait_outcome(job)
    finally:
        watcher.cancel()
        state.release(job, time.perf_counter() - t0)
    count(state, endpoint, outcome, t0)
    return outcome


async def reply_events(job: Job, tools: Any) -> AsyncIterator[tuple]:
    """A request's streamed reply as every API shows it: thinking apart, and the tool calls
    split out of the answer (``tool_calls.splitter_for``, when the request gave tools).

    Yields:
        ``("thinking", text)`` per piece of a reasoning model's thinking;
        ``("answer", text, calls)`` per answer piece: the text that may be shown now (may
        be empty) and the calls finished in it; last ``("done", outcome, text, calls)``:
        the ``Outcome``, and what the splitter held back until the end.

    Raises:
        APIError: the request failed (``Job.events``).
    """
    splitter = splitter_for(job.server.engine.tokenizer, tools)
    events = job.events()
    try:
        async for what, value in events:
            if what == "piece" and isinstance(value, ReasoningPiece):
                yield "thinking", value.text
            elif what == "piece":
                yield ("answer", *(splitter.feed(value) if splitter is not None else (value, [])))
            else:
                yield ("done", value, *(splitter.close() if splitter is not None else ("", [])))
    finally:
        await events.aclose()


def end_stream(state: Any, job: Job, endpoint: str, ended: bool, t0: float) -> None:
    """A streamed reply is over: one that did not reach its end (the client went away, or
    the server is closing the connection) is cancelled and counted as 499, nginx's "client
    closed request"; the job is released either way."""
    if not ended:
        job.cancel()
        state.metrics.cancelled.inc()
        state.metrics.requests.labels(endpoint, "499").inc()
    state.release(job, time.perf_counter() - t0)


async def prompt_tokens(state: Any, body: Any, parse: Callable[[Any, list[str], Any], ParsedRequest],
                        field: str) -> int:
    """The prompt tokens a body would read (Anthropic's ``count_tokens``, Responses'
    ``input_tokens``); a bad tool is a 400 naming ``tools``, a bad prompt naming ``field``."""
    slot = await state.open_model(body)
    try:
        engine = (slot or state.pool.default).engine
        req = parse(body, state.served if slot is None else [body["model"]], engine.defaults.merged)
        tools = req.checked.tools if req.checked is not None else None
        try:
            ids = await asyncio.to_thread(engine.encode, req.messages, tools=tools)
        except OptionError as e:
            raise APIError(400, str(e), param="tools" if tools else field) from None
    finally:
        if slot is not None:
            state.pool.release(slot)
    return len(ids)


async def wait_outcome(job: Job) -> Outcome:
    """The job's outcome (pieces are dropped: the result carries the whole text)."""
    async for kind, value in job.events():
        if kind == "done":
            return value
    raise APIError(500, "the request ended without a result", type="server_error")


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client closes the connection (body already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def count(state: Any, endpoint: str, outcome: Outcome, t0: float) -> None:
    s = outcome.stats
    if s.finish_reason == "cancelled":
        state.metrics.cancelled.inc()
    state.metrics.finished(endpoint, outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens,
                           s.ttft_s + float(s.extra.get("queue_s") or 0.0), s.decode_tps, time.perf_counter() - t0)


__all__ = ["MAX_BODY_BYTES", "admit_job", "count", "end_stream", "prompt_tokens", "read_json", "start_job", "wait_outcome",
           "watch_disconnect", "whole_outcome"]
