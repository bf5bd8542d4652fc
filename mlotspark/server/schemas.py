"""OpenAI request parsing and response shapes for ``mlotspark serve``.

Requests are checked field by field before anything reaches the engine; a bad one
raises :class:`APIError`, which the app turns into OpenAI's error object
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status, naming the
field. Fields OpenAI defines that the engine cannot honour are refused when set to
a value that would change the reply (non-zero penalties, ``echo``),
rather than silently ignored. Unknown fields are ignored, as clients add their own.

mlotspark's own figures travel under the ``mlotspark`` key of a response or chunk
(:data:`EXTENSION_KEY`), never in OpenAI's fields; a request may name a
persistent conversation in ``conversation`` (or the ``X-Mlotspark-Conversation``
header).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions

EXTENSION_KEY = "mlotspark"
MAX_N = 8  # replies per request: each is its own sequence in the engine
MAX_STOP = 4  # as OpenAI
ROLES = ("system", "developer", "user", "assistant", "tool")
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class APIError(Exception):
    """An error answered as OpenAI's error object.

    Args:
        status: HTTP status (400, 401, 404, 413, 503 ...).
        message: one line naming the bad value.
        param: the request field at fault, or None.
        type: OpenAI's error type (``invalid_request_error`` ...).
        code: a short machine-readable code, or None.
        headers: extra response headers (``Retry-After``).
    """

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, why: str) -> APIError:
    """A 400 naming ``param``."""
    return APIError(400, f"invalid '{param}': {why}", param=param)


@dataclass
class ParsedRequest:
    """A checked chat or completions request, ready for the engine."""

    kind: str  # "chat" | "completion"
    model: str
    messages: list[dict] | None = None  # chat
    prompt: str | None = None  # completions (text)
    prompt_ids: list[int] | None = None  # completions (token ids)
    options: dict[str, Any] = field(default_factory=dict)  # GenerationOptions overrides
    checked: GenerationOptions | None = None  # the overrides validated by the engine (check_options)
    fields: dict[str, str] = field(default_factory=dict)  # option name -> the request field that set it
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    conversation: str | None = None
    #: A KV source and sink of the request's own (the Responses API's stored chains):
    #: ``take(ids, options, beyond) -> (cache, n)`` and ``keep(tokens, cache)``, on the engine thread.
    kv: Any = None


# ----------------------------------------------------------------- field checks
def _int(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"expected an integer, got {json.dumps(v)[:40]}")
    if v < lo or (hi is not None and v > hi):
        raise bad(name, f"{v} is out of range [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _number(body: dict, name: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(name, f"expected a number, got {json.dumps(v)[:40]}")
    if v > hi or v < lo or (lo_open and v == lo):
        raise bad(name, f"{v} is out of range {'(' if lo_open else '['}{lo}, {hi}]")
    return float(v)


def _bool(body: dict, name: str) -> bool | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise bad(name, f"expected true or false, got {json.dumps(v)[:40]}")
    return v


def _stop(body: dict) -> list[str] | None:
    v = body.get("stop")
    if v is None:
        return None
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or any(not isinstance(s, str) or not s for s in stops):
        raise bad("stop", "expected a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP:
        raise bad("stop", f"at most {MAX_STOP} stop sequences, got {len(stops)}")
    return stops


def text_parts(value: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's text, as every API writes it: a string, or a list of ``{"type": KIND,
    "text": ...}`` parts joined (``kinds``: what the API calls a text part; ``text`` in the
    chat and Anthropic APIs, ``input_text`` / ``output_text`` in Responses).

    Raises:
        APIError: another value, or a part of another kind (an image), named by its path.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for i, p in enumerate(value):
            if not isinstance(p, dict) or p.get("type") not in kinds or not isinstance(p.get("text"), str):
                kind = p.get("type") if isinstance(p, dict) else p
                raise bad(f"{where}[{i}]" + (".type" if isinstance(p, dict) and kind not in kinds else ""),
                          f"{json.dumps(kind)[:40]} parts are not supported: only {' or '.join(kinds)} parts, "
                          "each with its text")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(where, "expected a string or a list of text parts")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages", "expected a non-empty list of messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", "expected an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role", f"{json.dumps(role)[:40]} is not one of {', '.join(ROLES)}")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""  # an assistant turn that only called tools
        text = text_parts(content, f"messages[{i}].content")
        # The chat templates know system/user/assistant; developer is OpenAI's new system.
        msg: dict = {"role": "system" if role == "developer" else role, "content": text}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = _history_calls(m["tool_calls"], f"messages[{i}].tool_calls")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]:
                raise bad(f"messages[{i}].tool_call_id", "a tool message names the id of the call it answers")
            for key in ("tool_call_id", "name"):
                if isinstance(m.get(key), str):
                    msg[key] = m[key]
        out.append(msg)
    return out


def _history_calls(calls: Any, where: str) -> list[dict]:
    """An assistant turn's earlier tool calls, arguments as objects (what templates render)."""
    if not isinstance(calls, list):
        raise bad(where, "expected a list of tool calls")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise bad(f"{where}[{j}]", 'expected {"id": ..., "type": "function", "function": {"name", "arguments"}}')
        args = f.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise bad(f"{where}[{j}].function.arguments", "is not valid JSON") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def _common(body: dict, kind: str, served: list[str]) -> ParsedRequest:
    """The fields chat and completions share, checked for their JSON types and OpenAI's
    own bounds; the values' meaning is checked once, by the engine (:func:`check_options`)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "expected the model's id (GET /v1/models lists it)")
    if model not in served:
        raise APIError(404, f"model '{model}' does not exist; this server serves {', '.join(served)}",
                       param="model", code="model_not_found")
    req = ParsedRequest(kind=kind, model=model)
    opts, fields = req.options, req.fields
    limit = _int(body, "max_completion_tokens", 1) if kind == "chat" else None
    if limit is not None:
        fields["max_tokens"] = "max_completion_tokens"
    else:
        limit = _int(body, "max_tokens", 1)
    if limit is None and kind == "completion":
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS
    if limit is not None:
        opts["max_tokens"] = limit
    t = _number(body, "temperature", 0.0, 2.0)  # OpenAI's bound; the engine takes any t >= 0
    if t is not None:
        opts["temperature"] = t
    for name in ("top_p", "min_p", "repetition_penalty"):
        v = _number(body, name, -math.inf, math.inf)
        if v is not None:
            opts[name] = v
    for name in ("seed", "top_k"):
        v = _int(body, name, -(2**63))
        if v is not None:
            opts[name] = v
    stops = _stop(body)
    if stops:
        opts["stop"] = tuple(stops)
    for name in ("presence_penalty", "frequency_penalty"):
        v = _number(body, name, -2.0, 2.0)
        if v:  # 0 is what most clients send by default: accepted
            raise bad(name, "not supported by this server (use 0, or the 'repetition_penalty' extension)")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise bad("logit_bias", "expected an object mapping token ids to biases")
    if bias:  # an empty map changes nothing: accepted, as the penalties' 0
        raise bad("logit_bias", "not supported by this server (send {} or leave it out)")
    n = _int(body, "n", 1)
    if n is not None and n > MAX_N:
        raise bad("n", f"{n} replies asked; this server returns at most {MAX_N}")
    req.n = n or 1
    req.stream = bool(_bool(body, "stream"))
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("stream_options", "expected an object such as {\"include_usage\": true}")
        req.include_usage = bool(_bool(so, "include_usage"))
    if req.n > 1:
        if req.stream:
            raise bad("n", "n > 1 is not supported with stream=true")
        opts["num_return_sequences"] = req.n
        fields["num_return_sequences"] = "n"
    _logprobs(body, kind, req)
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        if body.get(name) is not None:
            if kind != "chat":
                raise bad(name, "tools are for /v1/chat/completions")
            opts[name] = body[name]
    rf = body.get("response_format")
    if rf is not None:
        opts["response_format"] = rf
    _reasoning(body, req)
    conv = body.get("conversation")
    if conv is not None:
        if not isinstance(conv, str) or not conv:
            raise bad("conversation", f"expected a conversation name (a non-empty string), got {conv!r:.60}")
        req.conversation = conv
    return req


def _reasoning(body: dict, req: ParsedRequest) -> None:
    """A reasoning model's thinking: OpenAI's ``reasoning_effort``, the ``reasoning_budget``
    (tokens) and ``think`` extensions, and ``chat_template_kwargs.enable_thinking`` (as
    llama.cpp's and vLLM's servers take it). Their values are the engine's to check."""
    for name in ("reasoning_effort", "reasoning_budget", "think"):
        if body.get(name) is not None:
            req.options[name] = body[name]
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad("chat_template_kwargs", "expected an object such as {\"enable_thinking\": false}")
        on = kwargs.get("enable_thinking")
        if on is not None:
            if not isinstance(on, bool):
                raise bad("chat_template_kwargs.enable_thinking", "expected true or false")
            req.options["think"], req.fields["think"] = on, "chat_template_kwargs.enable_thinking"


