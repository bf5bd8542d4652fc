"""Tokenizers for the engine, as mlx-lm ``TokenizerWrapper`` objects: loading one,
and encoding chats and raw prompts with it.

A Hugging Face / mlx-lm directory's tokenizer loads with mlx-lm (``load_hf_tokenizer``);
a GGUF file's is rebuilt from its metadata (``gguf_tokenizer.py``); both stream text
through the detokenizers of ``detokenizers.py``.

Special-token strings typed *inside a chat message* (a user writing ``<|im_end|>``)
are plain text: ``encode_chat`` encodes message text with special tokens split, so
what a user types can never close their turn or open another role's; only the
template's own markers are control tokens. ``encode_raw`` keeps them whole: a raw
prompt is the caller's own template.

Chat prompts (``encode_chat``) use the model's Jinja template. A model without one
gets ``FALLBACK_CHAT_TEMPLATE``: each message as ``"Role: content"`` followed by a
blank line, then ``"Assistant:"`` when a reply is wanted. A BOS token is put first
when the model asks for one (``tokenizer.ggml.add_bos_token`` or its HF post-
processor) and the template did not write it, as llama.cpp does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper

from mlotspark.errors import ModelFormatError, ModelNotFoundError
from mlotspark.models.detokenizers import ByteLevelDetokenizer, SentencePieceDetokenizer
from mlotspark.models.gguf_tokenizer import load_gguf_tokenizer

log = logging.getLogger(__name__)

FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def load_hf_tokenizer(path: Path) -> TokenizerWrapper:
    """Load the tokenizer of a Hugging Face / mlx-lm model directory with mlx-lm.

    Args:
        path: the model directory (``tokenizer.json`` or ``tokenizer.model``, configs).

    Returns:
        mlx-lm's ``TokenizerWrapper``, with the EOS ids mlx-lm's ``load`` gives it: those
        of ``generation_config.json`` (often a list) over those of ``config.json``.

    Raises:
        ModelNotFoundError: ``path`` is not a directory (nothing is downloaded here).
        ModelFormatError: the tokenizer files cannot be read.
    """
    from mlx_lm.utils import load_config, load_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise ModelNotFoundError(f"model directory {str(path)!r} does not exist")
    eos = None
    config = path / "config.json"
    try:
        if config.is_file():  # load_config lets generation_config.json's eos ids win, as transformers does
            eos = load_config(path).get("eos_token_id")
        wrapper = load_tokenizer(path, eos_token_ids=eos)
    except Exception as e:  # tokenizers and transformers raise many kinds for a broken file
        raise ModelFormatError(f"cannot load the tokenizer in {str(path)!r}: {e}") from e
    # Swap in the exact versions of mlx-lm's streaming detokenizers (see their docstrings).
    detokenizer = wrapper._detokenizer
    if type(detokenizer) is BPEStreamingDetokenizer:
        wrapper._detokenizer = ByteLevelDetokenizer(hf_tokenizer(wrapper))
    elif type(detokenizer) is SPMStreamingDetokenizer:
        trim = detokenizer.trim_space
        wrapper._detokenizer = SentencePieceDetokenizer(hf_tokenizer(wrapper), trim_space=trim)
    return wrapper


def encode_chat(tokenizer: Any, messages: list[dict], add_generation_prompt: bool = True,
                tools: Any = None, think: bool | None = None) -> list[int]:
    """Token ids of a conversation rendered with the model's chat template.

    Args:
        tokenizer: a ``TokenizerWrapper`` (or HF tokenizer).
        messages: ``[{"role": ..., "content": ...}, ...]``.
        add_generation_prompt: end with the assistant's turn opener (default True).
        tools: OpenAI-shaped tools the template shows the model (None: none).
        think: False turns thinking off through the template's ``enable_thinking`` switch,
            when it reads one (None/True: the template's default).

    Returns:
        The prompt's token ids, BOS first if the model wants it.
    """
    kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
    if tools:
        kwargs["tools"] = list(tools)
    if think is False:  # mlx-lm's wrapper passes it under the template's own name for it
        kwargs["enable_thinking"] = False
    has_template = getattr(tokenizer, "has_chat_template", None)  # a TokenizerWrapper knows
    if has_template is None:
        has_template = getattr(tokenizer, "chat_template", None) is not None
    if not has_template:
        kwargs["chat_template"] = FALLBACK_CHAT_TEMPLATE
    typed = _with_special_strings(tokenizer, messages)
    if typed:
        ids = _encode_plain_contents(tokenizer, messages, typed, kwargs)
        if ids is not None:
            return _with_bos(tokenizer, ids)
    text = tokenizer.apply_chat_template(messages, **kwargs)
    return _with_bos(tokenizer, tokenizer.encode(text, add_special_tokens=False))


def vocab_size(tokenizer: Any) -> int:
    """Token ids ``tokenizer`` (a ``TokenizerWrapper`` or HF tokenizer) knows, added tokens included."""
    return len(hf_tokenizer(tokenizer))


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's ``TokenizerWrapper`` (which has no public
    name for it), or ``tokenizer`` itself."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def _special_strings(tokenizer: Any) -> tuple[str, ...]:
    hf = hf_tokenizer(tokenizer)
    added = getattr(hf, "added_tokens_decoder", None) or {}
    return tuple(str(getattr(t, "content", t)) for t in added.values() if str(getattr(t, "content", t)))


def _with_special_strings(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Indices of the messages whose text contains a special-token string."""
    specials = _special_strings(tokenizer)
    return [
        i for i, m in enumerate(messages)
        if isinstance(m.get("content"), str) and any(s in m["content"] for s in specials)
    ]


def _encode_plain_contents(tokenizer: Any, messages: list[dict], typed: list[int], kwargs: dict) -> list[int] | None:
    """Token ids of the chat with the text of messages ``typed`` encoded as plain text.

    The template is rendered with a marker in place of each such text; the template's
    pieces are encoded with special tokens, the texts with them split. None when the
    template altered a marker (it rewrites message text): the caller encodes as usual.
    """
    marks = {i: f"\ue000{i}\ue001" for i in typed}  # private-use characters: no template touches them
    shown = [dict(m, content=marks[i]) if i in marks else m for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(shown, **kwargs)
    if any(text.count(mark) != 1 for mark in marks.values()):
        log.warning("chat template rewrites message text: special-token strings in it stay special")
        return None
    ids: list[int] = []
    pos = 0
    for i in typed:
        at = text.index(marks[i], pos)
        ids += tokenizer.encode(text[pos:at], add_special_tokens=False)
        try:
            ids += tokenizer.encode(messages[i]["content"], add_special_tokens=False, split_special_tokens=True)
        except TypeError:  # a tokenizer without the switch
            return None
        pos = at + len(marks[i])
    return ids + tokenizer.encode(text[pos:], add_special_tokens=False)


def encode_raw(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as is, without a chat template.

    Args:
        tokenizer: a ``TokenizerWrapper`` (or HF tokenizer).
        text: the prompt; special tokens written in it are kept whole.

    Returns:
        The token ids, BOS first only if the model wants it (never an EOS).
    """
    return _with_bos(tokenizer, tokenizer.encode(text, add_special_tokens=False))


def _with_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or (ids and ids[0] == bos):
        return list(ids)
    # Whether the model wants BOS is what its own post-processor does to a plain text.
    with_special = tokenizer.encode("a", add_special_tokens=True)
    wants = with_special[:1] == [bos] and tokenizer.encode("a", add_special_tokens=False)[:1] != [bos]
    return [bos, *ids] if wants else list(ids)


__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "encode_chat",
    "encode_raw",
    "hf_tokenizer",
    "load_gguf_tokenizer",
    "load_hf_tokenizer",
    "vocab_size",
]
