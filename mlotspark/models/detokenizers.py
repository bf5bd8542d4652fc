"""Streaming detokenizers that give exactly ``tokenizer.decode(tokens)``, piece by piece.

mlx-lm's ``BPEStreamingDetokenizer`` and ``SPMStreamingDetokenizer``, with the
differences their docstrings name; the tokenizers of ``tokenizer.py`` and
``gguf_tokenizer.py`` put them in place of mlx-lm's.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer


class ByteLevelDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's byte-level streaming detokenizer, made to give exactly ``decode(tokens)``.

    mlx-lm's version holds a split UTF-8 character back correctly, but it drops the
    reply's leading space (a raw completion " Paris" would glue onto its prompt), writes
    the byte 0x00 as "Ā" mid-stream, reads an added token's text as byte symbols (so
    "é" in one came out as U+FFFD), and its ``finalize`` raised KeyError on a held token
    outside the byte alphabet (such as "<｜User｜>").
    """

    def __init__(self, tokenizer: Any, tokens: list[str] | None = None) -> None:
        """Args:
            tokenizer: the transformers tokenizer.
            tokens: the GGUF vocabulary, id order: it is the token map already, so the
                262k-id ``convert_ids_to_tokens`` of mlx-lm's constructor is skipped.
        """
        if tokens is not None and len(tokens) == len(tokenizer):
            self.tokenmap = list(tokens)
            self.reset()
        else:
            super().__init__(tokenizer)
        symbol = _byte_symbols()
        # Added tokens are plain text in decode(): spell them in byte symbols like the rest.
        for i, added in tokenizer.added_tokens_decoder.items():
            if i < len(self.tokenmap):
                self.tokenmap[i] = "".join(symbol[b] for b in str(added).encode("utf-8"))

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text

    def _decode_bytes(self, seq: str) -> str:
        byte_of = _byte_of_symbol()
        out = bytearray()
        for c in seq:
            b = byte_of.get(c)
            out.extend(c.encode("utf-8") if b is None else (b,))
        return out.decode("utf-8", "replace")

    def finalize(self) -> None:
        self.text += self._decode_bytes(self._unflushed)
        self._unflushed = ""


class SentencePieceDetokenizer(SPMStreamingDetokenizer):
    """mlx-lm's SentencePiece streaming detokenizer, made to give exactly ``decode(tokens)``.

    Like the decoder it drops only the first space of the text (the dummy prefix);
    mlx-lm's version dropped the first space of each flush until some text had come
    out, so a reply starting "▁▁▁▁def" lost its indentation.
    """

    def __init__(self, tokenizer: Any, trim_space: bool = True, tokens: list[str] | None = None) -> None:
        """Args:
            tokenizer: the transformers tokenizer.
            trim_space: drop the first space of the text (the dummy prefix).
            tokens: the GGUF vocabulary, id order (see ``ByteLevelDetokenizer``).
        """
        if tokens is not None and len(tokens) == len(tokenizer):
            self.trim_space = trim_space
            # As mlx-lm's constructor maps them: byte tokens carry their value in hex.
            self.tokenmap = [bytes([int(t[3:5], 16)]) if t.startswith("<0x") else t.encode("utf-8") for t in tokens]
            self.reset()
        else:
            super().__init__(tokenizer, trim_space=trim_space)

    def reset(self) -> None:
        super().reset()
        self._trimmed = not self.trim_space

    def _try_flush(self, force: bool = False) -> None:
        text = self._unflushed.replace(self._sep, b" ").decode("utf-8", "replace")
        if not force and text.endswith("\ufffd"):
            return  # a character split across byte tokens: wait for the rest
        if text and not self._trimmed:
            text = text[1:] if text[0] == " " else text
            self._trimmed = True
        self.text += text
        self._unflushed = b""


@cache
def _byte_symbols() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


@cache
def _byte_of_symbol() -> dict[str, int]:
    return {symbol: byte for byte, symbol in _byte_symbols().items()}


__all__ = ["ByteLevelDetokenizer", "SentencePieceDetokenizer"]
