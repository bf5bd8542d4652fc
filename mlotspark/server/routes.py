"""The OpenAI endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
``/v1/models``; and ``/health`` and ``/metrics``.

A completion request is parsed and its options validated once (``schemas.py``),
admitted (queue bound), run as a :class:`~mlotspark.server.runner.Job` through
``Engine.submit`` (the handle iterated asynchronously, no thread per request) and answered whole
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

from mlotspark.server.embeddings import embeddings_response, parse_embeddings
from mlotspark.server.exchange import (
    MAX_BODY_BYTES,
    count,
    end_stream,
    keep_alive,
    read_json,
    reply_events,
    start_job,
    whole_outcome,
)
from mlotspark.server.metrics import CONTENT_TYPE
from mlotspark.server.runner import Job
from mlotspark.server.models import model_capabilities
from mlotspark.server.responses import (
    chat_logprobs,
    chat_response,
    chunk,
    completion_logprobs,
    completion_response,
    extension,
    finish_reason,
    new_id,
    tool_call_json,
    usage,
)
from mlotspark.server.schemas import APIError, ParsedRequest, parse_chat, parse_completion

CONVERSATION_HEADER = "x-mlotspark-conversation"


def _utf8(value: str | None) -> str | None:
    """A header as the client wrote it: HTTP decodes header bytes as Latin-1, so a UTF-8 name
    ("Ärzte", an emoji) arrived as mojibake in the reply's error."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def build(state: Any) -> list[Route]:
    """The routes for a :class:`~mlotspark.server.app.ServerState`."""

    async def completions(request: Request, kind: str) -> Response:
        t0 = time.perf_counter()
        endpoint = request.url.path
        body = await read_json(request)
        header = _utf8(request.headers.get(CONVERSATION_HEADER))
        if header and kind == "chat" and isinstance(body, dict) and body.get("conversation") is None:
            body = {**body, "conversation": header}
        job = await start_job(state, body, parse_chat if kind == "chat" else parse_completion)
        parsed = job.request
        rid, created = new_id(kind), int(time.time())
        if parsed.stream:
            return StreamingResponse(
                keep_alive(_sse(state, job, parsed, rid, created, endpoint, t0), ": keep-alive\n\n"),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        outcome = await whole_outcome(request, state, job, endpoint, t0)
        use = usage(outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_tokens)
        make = chat_response if kind == "chat" else completion_response
        return JSONResponse(make(rid, parsed.model, outcome.choices, use, extension(outcome.stats),
                                 token_text=job.server.token_text))

    async def chat(request: Request) -> Response:
        return await completions(request, "chat")

    async def text_completions(request: Request) -> Response:
        return await completions(request, "completion")

    async def embeddings(request: Request) -> Response:
        body = await read_json(request)
        req = parse_embeddings(body, state.served)
        vectors, tokens = await state.embed(req.texts)
        state.metrics.requests.labels("/v1/embeddings", "200").inc()
        return JSONResponse(embeddings_response(req, vectors, tokens))

    async def models(request: Request) -> Response:
        state.metrics.requests.labels("/v1/models", "200").inc()
        return JSONResponse({"object": "list", "data": [_model(state, m) for m in state.listed]})

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        if name not in state.served and name not in state.listed:
            raise APIError(404, f"model '{name}' does not exist; this server serves {', '.join(state.listed)}",
                           param="model", code="model_not_found")
        return JSONResponse(_model(state, name))

    async def health(request: Request) -> Response:
        live = await asyncio.to_thread(state.live_figures)
        s = live["scheduler"]
        engine = state.engine
        models = models_status(state)
        return JSONResponse({
            "status": "shutting_down" if state.closing else "ok",
            # ``serve --mcp``: each server, whether it runs, its tools (run through a Responses ``mcp`` tool)
            **({"mcp_servers": state.mcp.describe()} if state.mcp is not None else {}),
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
            "models": models,
            "loading": {m["name"]: m["load_progress"] for m in models if m["load_progress"] is not None},
            "memory_budget": state.pool.governance.status() if state.pool.governance is not None else None,
            "response_store": await asyncio.to_thread(state.response_store.stats),
            "process": _process_memory(),
        })

    async def metrics(request: Request) -> Response:
        text = await asyncio.to_thread(state.metrics.render)
        return Response(text, media_type=CONTENT_TYPE)

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def _model(state: Any, name: str) -> dict:
    out = {"id": name, "object": "model", "created": state.created, "owned_by": "mlotspark"}
    slot = state.pool.slots.get(name)
    engine = slot.engine if slot is not None and slot.loaded else None
    if engine is not None:
        out["context_length"] = engine.loaded.context_length
    out["capabilities"] = model_capabilities(name, engine).to_json()
    return out


def _process_memory() -> dict:
    """The process's resident set and MLX's active and peak memory, in bytes."""
    import mlx.core as mx
    import psutil

    return {"rss_bytes": psutil.Process().memory_info().rss, "mlx_active_bytes": int(mx.get_active_memory()),
            "mlx_peak_bytes": int(mx.get_peak_memory())}


def models_status(state: Any) -> list[dict]:
    """Each model the server knows: loaded or loading (how far: ``Slot.load_progress``), requests
    in flight, idle time, expiry."""
    pool, now = state.pool, state.pool.clock()
    out = []
    for s in pool.slots.values():
        expires = pool.expires_in(s) if s.loaded else None
        out.append({"name": s.name, "default": s is pool.default, "loaded": s.loaded, "loading": s.loading,
                    "load_progress": s.load_progress(now),
                    "requests_in_flight": s.active, "idle_s": round(now - s.last_used, 3) if s.loaded else None,
                    "expires_in_s": None if expires is None else round(expires, 3), "loads": s.loads,
                    "bytes": int(s.engine.loaded.nbytes()) if s.loaded else None, "error": s.error,
                    "kv_budget_bytes": s.share.kv_budget() if s.loaded and s.share is not None else None})
    return out


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse(state: Any, job: Job, parsed: ParsedRequest, rid: str, created: int,
               endpoint: str, t0: float) -> AsyncIterator[str]:
    """The event stream of one request; a client gone cancels it (``finally``)."""
    kind, model = parsed.kind, parsed.model
    ended = False
    calls_sent = 0
    logprobs_sent = 0
    offset = 0  # completions' text_offset

    def piece_chunk(text: str, calls: list, entries: list | None) -> str | None:
        nonlocal calls_sent, logprobs_sent, offset
        deltas = [tool_call_json(c, calls_sent + i) for i, c in enumerate(calls)]
        calls_sent += len(calls)
        lp = None
        if entries:
            logprobs_sent += len(entries)
            if kind == "chat":
                lp = chat_logprobs(entries, job.server.token_text)
            else:
                lp = completion_logprobs(entries, job.server.token_text, offset)
                offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
        if not (text or deltas or lp):
            return None
        return _event(chunk(kind, rid, model, created, text=text if text or kind != "chat" else None,
                            calls=deltas, logprobs=lp))

    def new_entries() -> list | None:
        rec = job.recorder
        return rec.entries[logprobs_sent:] if rec is not None else None

    try:
        if kind == "chat":
            yield _event(chunk(kind, rid, model, created, text="", role=True))
        events = reply_events(job, parsed.checked)
        try:
            async for what, value, *split in events:
                if what == "thinking":
                    if kind == "chat":  # a text completion has nowhere to put the thinking
                        yield _event(chunk(kind, rid, model, created, reasoning=value))
                    continue
                if what == "answer":
                    out = piece_chunk(value, *split, new_entries())
                    if out is not None:
                        yield out
                    continue
                ended = True
                count(state, endpoint, value, t0)
                choice = value.choices[0]
                text, calls = split
                entries = choice.logprobs[logprobs_sent:] if choice.logprobs is not None else None
                out = piece_chunk(text, calls, entries)
                if out is not None:
                    yield out
                use = usage(value.prompt_tokens, value.completion_tokens, value.cached_tokens)
                ext = extension(value.stats)
                reason = "tool_calls" if calls_sent else finish_reason(choice.finish)
                yield _event(chunk(kind, rid, model, created, finish=reason, ext=ext,
                                   text=None if kind == "chat" else ""))
                if parsed.include_usage:
                    yield _event(chunk(kind, rid, model, created, use=use, no_choices=True))
                yield "data: [DONE]\n\n"
        except APIError as e:  # an error after the 200 went out: an error event ends the stream
            ended = True
            state.metrics.requests.labels(endpoint, str(e.status)).inc()
            yield _event(e.body())
            yield "data: [DONE]\n\n"
        finally:
            await events.aclose()
    finally:
        end_stream(state, job, endpoint, ended, t0)


__all__ = ["CONVERSATION_HEADER", "MAX_BODY_BYTES", "build"]
