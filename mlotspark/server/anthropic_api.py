"""Anthropic's Messages API: ``POST /v1/messages`` (what Claude Code and Anthropic-SDK tools speak).

A request is translated to the chat request the engine already serves: ``system``,
text / ``tool_use`` / ``tool_result`` blocks become the chat template's system, user,
assistant (with ``tool_calls``) and ``tool`` messages; ``tools`` (``input_schema``) and
``tool_choice`` (``auto`` / ``any`` / ``tool`` / ``none``) become OpenAI's, so the same
grammar keeps every ``tool_use`` valid for its schema. Replies come back as content
blocks; a stream is Anthropic's event sequence (``message_start``,
``content_block_start/delta/stop``, ``message_delta``, ``message_stop``). Errors use
Anthropic's shape ``{"type": "error", "error": {"type", "message"}}`` (``app.py``).
``POST /v1/messages/count_tokens`` answers the prompt tokens the same body would read.

A reasoning model's thinking comes back as a ``thinking`` block before the text (streamed as
``thinking_delta``s; its ``signature`` is empty: nothing here signs it); ``thinking``
``{"type": "enabled", "budget_tokens": n}`` sets the budget, ``{"type": "disabled"}`` turns it
off. Thinking blocks sent back in the history are dropped, as the chat templates drop past
thinking.

``stop_reason`` is Anthropic's: ``tool_use``, ``max_tokens``, ``stop_sequence`` (with the
request's ``stop_sequences`` entry that ended the text in ``stop_sequence``), else ``end_turn``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlotspark.server.exchange import (count, end_stream, keep_alive, prompt_tokens, read_json, reply_events, start_job,
                                       whole_outcome)
from mlotspark.server.runner import Job, Outcome
from mlotspark.server.responses import extension
from mlotspark.server.schemas import EXTENSION_KEY, APIError, ParsedRequest, bad, check_options, text_parts

ENDPOINT = "/v1/messages"
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _messages(body: dict) -> list[dict]:
    out: list[dict] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": text_parts(system, "system")})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages")
    used: set = set()  # the tool_use ids so far: a tool_result answers one of them
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise bad(f"{where}.role", "expected 'user' or 'assistant'")
        role, content = m["role"], m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise bad(f"{where}.content", "expected a string or a list of content blocks")
        texts, calls = [], []
        for j, b in enumerate(content):
            kind = b.get("type") if isinstance(b, dict) else None
            at = f"{where}.content[{j}]"
            if kind == "text" and isinstance(b.get("text"), str):
                texts.append(b["text"])
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                    raise bad(at, "a tool_use block needs 'id', 'name' and an 'input' object")
                used.add(b.get("id"))
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b["name"], "arguments": b.get("input", {})}})
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # past thinking: the templates leave it out of the history
            elif kind == "tool_result" and role == "user":
                if b.get("tool_use_id") not in used:
                    raise bad(f"{at}.tool_use_id", f"{json.dumps(b.get('tool_use_id'))[:40]} answers no tool_use "
                                                   "block before it")
                result = text_parts(b.get("content", ""), f"{at}.content")
                if b.get("is_error"):
                    result = f"Error: {result}"
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": result})
            else:
                raise bad(f"{at}.type", f"{json.dumps(kind)[:40]} blocks are not supported in a {role} message "
                                        "(text, tool_use from the assistant, tool_result from the user)")
        if texts or calls or role == "assistant":
            msg: dict = {"role": role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def parse_messages(body: Any, served: list[str], options: Any) -> ParsedRequest:
    """Check a ``POST /v1/messages`` body into a chat request.

    Args:
        body: the decoded JSON body.
        served: model ids this server answers to.
        options: ``engine.defaults.merged`` (validates the generation options once).

    Raises:
        APIError: the first bad field (400), or an unknown model (404).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "expected the model's id (GET /v1/models lists it)")
    if model not in served:
        raise APIError(404, f"model '{model}' does not exist; this server serves {', '.join(served)}",
                       param="model", code="model_not_found")
    req = ParsedRequest(kind="chat", model=model)
    opts, fields = req.options, req.fields
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int):
        raise bad("max_tokens", f"required, an integer; got {json.dumps(mt)[:40]}")
    opts["max_tokens"] = mt
    for name in ("temperature", "top_p"):
        v = body.get(name)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise bad(name, f"expected a number, got {json.dumps(v)[:40]}")
            if name == "temperature" and not 0 <= v <= 1:
                raise bad(name, f"{v} is out of range [0, 1]")
            opts[name] = float(v)
    if body.get("top_k") is not None:
        opts["top_k"] = body["top_k"]
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad("stop_sequences", "expected a list of non-empty strings")
        if stops:
            opts["stop"], fields["stop"] = tuple(stops), "stop_sequences"
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "expected true or false")
    req.stream = stream
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise bad("tools", "expected a list of {name, description, input_schema}")
        for k, t in enumerate(tools):
            if not isinstance(t.get("input_schema"), dict):
                raise bad(f"tools[{k}].input_schema", "expected the tool's JSON schema object")
        opts["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                           "parameters": t.get("input_schema")}} for t in tools]
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        if kind == "tool":
            opts["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif kind in _CHOICES:
            opts["tool_choice"] = _CHOICES[kind]
        else:
            raise bad("tool_choice", "expected {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}")
        if choice.get("disable_parallel_tool_use"):
            opts["parallel_tool_calls"] = False
    _thinking(body, req)
    req.messages = _messages(body)
    check_options(req, options)
    return req


def _thinking(body: dict, req: ParsedRequest) -> None:
    """Anthropic's ``thinking``: ``enabled`` with ``budget_tokens``, ``disabled``, ``adaptive``."""
    thinking = body.get("thinking")
    if thinking is None:
        return
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled":
        req.options["think"], req.fields["think"] = False, "thinking"
    elif kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise bad("thinking.budget_tokens", f"expected a number of tokens, got {json.dumps(budget)[:40]}")
        req.options["reasoning_budget"], req.fields["reasoning_budget"] = budget, "thinking.budget_tokens"
    elif kind != "adaptive":
        raise bad("thinking.type", "expected \"enabled\" (with budget_tokens), \"disabled\" or \"adaptive\"")


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def stop_reason(finish: str, calls: list, stop_sequence: str | None = None) -> str:
    """Anthropic's ``stop_reason`` for our finish reason (``cancelled`` ends as ``end_turn``)."""
    if calls:
        return "tool_use"
    if finish == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def tool_use_block(call: Any) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": call.arguments}


def message_response(mid: str, model: str, outcome: Outcome) -> dict:
    """The whole ``message`` object of a finished request."""
    choice = outcome.choices[0]
    content: list[dict] = []
    if choice.reasoning:
        content.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text or not choice.calls:
        content.append({"type": "text", "text": choice.text})
    content += [tool_use_block(c) for c in choice.calls]
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop_reason(choice.finish, choice.calls, choice.stop_sequence),
            "stop_sequence": None if choice.calls else choice.stop_sequence,
            # Anthropic's input_tokens leave out the cached ones (their total is the sum)
            "usage": {"input_tokens": outcome.prompt_tokens - outcome.cached_tokens,
                      "output_tokens": outcome.completion_tokens, "cache_read_input_tokens": outcome.cached_tokens},
            EXTENSION_KEY: extension(outcome.stats)}


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _stream(state: Any, job: Job, req: ParsedRequest, mid: str, t0: float) -> AsyncIterator[str]:
    """Anthropic's event sequence for one request; a client gone cancels it."""
    index = -1  # the open content block, if any
    text_open = False
    thinking_open = False
    calls_sent = 0
    ended = False

    def close_thinking() -> list[str]:
        nonlocal thinking_open
        if not thinking_open:
            return []
        thinking_open = False
        return [_sse("content_block_stop", {"type": "content_block_stop", "index": index})]

    def thinking(text: str) -> list[str]:
        nonlocal index, thinking_open
        out: list[str] = []
        if not thinking_open:
            index += 1
            thinking_open = True
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": {"type": "thinking", "thinking": "",
                                                                      "signature": ""}}))
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "thinking_delta", "thinking": text}}))
        return out

    def open_text() -> list[str]:
        nonlocal index, text_open
        if text_open:
            return []
        out = close_thinking()
        index += 1
        text_open = True
        return out + [_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}})]

    def blocks(text: str, calls: list) -> list[str]:
        nonlocal index, text_open, calls_sent
        out: list[str] = []
        if calls:
            out += close_thinking()
        if text:
            out += open_text()
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                                    "delta": {"type": "text_delta", "text": text}}))
        for call in calls:
            if text_open:
                out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
                text_open = False
            index += 1
            block = tool_use_block(call)
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": index,
                                                    "content_block": {**block, "input": {}}}))
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(call.arguments, ensure_ascii=False)}}))
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
            calls_sent += 1
        return out

    start = {"id": mid, "type": "message", "role": "assistant", "model": req.model, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": job.prompt_tokens, "output_tokens": 0}}
    events = reply_events(job, req.checked)
    try:
        yield _sse("message_start", {"type": "message_start", "message": start})
        async for what, value, *split in events:
            if what == "thinking":
                for e in thinking(value):
                    yield e
                continue
            if what == "answer":
                for e in blocks(value, *split):
                    yield e
                continue
            ended = True
            count(state, ENDPOINT, value, t0)
            choice = value.choices[0]
            text, calls = split
            for e in blocks(text, calls):
                yield e
            if not calls_sent and not text_open:  # an empty reply still has its (empty) text block
                for e in open_text():
                    yield e
            if text_open:
                yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
            reason = "tool_use" if calls_sent else stop_reason(choice.finish, [], choice.stop_sequence)
            stop = choice.stop_sequence if reason == "stop_sequence" else None
            yield _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop},
                                         "usage": {"input_tokens": value.prompt_tokens - value.cached_tokens,
                                                   "output_tokens": value.completion_tokens,
                                                   "cache_read_input_tokens": value.cached_tokens},
                                         EXTENSION_KEY: extension(value.stats)})  # the final counts, as whole replies
            yield _sse("message_stop", {"type": "message_stop"})
    except APIError as e:  # after the 200 went out: Anthropic's error event ends the stream
        ended = True
        state.metrics.requests.labels(ENDPOINT, str(e.status)).inc()
        yield _sse("error", anthropic_error(e))
    finally:
        await events.aclose()
        end_stream(state, job, ENDPOINT, ended, t0)


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(e: APIError) -> dict:
    """Anthropic's error object for ``e``."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(e.status, "api_error"), "message": e.message}}


def build(state: Any) -> list[Route]:
    """The Anthropic routes for a :class:`~mlotspark.server.app.ServerState`."""

    async def messages(request: Request) -> Response:
        t0 = time.perf_counter()
        body = await read_json(request)
        job = await start_job(state, body, parse_messages)
        req = job.request
        mid = new_message_id()
        if req.stream:
            stream = keep_alive(_stream(state, job, req, mid, t0), _sse("ping", {"type": "ping"}))  # Anthropic's own
            return StreamingResponse(stream, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        outcome = await whole_outcome(request, state, job, ENDPOINT, t0)
        return JSONResponse(message_response(mid, req.model, outcome))

    async def count_tokens(request: Request) -> Response:
        body = await read_json(request)
        if isinstance(body, dict) and body.get("max_tokens") is None:
            body = {**body, "max_tokens": 1}  # count_tokens takes a messages body without it
        n = await prompt_tokens(state, body, parse_messages, "messages")
        state.metrics.requests.labels(ENDPOINT + "/count_tokens", "200").inc()
        return JSONResponse({"input_tokens": n})

    return [Route(ENDPOINT, messages, methods=["POST"]),
            Route(ENDPOINT + "/count_tokens", count_tokens, methods=["POST"])]


__all__ = ["ENDPOINT", "anthropic_error", "build", "message_response", "parse_messages"]
