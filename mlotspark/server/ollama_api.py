"""Ollama's API: ``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags``, ``/api/show``,
``/api/ps``, ``/api/version`` (for clients that speak only Ollama: oterm, editor plug-ins).

Requests become the chat / completion requests the engine already serves: ``options``
(``num_predict``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``,
``repeat_penalty``; the others, such as ``num_ctx``, are Ollama's memory settings and
are ignored) map to generation options, ``format`` (``"json"`` or a JSON schema) to
``response_format``, ``tools`` to OpenAI's. Replies stream as NDJSON by default (one
object per line, the last with ``done: true`` and the counts and durations in
nanoseconds), or come whole with ``"stream": false``. Errors are ``{"error": "..."}``.
A reasoning model's thinking comes in ``message.thinking`` (``/api/chat``) or ``thinking``
(``/api/generate``), never in the content; ``think`` (true / false, or ``"low"`` |
``"medium"`` | ``"high"``) turns it off or sets its effort.

Models load on first use and unload after the server's ``--keep-alive`` (``models.py``), or
after a request's own ``keep_alive`` (seconds or ``"5m"``; negative = never), which then holds
for that model, as Ollama's; an empty ``/api/generate`` with ``keep_alive: 0`` unloads it at
once. ``/api/ps`` lists the resident ones. The default model stays resident.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from mlotspark.decoding.reasoning import reasoning_format
from mlotspark.server.embeddings import parse_embeddings
from mlotspark.server.exchange import count, end_stream, read_json, reply_events, start_job, whole_outcome
from mlotspark.server.models import model_capabilities, parse_keep_alive
from mlotspark.server.runner import Job, Outcome
from mlotspark.server.schemas import APIError, ParsedRequest, bad, check_options

VERSION = "0.12.0"  # the Ollama API version these routes follow
_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
            "repeat_penalty": "repetition_penalty"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _model(body: dict, served: list[str]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad("model", "expected the model's name (GET /api/tags lists it)")
    if name.removesuffix(":latest") not in served and name not in served:
        raise APIError(404, f"model '{name}' not found; this server serves {', '.join(served)}", param="model")
    return name


def _options(body: dict, req: ParsedRequest) -> None:
    opts, fields = req.options, req.fields
    given = body.get("options")
    if given is not None and not isinstance(given, dict):
        raise bad("options", "expected an object such as {\"temperature\": 0}")
    for name, value in (given or {}).items():
        if value is None:
            continue
        if name == "num_predict":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad("options.num_predict", f"expected an integer, got {json.dumps(value)[:40]}")
            if value > 0:  # -1 / -2: "until done", the engine's default cap
                opts["max_tokens"], fields["max_tokens"] = value, "options.num_predict"
            continue
        if name == "stop":
            stops = [value] if isinstance(value, str) else value
            if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
                raise bad("options.stop", "expected a list of non-empty strings")
            if stops:
                opts["stop"], fields["stop"] = tuple(stops), "options.stop"
            continue
        if name in _OPTIONS:
            opts[_OPTIONS[name]], fields[_OPTIONS[name]] = value, f"options.{name}"
    fmt = body.get("format")
    if fmt not in (None, ""):
        if fmt == "json":
            opts["response_format"] = {"type": "json_object"}
        elif isinstance(fmt, dict):
            opts["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
        else:
            raise bad("format", "expected \"json\" or a JSON schema object")
        fields["response_format"] = "format"
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise bad("stream", "expected true or false")
    req.stream = stream
    think = body.get("think")
    if think is not None:
        if isinstance(think, bool):
            opts["think"], fields["think"] = think, "think"
        elif think in ("low", "medium", "high"):
            opts["reasoning_effort"], fields["reasoning_effort"] = think, "think"
        else:
            raise bad("think", f"expected true, false, \"low\", \"medium\" or \"high\", got {json.dumps(think)[:40]}")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise bad(f"messages[{i}].role", "expected system, user, assistant or tool")
        if m.get("images"):
            raise bad(f"messages[{i}].images", "images are not supported by this model")
        content = m.get("content", "")
        if not isinstance(content, str):
            raise bad(f"messages[{i}].content", "expected a string")
        msg: dict = {"role": m["role"], "content": content}
        calls = m.get("tool_calls")
        if calls:
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      for c in calls):
                raise bad(f"messages[{i}].tool_calls", "expected [{\"function\": {\"name\", \"arguments\"}}]")
            msg["tool_calls"] = [{"type": "function", "function": {"name": c["function"].get("name"),
                                                                   "arguments": c["function"].get("arguments", {})}}
                                 for c in calls]
        out.append(msg)
    return out


def parse_chat(body: Any, served: list[str], options: Any) -> ParsedRequest:
    """Check a ``POST /api/chat`` body into a chat request (400 naming the field, 404 an unknown model).

    Args:
        body: the decoded JSON body.
        served: model ids this server answers to.
        options: ``engine.defaults.merged`` (validates the generation options once).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    req = ParsedRequest(kind="chat", model=_model(body, served))
    _options(body, req)
    if body.get("tools"):
        req.options["tools"] = body["tools"]
    req.messages = _messages(body)
    check_options(req, options)
    return req


