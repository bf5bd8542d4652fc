"""``POST /v1/embeddings`` (OpenAI's shape), with the semantic memory's encoder.

The vectors are what ``engine.memory.embed`` returns: the memory's sentence encoder (MiniLM
when pulled, else the word-hashing fallback), not the chat model's hidden states (why:
``models/embedders.py``). ``encoding_format`` ``base64`` sends each vector as
little-endian float32 bytes, as OpenAI does (and the ``openai`` client asks by default).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlotspark.server.schemas import APIError, bad

MAX_INPUTS = 2048  # as OpenAI
FORMATS = ("float", "base64")


@dataclass
class EmbeddingRequest:
    """A checked embeddings request."""

    model: str
    texts: list[str]
    encoding_format: str = "float"


def parse_embeddings(body: Any, served: list[str], field: str = "input") -> EmbeddingRequest:
    """Check an embeddings body (``input``: a string or a list of strings).

    Args:
        body: the decoded JSON body.
        served: model ids this server answers to.
        field: the name of the texts' field (``input``; Ollama's ``/api/embed`` too).

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
    value = body.get(field)
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad(field, "expected a string or a non-empty list of strings (token arrays are not supported)")
    if len(texts) > MAX_INPUTS:
        raise bad(field, f"{len(texts)} inputs; at most {MAX_INPUTS} per request")
    fmt = body.get("encoding_format", "float")
    if fmt not in FORMATS:
        raise bad("encoding_format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
    dims = body.get("dimensions")
    if dims is not None:
        raise bad("dimensions", "the encoder's vectors have a fixed size; leave 'dimensions' out")
    return EmbeddingRequest(model, list(texts), fmt)


def token_count(engine: Any, texts: list[str]) -> int:
    """Tokens the encoder read (its own tokenizer when it has one, else words)."""
    embedder = engine.memory.embedder
    tokenize = getattr(embedder, "tokenize", None)
    if callable(tokenize):
        _, mask = tokenize(texts)
        return int(np.asarray(mask).sum())
    return sum(len(t.split()) for t in texts)


def embeddings_response(req: EmbeddingRequest, vectors: np.ndarray, tokens: int) -> dict:
    """OpenAI's ``list`` of ``embedding`` objects, with ``usage``."""
    data = []
    for i, v in enumerate(np.asarray(vectors, dtype="<f4")):
        emb: Any = base64.b64encode(v.tobytes()).decode() if req.encoding_format == "base64" else v.tolist()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {"object": "list", "data": data, "model": req.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


__all__ = ["EmbeddingRequest", "embeddings_response", "parse_embeddings", "token_count"]
