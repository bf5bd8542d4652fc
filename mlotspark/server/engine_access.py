"""What the server reads of the engine beyond its request API, through public names only.

The engine's own public accessors are on their way (issue #25, "the engine's public
methods, written once as a Protocol"); until they land these helpers use the public
name when the engine has it and an equally public fallback otherwise, never a private
attribute.
"""

from __future__ import annotations

from typing import Any


def vocab_size(engine: Any) -> int | None:
    """Token ids the tokenizer knows (added tokens included), or None when it cannot tell.

    Uses ``engine.vocab_size`` when the engine has it, else the tokenizer's public
    ``get_vocab()`` (Hugging Face's, forwarded by mlx-lm's ``TokenizerWrapper``).
    """
    size = getattr(engine, "vocab_size", None)
    if isinstance(size, int):
        return size
    get_vocab = getattr(engine.tokenizer, "get_vocab", None)
    return len(get_vocab()) if callable(get_vocab) else None


__all__ = ["vocab_size"]
