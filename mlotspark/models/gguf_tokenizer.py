"""A GGUF file's vocabulary rebuilt as a tokenizer (``load_gguf_tokenizer``).

A GGUF file carries no ``tokenizer.json``: its vocabulary lives in metadata under
llama.cpp's key names. ``load_gguf_tokenizer`` rebuilds it with the ``tokenizers``
library so it behaves as llama.cpp tokenizes it, and wraps it like a tokenizer loaded
from a Hugging Face directory (``encode``, ``decode``, ``apply_chat_template``,
``eos_token_ids``, a streaming ``detokenizer``):

- ``tokenizer.ggml.model = "gpt2"``: byte-level BPE from ``tokens`` + ``merges``; the
  text is split first with llama.cpp's regexes for ``tokenizer.ggml.pre``.
- ``tokenizer.ggml.model = "llama"``: a SentencePiece vocabulary (tokens, scores,
  types), merged by score as SentencePiece and llama.cpp do, with byte fallback to
  the ``<0xNN>`` tokens.

Tokens typed control (3), user-defined (4) or unknown (2) are matched whole in text,
as llama.cpp does when it parses special tokens, so ``"<|im_start|>"`` is one token.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from transformers import PreTrainedTokenizerFast

from mlotspark import storage
from mlotspark.errors import ModelFormatError
from mlotspark.models.detokenizers import ByteLevelDetokenizer, SentencePieceDetokenizer

log = logging.getLogger(__name__)

# llama.cpp's token types (gguf-py TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer splits, copied from llama.cpp (src/llama-vocab.cpp, llm_tokenizer_bpe):
# each regex in turn cuts every piece into matches and the gaps between them.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
_DIGITS_THEN_GPT2 = [r"\p{N}", _GPT2]

_PRE_SPLITS: dict[str, list[str]] = {
    "default": _DEFAULT,
    **dict.fromkeys(["gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "gigachat"], [_GPT2]),
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        _DIGITS_THEN_GPT2,
    ),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"], [_LLAMA3]),
    **dict.fromkeys(["qwen2", "stablelm2", "megrez", "deepseek-r1-qwen"], [_QWEN2]),
    "falcon": [
        r"[\p{P}\$\+<=>\^~\|`]+",
        _GPT2,
        r"[0-9][0-9][0-9]",
    ],
}
# llama.cpp looks a whole pre-token up in the vocabulary before merging for these, and
# adds BOS unless the file says otherwise.
_LLAMA3_LIKE = {"llama3", "llama-v3", "llama-bpe", "falcon3"}

# Token texts llama.cpp treats as end of generation, whatever the file's eos id says.
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"}


def load_gguf_tokenizer(metadata: dict[str, Any], cache: Path | None = None) -> TokenizerWrapper:
    """Build the tokenizer a GGUF file describes.

    Args:
        metadata: GGUF metadata as returned by ``mx.load(path, return_metadata=True)``.
        cache: a ``tokenizer.json`` path: when it exists, transformers reads the built
            tokenizer from it; else it is written there. Deriving the merges of a
            262k-token SentencePiece vocabulary, then handing transformers a
            ``Tokenizer`` object (which it deep-copies), takes seconds each.

    Returns:
        An mlx-lm ``TokenizerWrapper`` around a ``PreTrainedTokenizerFast``.

    Raises:
        ModelFormatError: the vocabulary is missing, malformed or of an unsupported kind.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ModelFormatError(
            f"GGUF tokenizer.ggml.tokens must be a non-empty list of strings, got {_brief(tokens)}"
        )
    types = _per_token(metadata, "tokenizer.ggml.token_type", len(tokens), int) or [NORMAL] * len(tokens)

    cached = cache is not None and Path(cache).is_file()
    if kind == "gpt2":
        pre = metadata.get("tokenizer.ggml.pre")
        backend = None if cached else _byte_level_bpe(tokens, types, metadata.get("tokenizer.ggml.merges"), pre)
        add_bos_default = pre in _LLAMA3_LIKE
        detokenizer: Any = partial(ByteLevelDetokenizer, tokens=tokens)
        defaults = {}
    elif kind == "llama":
        scores = _per_token(metadata, "tokenizer.ggml.scores", len(tokens), float)
        if scores is None:
            raise ModelFormatError("GGUF SentencePiece vocabulary has no tokenizer.ggml.scores")
        space_prefix = _scalar(metadata, "tokenizer.ggml.add_space_prefix", bool, True)
        backend = None if cached else _sentencepiece_bpe(tokens, types, scores, space_prefix)
        add_bos_default = True
        detokenizer = partial(SentencePieceDetokenizer, trim_space=space_prefix, tokens=tokens)
        defaults = {"bos": 1, "eos": 2, "unk": 0}  # llama.cpp's defaults for this kind
    else:
        raise ModelFormatError(
            f"unsupported GGUF tokenizer.ggml.model {kind!r}: mlotspark reads 'gpt2' (byte-level BPE) "
            "and 'llama' (SentencePiece) vocabularies"
        )

    ids = _special_ids(metadata, len(tokens), defaults)
    names = {name: tokens[ids[name]] for name in ("bos", "eos", "unk", "pad") if ids[name] is not None}
    add_bos = _scalar(metadata, "tokenizer.ggml.add_bos_token", bool, add_bos_default) and "bos" in names
    add_eos = _scalar(metadata, "tokenizer.ggml.add_eos_token", bool, False) and "eos" in names
    if backend is not None:
        # Set on the backend too, so BOS/EOS do not hang on how a transformers version reads add_bos_token.
        backend.post_processor = _post_processor(
            (names["bos"], ids["bos"]) if add_bos else None, (names["eos"], ids["eos"]) if add_eos else None
        )
        if cache is not None:
            _write_backend(backend, cache)

    template = metadata.get("tokenizer.chat_template")
    settings = dict(
        **{f"{name}_token": token for name, token in names.items()},
        chat_template=template if isinstance(template, str) and template else None,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        # Exact round trips: llama.cpp's space clean-up would turn "a ,b" into "a, b".
        clean_up_tokenization_spaces=False,
    )
    hf = None
    if backend is None:
        try:
            hf = PreTrainedTokenizerFast(tokenizer_file=str(cache), **settings)
        except Exception as e:  # a damaged cache file: build the vocabulary again
            log.warning("ignoring cached tokenizer %s: %s", cache, e)
            Path(cache).unlink(missing_ok=True)
            return load_gguf_tokenizer(metadata, cache)
    if hf is None:
        hf = PreTrainedTokenizerFast(tokenizer_object=backend, **settings)
    eog = {ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None}
    eog |= {i for i, t in enumerate(tokens) if t in _EOG_TEXTS}
    # mlx-lm's wrapper looks for thinking markers in get_vocab(), twice; for a 262k-token
    # vocabulary each call builds a fresh dict in Rust (~0.2 s). The GGUF's own list gives
    # the same membership answers, built once.
    vocab = _vocab(tokens)
    hf.get_vocab = lambda: vocab
    try:
        return TokenizerWrapper(hf, detokenizer, eos_token_ids=sorted(eog))
    finally:
        del hf.get_vocab


