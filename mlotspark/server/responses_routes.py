"""OpenAI's Responses API, the reply side: ``/v1/responses`` routes, response objects, events.

``POST /v1/responses`` runs a request parsed by ``responses_api.py`` as a chat job and
answers a ``response`` object, whose ``output`` holds a ``reasoning`` item (when the
model thought), a ``message`` item with ``output_text``, and one ``function_call`` item
per tool call. Streamed, it is the API's event sequence: ``response.created``,
``response.in_progress``, per item ``response.output_item.added`` ... ``.done`` (text:
``content_part.added``, ``output_text.delta``, ``output_text.done``,
``content_part.done``; calls: ``function_call_arguments.delta`` / ``.done``), then
``response.completed`` (``response.incomplete`` when ``max_output_tokens`` cut it); an
error after the 200 is an ``error`` event, then ``response.failed``.

A stored response (``store``, the default) is written before the client sees it whole
(``response_store.py``), with its chain's KV snapshot; ``GET /v1/responses/{id}`` returns
it and ``DELETE`` removes it. ``POST /v1/responses/input_tokens`` counts the prompt tokens
a ``create`` body would read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlotspark.errors import OptionError, StoreError
from mlotspark.server.exchange import (admit_job, count, end_stream, keep_alive, prompt_tokens, read_json, reply_events,
                                       start_job, whole_outcome)
from mlotspark.server.response_store import ChainKV, Record, ResponseStore, new_response_id
from mlotspark.server.responses import Choice, extension
from mlotspark.server.responses_api import ResponsesRequest, parse_responses
from mlotspark.server.runner import Job, Outcome
from mlotspark.server.schemas import EXTENSION_KEY, APIError
from mlotspark.tools.loop import MAX_CALLS
from mlotspark.tools.responses_items import McpRequest, mcp_request, run_mcp_tools

log = logging.getLogger(__name__)

ENDPOINT = "/v1/responses"


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage(outcome: Outcome) -> dict:
    return {"input_tokens": outcome.prompt_tokens, "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
            "output_tokens": outcome.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}


def response_object(req: ResponsesRequest, created: int, status: str, output: list[dict],
                    outcome: Outcome | None = None, error: dict | None = None) -> dict:
    """The ``response`` object (``status``: in_progress | completed | incomplete | failed)."""
    out = {"id": req.rid, "object": "response", "created_at": created, "status": status, "error": error,
           "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
           "model": req.model, "output": output, "previous_response_id": req.previous, "store": req.store,
           "truncation": "disabled", "usage": usage(outcome) if outcome is not None else None, **req.echo}
    if outcome is not None:
        out["completed_at"] = int(time.time())
        out[EXTENSION_KEY] = extension(outcome.stats)
    return out


def message_item(mid: str, text: str, status: str = "completed") -> dict:
    return {"id": mid, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(call: Any, status: str = "completed", arguments: str | None = None) -> dict:
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "status": status,
            "call_id": call.id, "name": call.name,
            "arguments": call.arguments_json() if arguments is None else arguments}


def output_items(outcome: Outcome) -> list[dict]:
    """A finished request's ``output``: reasoning, message, function calls."""
    choice = outcome.choices[0]
    items: list[dict] = []
    reasoning = choice.reasoning
    if reasoning:
        items.append({"id": _item_id("rs"), "type": "reasoning", "status": "completed", "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}]})
    status = "incomplete" if choice.finish == "length" else "completed"
    if choice.text or not choice.calls:
        items.append(message_item(_item_id("msg"), choice.text, status))
    items += [call_item(c) for c in choice.calls]
    return items


def reply_messages(text: str, calls: list) -> list[dict]:
    """The reply as the chat message a later turn's history holds."""
    msg: dict = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in calls]
    return [msg]


def _status(outcome: Outcome) -> str:
    return "incomplete" if outcome.choices[0].finish == "length" and not outcome.choices[0].calls else "completed"


class _Stream:
    """Numbered server-sent events of one streamed response."""

    def __init__(self) -> None:
        self.seq = 0

    def __call__(self, kind: str, **data: Any) -> str:
        obj = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _save(store: ResponseStore, req: ResponsesRequest, obj: dict, text: str, calls: list) -> None:
    """Write the response's record (after its snapshot, which the runner began) and wait for both.

    A record that cannot be written (a full disk, a read-only home) leaves the reply as it is,
    with ``store`` false in it: the client gets its answer and is told it was not kept.
    """
    kv = req.kv
    if kv is not None and kv.saving is not None:
        await asyncio.wrap_future(kv.saving)
    if not req.store:
        return
    record = Record(req.rid, obj, req.added, reply_messages(text, calls), req.previous,
                    kv.chain if kv is not None else "")
    try:
        await asyncio.wrap_future(store.put(record))
    except (StoreError, OSError) as e:
        log.warning("responses: %s not stored: %s", req.rid, e)
        obj["store"] = False


async def _events(state: Any, store: ResponseStore, job: Job, req: ResponsesRequest, created: int,
                  t0: float) -> AsyncIterator[str]:
    """The Responses event sequence of one request; a client gone cancels it."""
    ev = _Stream()
    items: list[dict] = []  # output items, as they are finished
    text_item: dict | None = None
    thought_item: dict | None = None  # the reasoning item while the model thinks
    text, thought, calls = "", "", []
    ended = False

    def think(piece: str) -> list[str]:
        nonlocal thought_item, thought
        out: list[str] = []
        if thought_item is None:
            thought_item = {"id": _item_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                            "content": []}
            out.append(ev("response.output_item.added", output_index=len(items), item=thought_item))
        thought += piece
        out.append(ev("response.reasoning_text.delta", item_id=thought_item["id"], output_index=len(items),
                      content_index=0, delta=piece))
        return out

    def close_thought() -> list[str]:
        nonlocal thought_item
        if thought_item is None:
            return []
        done = dict(thought_item, status="completed", content=[{"type": "reasoning_text", "text": thought}])
        at, thought_item = len(items), None
        items.append(done)
        return [ev("response.reasoning_text.done", item_id=done["id"], output_index=at, content_index=0,
                   text=thought),
                ev("response.output_item.done", output_index=at, item=done)]

    def open_text() -> list[str]:
        nonlocal text_item
        text_item = message_item(_item_id("msg"), "", "in_progress")
        text_item["content"] = []
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [ev("response.output_item.added", output_index=len(items), item=text_item),
                ev("response.content_part.added", item_id=text_item["id"], output_index=len(items),
                   content_index=0, part=part)]

    def close_text(status: str = "completed") -> list[str]:
        nonlocal text_item
        if text_item is None:
            return []
        done = message_item(text_item["id"], text, status)
        at, text_item = len(items), None
        items.append(done)
        return [ev("response.output_text.done", item_id=done["id"], output_index=at, content_index=0, text=text,
                   logprobs=[]),
                ev("response.content_part.done", item_id=done["id"], output_index=at, content_index=0,
                   part=done["content"][0]),
                ev("response.output_item.done", output_index=at, item=done)]

    def emit(piece: str, new_calls: list) -> list[str]:
        nonlocal text
        out: list[str] = close_thought() if piece or new_calls else []
        if piece:
            if text_item is None:
                out += open_text()
            text += piece
            out.append(ev("response.output_text.delta", item_id=text_item["id"], output_index=len(items),
                          content_index=0, delta=piece, logprobs=[]))
        for call in new_calls:
            out += close_text()
            at, args = len(items), call.arguments_json()
            item = call_item(call, "in_progress", "")
            out.append(ev("response.output_item.added", output_index=at, item=item))
            out.append(ev("response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=args))
            out.append(ev("response.function_call_arguments.done", item_id=item["id"], output_index=at,
                          arguments=args))
            done = call_item(call)
            items.append(done)
            calls.append(call)
            out.append(ev("response.output_item.done", output_index=at, item=done))
        return out

    events = reply_events(job, req.checked)
    try:
        start = response_object(req, created, "in_progress", [])
        yield ev("response.created", response=start)
        yield ev("response.in_progress", response=start)
        async for what, value, *split in events:
            if what == "thinking":
                for e in think(value):
                    yield e
                continue
            if what == "answer":
                for e in emit(value, *split):
                    yield e
                continue
            ended = True
            count(state, ENDPOINT, value, t0)
            for e in emit(*split):
                yield e
            for e in close_thought():  # a reply that only thought
                yield e
            status = "incomplete" if value.choices[0].finish == "length" and not calls else "completed"
            if not items and text_item is None:  # an empty reply still has its (empty) message
                for e in open_text():
                    yield e
            for e in close_text(status):
                yield e
            obj = response_object(req, created, status, items, value)
            await _save(store, req, obj, text, calls)
            yield ev("response.incomplete" if status == "incomplete" else "response.completed", response=obj)
    except APIError as e:  # after the 200 went out: an error event, then the failed response
        ended = True
        state.metrics.requests.labels(ENDPOINT, str(e.status)).inc()
        yield ev("error", code=e.code or e.type, message=e.message, param=e.param)
        failed = response_object(req, created, "failed", items, error={"code": e.code or "server_error",
                                                                       "message": e.message})
        yield ev("response.failed", response=failed)
    finally:
        await events.aclose()
        end_stream(state, job, ENDPOINT, ended, t0)


async def _count(state: Any, body: Any, parse: Any) -> Response:
    """``POST /v1/responses/input_tokens``: the prompt tokens the same ``create`` body would read."""
    n = await prompt_tokens(state, body, parse, "input")
    return JSONResponse({"object": "response.input_tokens", "input_tokens": n})


async def _create_mcp(state: Any, store: ResponseStore, body: dict, mcp: McpRequest, parse: Any,
                      created: int, t0: float) -> Response:
    """A request naming ``mcp`` tools: the model calls the configured servers' tools here,
    in a loop (``tools.run_mcp_tools``), and the reply holds an ``mcp_list_tools`` item per
    server and an ``mcp_call`` item per call before the message. Not streamed: the loop
    runs several generations, and this server sends the whole response at its end."""
    if body.get("stream"):
        raise APIError(400, "stream: a request with an mcp tool is answered whole on this server; "
                            "ask without stream", param="stream")
    bound = body.get("max_tool_calls", MAX_CALLS)
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
        raise APIError(400, f"max_tool_calls: expected a whole number >= 0, got {json.dumps(bound)[:40]}",
                       param="max_tool_calls")
    asked = body.get("tool_choice")
    plain = {**body, "tools": mcp.other_tools or None}
    plain.pop("max_tool_calls", None)
    choice = None  # the engine's tool_choice when it names an mcp tool or there are no client tools
    if (isinstance(asked, dict) and asked.get("type") == "mcp") or (asked is not None and not mcp.other_tools):
        try:
            choice = mcp.tool_choice(plain.pop("tool_choice"))
        except OptionError as e:
            raise APIError(400, str(e), param="tool_choice") from None
    job = await admit_job(state, plain, parse)
    req, engine = job.request, (job.server or state.pool.default).engine
    options = {k: v for k, v in req.options.items() if k != "tools"}
    if choice is not None:
        options["tool_choice"] = choice
    client = req.checked.tools if req.checked is not None else None
    try:
        turn, items = await asyncio.to_thread(run_mcp_tools, engine, req.messages, state.mcp, mcp,
                                              client_tools=client, max_calls=bound, **options)
    except OptionError as e:
        raise APIError(400, str(e), param="tools") from None
    finally:
        state.release(job, time.perf_counter() - t0)
    gens = turn.generations or [turn.result]
    stats = turn.result.stats
    outcome = Outcome([Choice(turn.text, stats.finish_reason, list(turn.result.tool_calls) if turn.pending else [],
                              reasoning=turn.result.reasoning)],
                      sum(g.stats.prompt_tokens for g in gens), sum(g.stats.generation_tokens for g in gens),
                      sum(g.stats.cached_tokens for g in gens), stats)
    count(state, ENDPOINT, outcome, t0)
    obj = response_object(req, created, _status(outcome), items + output_items(outcome), outcome)
    obj["tools"] = list(body.get("tools") or [])  # the echo names the mcp tools as asked
    await _save(store, req, obj, turn.text, outcome.choices[0].calls)
    return JSONResponse(obj)


def build(state: Any) -> list[Route]:
    """The Responses routes for a :class:`~mlotspark.server.app.ServerState`."""

    def store() -> ResponseStore:
        return state.response_store

    async def create(request: Request, count_only: bool = False) -> Response:
        t0 = time.perf_counter()
        body = await read_json(request)
        rid = new_response_id()
        created = int(time.time())
        chains: dict[str, str] = {}
        spans: dict[str, tuple[int, int]] = {}

        def history(previous: str) -> list[dict]:
            records, why = store().history(previous)
            if why is not None:
                raise APIError(400, f"invalid 'previous_response_id': response '{previous}' {why}",
                               param="previous_response_id", code="previous_response_not_found")
            chains["source"] = records[-1].chain
            use = records[-1].response.get("usage") or {}
            n_in, n_out = int(use.get("input_tokens") or 0), int(use.get("output_tokens") or 0)
            spans["previous"] = (n_in, n_in + n_out)
            return [m for r in records for m in (*r.messages, *r.reply)]

        def parse(body: Any, served: list[str], options: Any) -> ResponsesRequest:
            req = parse_responses(body, served, options, rid=rid, history=history)
            slot = state.find(req.model) or state.pool.default
            req.kv = ChainKV(store(), slot.engine, chain=rid, source=chains.get("source"), span=spans.get("previous"),
                             save=req.store)
            return req

        if count_only:
            return await _count(state, body, lambda b, s, o: parse_responses(b, s, o, rid=rid, history=history))
        try:
            mcp = mcp_request(state.mcp, body.get("tools") if isinstance(body, dict) else None)
        except OptionError as e:
            raise APIError(400, str(e), param="tools") from None
        if mcp:
            return await _create_mcp(state, store(), body, mcp, parse, created, t0)
        job = await start_job(state, body, parse)
        req = job.request
        assert isinstance(req, ResponsesRequest)
        if req.stream:
            return StreamingResponse(keep_alive(_events(state, store(), job, req, created, t0), ": keep-alive\n\n"),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        outcome = await whole_outcome(request, state, job, ENDPOINT, t0)
        obj = response_object(req, created, _status(outcome), output_items(outcome), outcome)
        choice = outcome.choices[0]
        await _save(store(), req, obj, choice.text, choice.calls)
        return JSONResponse(obj)

    async def input_tokens(request: Request) -> Response:
        return await create(request, count_only=True)

    def stored(request: Request) -> Record:
        rid = request.path_params["rid"]
        rec = store().get(rid)
        if rec is None:
            raise APIError(404, f"no stored response '{rid}' (it was never stored, or was deleted)",
                           param="response_id", code="not_found")
        return rec

    async def get(request: Request) -> Response:
        rec = await asyncio.to_thread(stored, request)
        return JSONResponse(rec.response)

    async def input_items(request: Request) -> Response:
        rec = await asyncio.to_thread(stored, request)
        items = [{"id": _item_id("msg"), "type": "message", "role": m["role"], "status": "completed",
                  "content": [{"type": "input_text", "text": m.get("content") or ""}]}
                 for m in rec.messages if m["role"] in ("user", "system", "assistant")]
        return JSONResponse({"object": "list", "data": items[::-1], "has_more": False,
                             "first_id": items[-1]["id"] if items else None, "last_id": items[0]["id"] if items else None})

    async def delete(request: Request) -> Response:
        rid = request.path_params["rid"]
        if not await asyncio.to_thread(store().delete, rid):
            raise APIError(404, f"no stored response '{rid}' (it was never stored, or was deleted)",
                           param="response_id", code="not_found")
        return JSONResponse({"id": rid, "object": "response", "deleted": True})

    return [Route(ENDPOINT, create, methods=["POST"]),
            Route(ENDPOINT + "/input_tokens", input_tokens, methods=["POST"]),
            Route(ENDPOINT + "/{rid}", get, methods=["GET"]),
            Route(ENDPOINT + "/{rid}", delete, methods=["DELETE"]),
            Route(ENDPOINT + "/{rid}/input_items", input_items, methods=["GET"])]


__all__ = ["ENDPOINT", "build", "output_items", "response_object"]