def _logprobs(body: dict, kind: str, req: ParsedRequest) -> None:
    """OpenAI's two shapes: chat's ``logprobs: true`` + ``top_logprobs: k``, completions'
    ``logprobs: k``."""
    if kind == "chat":
        on = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", -(2**31))
        if top is not None and not on:
            raise bad("top_logprobs", "needs logprobs: true")
        if on:
            req.options["logprobs"] = top or 0
            if top is not None:
                req.fields["logprobs"] = "top_logprobs"
    else:
        top = _int(body, "logprobs", -(2**31))
        if top is not None:
            req.options["logprobs"] = top


def check_options(req: ParsedRequest, options: Callable[..., GenerationOptions]) -> GenerationOptions:
    """Validate ``req.options`` once, by the engine's own rules, into ``req.checked``.

    Args:
        req: a parsed request.
        options: the engine's ``engine.defaults.merged`` (defaults merged with the overrides).

    Raises:
        APIError: 400 naming the request field the engine's ``OptionError.options`` names.
    """
    try:
        req.checked = options(**req.options)
    except OptionError as e:
        raise option_error(e, req.fields) from None
    return req.checked


def option_error(e: OptionError, fields: dict[str, str]) -> APIError:
    """The 400 of an engine's ``OptionError``, naming the request's own field once
    (``fields``: option name -> the field a request wrote it in, when they differ)."""
    name = e.options[0] if e.options else None
    field = fields.get(name, name) if name else None
    if not field:
        return APIError(400, str(e))
    said = str(e)  # "invalid max_tokens 0: must be ...", "invalid tools: ..."
    for own in (f"invalid {name} ", f"invalid {name}: "):
        if said.startswith(own):
            return APIError(400, f"invalid '{field}'{own[len('invalid ') + len(name):]}{said[len(own):]}", param=field)
    return APIError(400, f"invalid '{field}': {said}", param=field)


