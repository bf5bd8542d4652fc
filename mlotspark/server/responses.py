"""OpenAI response shapes for ``mlotspark serve``: whole replies, streamed chunks, usage.

mlotspark's own figures travel under the ``mlotspark`` key of a response or chunk
(:data:`~mlotspark.server.schemas.EXTENSION_KEY`), never in OpenAI's fields.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

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


def chat_response(rid: str, model: str, texts: list[tuple[str, str]], use: dict, ext: dict) -> dict:
    """A ``chat.completion`` object; ``texts`` are (text, finish_reason) per choice."""
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "system_fingerprint": None,
        "choices": [
            {"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None, "finish_reason": f}
            for i, (t, f) in enumerate(texts)
        ],
        "usage": use, EXTENSION_KEY: ext,
    }


def completion_response(rid: str, model: str, texts: list[tuple[str, str]], use: dict, ext: dict) -> dict:
    """A ``text_completion`` object; ``texts`` are (text, finish_reason) per choice."""
    return {
        "id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
        "system_fingerprint": None,
        "choices": [{"index": i, "text": t, "logprobs": None, "finish_reason": f} for i, (t, f) in enumerate(texts)],
        "usage": use, EXTENSION_KEY: ext,
    }


def chunk(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          finish: str | None = None, use: dict | None = None, ext: dict | None = None,
          no_choices: bool = False) -> dict:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``)."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out: dict = {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
                 "choices": [] if no_choices else [choice]}
    if use is not None:
        out["usage"] = use
    if ext is not None:
        out[EXTENSION_KEY] = ext
    return out


__all__ = ["chat_response", "chunk", "completion_response", "extension", "finish_reason", "new_id", "usage"]