def _write_backend(backend: Tokenizer, path: Path) -> None:
    try:
        with storage.atomic_path(Path(path)) as tmp:
            backend.save(str(tmp))
    except Exception as e:  # a cache that cannot be written only costs time next load
        log.warning("cannot cache tokenizer at %s: %s", path, e)


def _byte_level_bpe(tokens: list[str], types: list[int], merges: Any, pre: Any) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) with llama.cpp's pre-tokenizer for ``pre``."""
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise ModelFormatError(
            f"GGUF byte-level BPE needs tokenizer.ggml.merges as strings, got {_brief(merges)}"
        )
    pairs = []
    for m in merges:
        cut = m.find(" ", 1)  # as llama.cpp: the first space after the first character
        if cut < 0:
            raise ModelFormatError(f"GGUF merge {m!r} is not two tokens separated by a space")
        pairs.append((m[:cut], m[cut + 1 :]))
    if pre is None:
        log.warning("GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' splits, which may hurt")
        pre = "default"
    splits = _PRE_SPLITS.get(pre)
    if splits is None:
        log.warning("unknown GGUF pre-tokenizer %r; splitting text as GPT-2 does", pre)
        splits = [_GPT2]
    try:
        backend = Tokenizer(
            models.BPE(vocab=_vocab(tokens), merges=pairs, ignore_merges=pre in _LLAMA3_LIKE)
        )
    except Exception as e:  # tokenizers raises a bare Exception for a merge outside the vocabulary
        raise ModelFormatError(f"GGUF byte-level BPE vocabulary is inconsistent: {e}") from e
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    _add_special(backend, tokens, types)
    return backend