def parse_chat(body: Any, served: list[str], options: Callable[..., GenerationOptions] | None = None) -> ParsedRequest:
    """Check a ``POST /v1/chat/completions`` body.

    Args:
        body: the decoded JSON body.
        served: model ids this server answers to.
        options: validates the generation options (``engine.defaults.merged``; default
            ``GenerationOptions().merged``).

    Raises:
        APIError: the first bad field (400), or an unknown model (404).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    req = _common(body, "chat", served)
    req.messages = _messages(body)
    if req.conversation is None:  # a conversation validates its options itself, before its turn
        check_options(req, options or GenerationOptions().merged)
    return req


def parse_completion(body: Any, served: list[str],
                     options: Callable[..., GenerationOptions] | None = None) -> ParsedRequest:
    """Check a ``POST /v1/completions`` body (``prompt``: a string, one string in a
    list, or a list of token ids).

    Raises:
        APIError: the first bad field (400), or an unknown model (404).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    req = _common(body, "completion", served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("prompt", "expected a non-empty string")
        req.prompt = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        req.prompt_ids = list(prompt)
    else:
        raise bad("prompt", "expected a non-empty string, or a list of token ids (one prompt per request)")
    if _bool(body, "echo"):
        raise bad("echo", "echo is not supported by this server")
    if body.get("suffix"):
        raise bad("suffix", "suffix (insertion) is not supported by this server")
    best_of = _int(body, "best_of", 1)
    if best_of is not None and best_of > 1:
        raise bad("best_of", "best_of > 1 is not supported by this server")
    if req.conversation is not None:
        raise bad("conversation", "conversations are for /v1/chat/completions")
    check_options(req, options or GenerationOptions().merged)
    return req


__all__ = ["APIError", "EXTENSION_KEY", "MAX_N", "ParsedRequest", "bad", "check_options", "option_error", "parse_chat", "text_parts",
           "parse_completion"]