def parse_generate(body: Any, served: list[str], options: Any) -> ParsedRequest:
    """Check a ``POST /api/generate`` body (``prompt``, ``system``, ``raw``); as :func:`parse_chat`."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    req = ParsedRequest(kind="completion", model=_model(body, served))
    _options(body, req)
    if body.get("images"):
        raise bad("images", "images are not supported by this model")
    prompt, system = body.get("prompt", ""), body.get("system")
    if not isinstance(prompt, str):
        raise bad("prompt", "expected a string")
    if system is not None and not isinstance(system, str):
        raise bad("system", "expected a string")
    if body.get("raw"):
        req.prompt = prompt
    else:  # the chat template, as Ollama applies the model's template
        req.kind = "chat"
        req.messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    check_options(req, options)
    return req


def _can_think(job: Job) -> None:
    """``think`` asked of a model that does not reason is refused, as Ollama refuses it."""
    opts = job.request.options
    if (opts.get("think") or opts.get("reasoning_effort")) and reasoning_format(job.server.engine.tokenizer) is None:
        raise APIError(400, f"invalid 'think': \"{job.request.model}\" does not support thinking", param="think")


def _final(model: str, outcome: Outcome, t0: float) -> dict:
    s = outcome.stats
    total = time.perf_counter() - t0
    return {"model": model, "created_at": _now(), "done": True,
            "done_reason": "length" if outcome.choices[0].finish == "length" else "stop",
            "total_duration": int(total * 1e9), "load_duration": 0,
            "prompt_eval_count": outcome.prompt_tokens, "prompt_eval_duration": int(s.ttft_s * 1e9),
            "eval_count": outcome.completion_tokens, "eval_duration": _eval_ns(outcome, total)}


def _eval_ns(outcome: Outcome, total_s: float) -> int:
    """Nanoseconds generating: > 0 whenever a token was made, since clients divide by it
    (a one-token reply has no decode rate: its time past the first token, at least 1 ns)."""
    s, n = outcome.stats, outcome.completion_tokens
    if not n:
        return 0
    if s.decode_tps:
        return max(1, int(n / s.decode_tps * 1e9))
    return max(1, int((total_s - s.ttft_s) * 1e9))


def _calls_json(calls: list) -> list[dict]:
    return [{"function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _piece(kind: str, model: str, text: str, calls: list | None = None, thinking: str = "") -> dict:
    if kind == "chat":
        message: dict = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = _calls_json(calls)
        return {"model": model, "created_at": _now(), "message": message, "done": False}
    out = {"model": model, "created_at": _now(), "response": text, "done": False}
    if thinking:
        out["thinking"] = thinking
    return out


async def _ndjson(state: Any, job: Job, req: ParsedRequest, kind: str, endpoint: str, t0: float) -> AsyncIterator[str]:
    ended = False
    events = reply_events(job, req.checked)
    try:
        async for what, value, *split in events:
            if what == "thinking":
                yield json.dumps(_piece(kind, req.model, "", thinking=value), ensure_ascii=False) + "\n"
                continue
            if what == "answer":
                if value or split[0]:
                    yield json.dumps(_piece(kind, req.model, value, *split), ensure_ascii=False) + "\n"
                continue
            ended = True
            count(state, endpoint, value, t0)
            text, calls = split
            last = {**_piece(kind, req.model, text, calls), **_final(req.model, value, t0)}
            yield json.dumps(last, ensure_ascii=False) + "\n"
    except APIError as e:  # after the 200 went out: an error line ends the stream
        ended = True
        state.metrics.requests.labels(endpoint, str(e.status)).inc()
        yield json.dumps({"error": e.message}) + "\n"
    finally:
        await events.aclose()
        end_stream(state, job, endpoint, ended, t0)


def _details(engine: Any, spec: str) -> dict:
    if engine is None:  # not loaded: what its name tells
        return {"parent_model": "", "format": "gguf" if spec.endswith(".gguf") else "mlx", "family": "",
                "families": [], "parameter_size": "", "quantization_level": ""}
    loaded = engine.loaded
    path = str(loaded.source.path)
    family = str(loaded.config.get("model_type", ""))
    return {"parent_model": "", "format": "gguf" if path.endswith(".gguf") else "mlx", "family": family,
            "families": [family], "parameter_size": "", "quantization_level": loaded.weights}


def _listing(state: Any, name: str) -> dict:
    slot = state.pool.slots.get(name)
    engine = slot.engine if slot is not None else None
    spec = slot.spec if slot is not None else name
    if engine is not None:
        size, digest = int(engine.loaded.nbytes()), str(engine.loaded.fingerprint)
    else:
        files = [root / name for root in state.pool.allow_load if (root / name).is_file()]
        size, digest = (files[0].stat().st_size if files else 0), ""
    return {"name": name, "model": name,
            "modified_at": datetime.fromtimestamp(state.created, timezone.utc).isoformat().replace("+00:00", "Z"),
            "size": size, "digest": digest, "details": _details(engine, spec)}


def _keep_alive(body: Any) -> float | None:
    """A request's ``keep_alive`` in seconds (None: not given); it becomes its model's."""
    if not isinstance(body, dict) or body.get("keep_alive") is None:
        return None
    seconds = parse_keep_alive(body["keep_alive"])
    if seconds is None:
        raise bad("keep_alive", "expected seconds, or a duration such as \"5m\" (negative = never unload)")
    return seconds


def build(state: Any) -> list[Route]:
    """The Ollama routes for a :class:`~mlotspark.server.app.ServerState`."""

    async def run(request: Request, kind: str) -> Response:
        t0 = time.perf_counter()
        endpoint = request.url.path
        body = await read_json(request)
        if kind == "generate" and isinstance(body, dict) and not body.get("prompt") and not body.get("system"):
            # An empty prompt loads the model (and keep_alive 0 unloads it, as Ollama's).
            keep = _keep_alive(body)
            slot = await state.open_model(body)
            if slot is None:
                _model(body, state.served)  # names the missing field
            if keep is not None:
                slot.keep_alive_s = keep
            state.pool.release(slot)
            if slot.keep_alive_s == 0 and not slot.pinned:
                await asyncio.get_running_loop().run_in_executor(None, state.pool.unload, slot)
                return JSONResponse({"model": body["model"], "created_at": _now(), "response": "", "done": True,
                                     "done_reason": "unload"})
            return JSONResponse({"model": body["model"], "created_at": _now(), "response": "", "done": True,
                                 "done_reason": "load"})
        keep = _keep_alive(body)  # checked before the request starts
        job = await start_job(state, body, parse_chat if kind == "chat" else parse_generate, _can_think)
        if keep is not None:
            job.server.keep_alive_s = keep
        req = job.request
        shape = "chat" if kind == "chat" else "generate"
        if req.stream:
            return StreamingResponse(_ndjson(state, job, req, shape, endpoint, t0), media_type="application/x-ndjson")
        outcome = await whole_outcome(request, state, job, endpoint, t0)
        choice = outcome.choices[0]
        return JSONResponse({**_piece(shape, req.model, choice.text, choice.calls, choice.reasoning),
                             **_final(req.model, outcome, t0)})

    async def chat(request: Request) -> Response:
        return await run(request, "chat")

    async def generate(request: Request) -> Response:
        return await run(request, "generate")

    async def embed(request: Request) -> Response:
        t0 = time.perf_counter()
        body = await read_json(request)
        if isinstance(body, dict):
            _model(body, state.served + state.listed)
            body = {**body, "model": state.model_id}
        req = parse_embeddings(body, state.served)
        vectors, tokens = await state.embed(req.texts)
        state.metrics.requests.labels("/api/embed", "200").inc()
        return JSONResponse({"model": req.model, "embeddings": [v.tolist() for v in vectors],
                             "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": 0,
                             "prompt_eval_count": tokens})

    async def tags(request: Request) -> Response:
        return JSONResponse({"models": [_listing(state, name) for name in state.listed]})

    async def show(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        if "name" in body and "model" not in body:  # older clients
            body = {**body, "model": body["name"]}
        slot = await state.open_model(body)  # show reads the model itself: it is loaded if need be
        if slot is None:
            _model(body, state.served)
        try:
            engine = slot.engine
            tokenizer = engine.tokenizer
            template = getattr(tokenizer, "chat_template", None) or ""
            features = model_capabilities(slot.name, engine).features  # measured for the catalogue
            caps = ["completion"] + (["tools"] if "tools" in features else []) + ["embedding"]
            if reasoning_format(tokenizer) is not None:
                caps.append("thinking")
            loaded = engine.loaded
            return JSONResponse({"modelfile": f"FROM {loaded.source.path}\n", "parameters": "", "template": template,
                                 "details": _details(engine, slot.spec), "capabilities": caps,
                                 "model_info": {"general.architecture": loaded.config.get("model_type", ""),
                                                "context_length": loaded.context_length},
                                 "modified_at": _listing(state, slot.name)["modified_at"]})
        finally:
            state.pool.release(slot)

    async def ps(request: Request) -> Response:
        out = []
        for slot in state.pool.resident():
            left = state.pool.expires_in(slot)
            expires = datetime.now(timezone.utc) + timedelta(seconds=left if left is not None else 100 * 365 * 86400)
            out.append({**_listing(state, slot.name), "expires_at": expires.isoformat().replace("+00:00", "Z"),
                        "size_vram": 0, "context_length": slot.engine.loaded.context_length,
                        "requests_in_flight": slot.active})
        return JSONResponse({"models": out})

    async def version(request: Request) -> Response:
        return JSONResponse({"version": VERSION})

    async def root(request: Request) -> Response:
        return PlainTextResponse("Ollama is running")  # what Ollama clients probe for

    return [
        Route("/api/chat", chat, methods=["POST"]),
        Route("/api/generate", generate, methods=["POST"]),
        Route("/api/embed", embed, methods=["POST"]),
        Route("/api/tags", tags, methods=["GET"]),
        Route("/api/show", show, methods=["POST"]),
        Route("/api/ps", ps, methods=["GET"]),
        Route("/api/version", version, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
    ]


__all__ = ["VERSION", "build", "parse_chat", "parse_generate"]
