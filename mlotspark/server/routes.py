"""The endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``,
``/health`` and ``/metrics``.

A completion request is parsed (``schemas.py``), admitted (queue bound), run as a
:class:`~mlotspark.server.runner.Job` through ``Engine.submit`` and answered whole
or streamed as server-sent events (``data: {...}`` lines, then ``data: [DONE]``).
A client that goes away cancels its request at the next token: a stream notices
when its next write fails, a waiting non-stream request by watching the
connection for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlotspark.server.metrics import CONTENT_TYPE
from mlotspark.server.runner import Job, Outcome
from mlotspark.server.schemas import (
    APIError,
    ParsedRequest,
    chat_response,
    chunk,
    completion_response,
    extension,
    finish_reason,
    new_id,
    parse_chat,
    parse_completion,
    usage,
)

MAX_BODY_BYTES = 32 * 1024 * 1024  # a 128k-token history is ~0.5 MB of JSON; this is a guard, not a limit
CONVERSATION_HEADER = "x-mlotspark-conversation"


def build(state: Any) -> list[Route]:
    """The routes for a :class:`~mlotspark.server.app.ServerState`."""

    async def read_json(request: Request) -> Any:
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

    async def completions(request: Request, kind: str) -> Response:
        t0 = time.perf_counter()
        endpoint = request.url.path
        body = await read_json(request)
        parsed = parse_chat(body, state.served) if kind == "chat" else parse_completion(body, state.served)
        header = request.headers.get(CONVERSATION_HEADER)
        if header and kind == "chat" and parsed.conversation is None:
            parsed.conversation = header
        job = Job(state, parsed, asyncio.get_running_loop())
        state.admit(job)
        job.start()
        rid, created = new_id(kind), int(time.time())
        if parsed.stream:
            return StreamingResponse(
                _sse(state, job, parsed, rid, created, endpoint, t0),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        try:
            outcome = await _wait(job)
        finally:
            watcher.cancel()
            state.release(job, time.perf_counter() - t0)
        _count(state, endpoint, outcome, t0)
        use = usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
        texts = [(t, finish_reason(f)) for t, f in outcome.texts]
        make = chat_response if kind == "chat" else completion_response
        return JSONResponse(make(rid, parsed.model, texts, use, extension(outcome.stats)))

    async def chat(request: Request) -> Response:
        return await completions(request, "chat")

    async def text_completions(request: Request) -> Response:
        return await completions(request, "completion")

    async def models(request: Request) -> Response:
        state.metrics.requests.labels("/v1/models", "200").inc()
        return JSONResponse({"object": "list", "data": [_model(state, m) for m in state.listed]})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in state.served:
            raise APIError(404, f"model '{name}' does not exist; this server serves {', '.join(state.served)}",
                           param="model", code="model_not_found")
        return JSONResponse(_model(state, name))

    async def health(request: Request) -> Response:
        live = await asyncio.to_thread(state.live_figures)
        s = live["scheduler"]
        engine = state.engine
        return JSONResponse({
            "status": "shutting_down" if state.closing else "ok",
            "model": state.model_id,
            "device": engine.device,
            "weights": engine.loaded.weights,
            "context_length": engine.loaded.context_length,
            "thermal_state": s.get("state"),
            "mode": s.get("mode"),
            "batch_cap": s.get("cap"),
            "batch_size": s.get("batch_size"),
            "running": s.get("running"),
            "prefilling": s.get("prefilling"),
            "queue_length": s.get("queued"),
            "requests_in_flight": len(state.jobs),
            "max_queue": state.max_queue,
            "decode_tps": s.get("decode_tps"),
            "kv_bytes": s.get("kv_bytes"),
            "prompt_cache": live.get("prompt_cache"),
        })

    async def metrics(request: Request) -> Response:
        text = await asyncio.to_thread(state.metrics.render)
        return Response(text, media_type=CONTENT_TYPE)

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def _model(state: Any, name: str) -> dict:
    return {"id": name, "object": "model", "created": state.created, "owned_by": "mlotspark",
            "context_length": state.engine.loaded.context_length}


async def _wait(job: Job) -> Outcome:
    """The job's outcome (pieces are dropped: the result carries the whole text)."""
    while True:
        kind, value = await job.queue.get()
        if kind == "done":
            return value
        if kind == "error":
            raise value


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client closes the connection (body already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def _count(state: Any, endpoint: str, outcome: Outcome, t0: float) -> None:
    s = outcome.stats
    if s.finish_reason == "cancelled":
        state.metrics.cancelled.inc()
    state.metrics.finished(endpoint, outcome.prompt_tokens, outcome.cached_tokens, outcome.completion_tokens,
                           s.ttft_s, s.decode_tps, time.perf_counter() - t0)


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse(state: Any, job: Job, parsed: ParsedRequest, rid: str, created: int,
               endpoint: str, t0: float) -> AsyncIterator[str]:
    """The event stream of one request; a client gone cancels it (``finally``)."""
    kind, model = parsed.kind, parsed.model
    ended = False
    try:
        if kind == "chat":
            yield _event(chunk(kind, rid, model, created, text="", role=True))
        while True:
            what, value = await job.queue.get()
            if what == "piece":
                yield _event(chunk(kind, rid, model, created, text=value))
            elif what == "done":
                ended = True
                _count(state, endpoint, value, t0)
                use = usage(value.prompt_tokens, value.completion_tokens, value.cached_tokens)
                ext = extension(value.stats)
                reason = finish_reason(value.texts[0][1])
                yield _event(chunk(kind, rid, model, created, finish=reason, ext=ext,
                                   text=None if kind == "chat" else ""))
                if parsed.include_usage:
                    yield _event(chunk(kind, rid, model, created, use=use, no_choices=True))
                yield "data: [DONE]\n\n"
                return
            else:  # an error after the 200 went out: an error event ends the stream
                ended = True
                state.metrics.requests.labels(endpoint, str(value.status)).inc()
                yield _event(value.body())
                yield "data: [DONE]\n\n"
                return
    finally:
        if not ended:  # the client went away (or the server is closing the connection)
            job.cancel()
            state.metrics.cancelled.inc()
            state.metrics.requests.labels(endpoint, "499").inc()  # nginx's "client closed request"
        state.release(job, time.perf_counter() - t0)


__all__ = ["CONVERSATION_HEADER", "MAX_BODY_BYTES", "build"]