def _sentencepiece_bpe(
    tokens: list[str], types: list[int], scores: list[float], space_prefix: bool
) -> Tokenizer:
    """A SentencePiece vocabulary as a ``tokenizers`` BPE with byte fallback.

    SentencePiece (and llama.cpp) repeatedly merge the adjacent pair whose union is the
    best-scoring normal piece; BPE merges ranked by that score do the same. The merges
    come from transformers' ``generate_merges``, which HF uses for such vocabularies.
    """
    from transformers.tokenization_utils_base import generate_merges

    vocab = _vocab(tokens)
    normal = {t: s for t, s, ty in zip(tokens, scores, types) if ty == NORMAL}
    others = [t for t, ty in zip(tokens, types) if ty != NORMAL]
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    if unk is None and "<unk>" in vocab:
        unk = "<unk>"
    backend = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=generate_merges(vocab, normal, skip_tokens=others),
            unk_token=unk,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    # A normalizer (not Metaspace) so that, like SentencePiece and llama.cpp, every text
    # piece gets its "▁" even when it already starts with a space.
    steps = [normalizers.Prepend("▁")] if space_prefix else []
    backend.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    tail = [decoders.Strip(content=" ", left=1, right=0)] if space_prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()] + tail
    )
    _add_special(backend, tokens, types)
    return backend


def _post_processor(
    bos: tuple[str, int] | None, eos: tuple[str, int] | None
) -> processors.TemplateProcessing:
    """What ``encode(add_special_tokens=True)`` adds around a text: BOS and/or EOS."""
    single = " ".join(([f"{bos[0]}:0"] if bos else []) + ["$A:0"] + ([f"{eos[0]}:0"] if eos else []))
    return processors.TemplateProcessing(single=single, special_tokens=[t for t in (bos, eos) if t])


def _add_special(backend: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Match control/unknown tokens (as special) and user-defined ones whole in text."""

    def added(kinds: tuple[int, ...], special: bool) -> list[AddedToken]:
        chosen = [t for t, ty in zip(tokens, types) if t and ty in kinds]
        return [AddedToken(t, special=special, normalized=False) for t in chosen]

    backend.add_special_tokens(added((CONTROL, UNKNOWN), special=True))
    backend.add_tokens(added((USER_DEFINED,), special=False))


# ----------------------------------------------------------------------------- metadata


_SPECIAL_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "pad": "tokenizer.ggml.padding_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}


def _special_ids(metadata: dict[str, Any], n: int, defaults: dict[str, int]) -> dict[str, int | None]:
    ids = {name: _scalar(metadata, key, int, defaults.get(name)) for name, key in _SPECIAL_KEYS.items()}
    for name, token_id in ids.items():
        if token_id is not None and not 0 <= token_id < n:
            raise ModelFormatError(f"GGUF {_SPECIAL_KEYS[name]} {token_id} is outside the vocabulary ({n})")
    return ids


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)  # a duplicate keeps its first id, as lookups by text would
    return vocab


def _to_python(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _scalar(metadata: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = _to_python(metadata.get(key))
    if value is None:
        return default
    if isinstance(value, list) or not isinstance(value, (bool, int, float)):
        raise ModelFormatError(f"GGUF {key} must be a number, got {_brief(value)}")
    return kind(value)


def _per_token(metadata: dict[str, Any], key: str, n: int, kind: type) -> list | None:
    value = _to_python(metadata.get(key))
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise ModelFormatError(f"GGUF {key} must hold one value per token ({n}), got {_brief(value)}")
    return [kind(v) for v in value]


def _brief(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return repr(value)[:80]


__all__ = ["load_gguf_tokenizer"]
