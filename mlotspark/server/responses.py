"""OpenAI response shapes for ``mlotspark serve``: whole replies, streamed chunks, usage.

mlotspark's own figures travel under the ``mlotspark`` key of a response or chunk
(:data:`~mlotspark.server.schemas.EXTENSION_KEY`), never in OpenAI's fields.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from mlotspark.server.schemas import EXTENSION_KEY


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(reason: str) -> str:
    """OpenAI's finish reason for ours (``cancelled`` ends as ``stop`` on the wire)."""
    return "length" if reason == "length" else "stop"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def extension(stats: Any) -> dict:
    """mlotspark's figures for a finished request (the ``mlotspark`` key)."""
    extra = dict(getattr(stats, "extra", {}) or {})
    out = {
        "ttft_s": round(stats.ttft_s, 6),
        "prefill_tps": round(stats.prefill_tps, 2),
        "decode_tps": round(stats.decode_tps, 2),
        "cached_tokens": stats.cached_tokens,
        "prefilled_tokens": stats.prefilled_tokens,
        "finish_reason": stats.finish_reason,
        "queue_s": extra.get("queue_s"),
        "mean_batch": extra.get("mean_batch"),
    }
    for key in ("cache_source", "conversation", "cascade", "memory"):
        if key in extra:
            out[key] = extra[key]
    return out


@dataclass
class Choice:
    """One reply of a request, as the shapes below render it."""

    text: str
    finish: str  # our finish reason (stop | length | cancelled)
    calls: list = field(default_factory=list)  # ToolCall
    logprobs: list | None = None  # TokenLogprob, when asked for
    stop_sequence: str | None = None  # the request's stop string that ended the text, if one did
    reasoning: str = ""  # a reasoning model's thinking, never in ``text``


def reasoning_fields(text: str) -> dict:
    """A message's (or delta's) thinking under both names clients read: ``reasoning_content``
    (DeepSeek's, llama.cpp's, most OpenAI-compatible clients) and ``reasoning`` (mlx-lm's server)."""
    return {"reasoning_content": text, "reasoning": text}


def tool_call_json(call: Any, index: int | None = None) -> dict:
    """OpenAI's ``tool_calls`` entry (with ``index`` in a streamed delta)."""
    out: dict = {"id": call.id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments_json()}}
    if index is not None:
        out = {"index": index, **out}
    return out


def _token(token_text: Callable[[int], str], token: int, lp: float) -> dict:
    text = token_text(token)
    return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8", "replace"))}


def chat_logprobs(entries: list | None, token_text: Callable[[int], str]) -> dict | None:
    """Chat's ``logprobs`` object: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    if entries is None:
        return None
    return {"content": [{**_token(token_text, e.token, e.logprob),
                         "top_logprobs": [_token(token_text, t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list | None, token_text: Callable[[int], str], offset: int = 0) -> dict | None:
    """Completions' ``logprobs``: parallel lists ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``."""
    if entries is None:
        return None
    tokens = [token_text(e.token) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(t): lp for t, lp in e.top} for e in entries], "text_offset": offsets}


def chat_response(rid: str, model: str, choices: list[Choice], use: dict, ext: dict,
                  token_text: Callable[[int], str] = str) -> dict:
    """A ``chat.completion`` object; a choice that called tools has ``tool_calls``
    (its ``content`` the words outside them, or null) and finish reason ``tool_calls``."""
    out = []
    for i, c in enumerate(choices):
        message: dict = {"role": "assistant", "content": c.text}
        reason = finish_reason(c.finish)
        if c.calls:
            message = {"role": "assistant", "content": c.text or None,
                       "tool_calls": [tool_call_json(call) for call in c.calls]}
            reason = "tool_calls"
        if c.reasoning:
            message.update(reasoning_fields(c.reasoning))
        out.append({"index": i, "message": message, "logprobs": chat_logprobs(c.logprobs, token_text),
                    "finish_reason": reason})
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": None, "choices": out, "usage": use, EXTENSION_KEY: ext,
    }


def completion_response(rid: str, model: str, choices: list[Choice], use: dict, ext: dict,
                        token_text: Callable[[int], str] = str) -> dict:
    """A ``text_completion`` object."""
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "system_fingerprint": None,
        "choices": [{"index": i, "text": c.text, "logprobs": completion_logprobs(c.logprobs, token_text),
                     "finish_reason": finish_reason(c.finish)} for i, c in enumerate(choices)],
        "usage": use, EXTENSION_KEY: ext,
    }


def chunk(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          finish: str | None = None, use: dict | None = None, ext: dict | None = None,
          no_choices: bool = False, calls: list[dict] | None = None, logprobs: dict | None = None,
          reasoning: str | None = None) -> dict:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``); ``calls``
    are ``tool_calls`` delta entries (:func:`tool_call_json` with an index); ``reasoning``
    a piece of the thinking (chat only: a text completion's thinking is not sent)."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if reasoning:
            delta.update(reasoning_fields(reasoning))
        if text is not None:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        choice: dict = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        obj = "text_completion"
    out: dict = {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
                 "choices": [] if no_choices else [choice]}
    if use is not None:
        out["usage"] = use
    if ext is not None:
        out[EXTENSION_KEY] = ext
    return out


__all__ = ["Choice", "chat_logprobs", "chat_response", "chunk", "completion_logprobs", "completion_response",
           "extension", "finish_reason", "new_id", "reasoning_fields", "tool_call_json", "usage"]
