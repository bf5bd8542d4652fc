"""Tokenizers: the default model's GGUF vocabulary (byte-level BPE, ChatML), a
SentencePiece vocabulary trained here and read back as GGUF metadata, HF directories,
and streaming detokenization that never emits half a character."""

from __future__ import annotations

import io
import logging
import random

import pytest

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before mlx)
import mlx.core as mx
import sentencepiece as spm

from mlotspark.errors import ModelFormatError, ModelNotFoundError
from mlotspark.models.tokenizer import (
    encode_chat,
    encode_raw,
    load_gguf_tokenizer,
    load_hf_tokenizer,
)

MIXED = "Héllo wörld, café naïve — 👋🇫🇷 世界 日本語のテキスト 12345 and 2024-11-22."
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
CHATML_FRANCE = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def stream(tokenizer, ids: list[int]) -> list[str]:
    """The pieces a streaming detokenizer hands out, one per token, then the flush."""
    detok = tokenizer.detokenizer
    pieces = []
    for i in ids:
        detok.add_token(i)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    return pieces


# ----------------------------------------------------------------------------- default model


@pytest.fixture(scope="module")
def smol_meta(default_gguf) -> dict:
    _, meta = mx.load(str(default_gguf), return_metadata=True)
    return meta


@pytest.fixture(scope="module")
def smol(smol_meta):
    return load_gguf_tokenizer(smol_meta)


@pytest.mark.parametrize(
    "text",
    [MIXED, "  two leading spaces\n\n\ttabs\r\n", "a\x00b", "ÅÄÖ ßẞ ñ ç ø", "🧑‍🚀 family 👨‍👩‍👧"],
)
def test_default_round_trip(smol, text):
    ids = encode_raw(smol, text)
    assert smol.decode(ids) == text


def test_default_special_tokens_are_single(smol):
    assert encode_raw(smol, "<|im_start|>") == [1]
    assert encode_raw(smol, "<|im_end|>") == [2]
    assert encode_raw(smol, "x<|im_start|>user")[1] == 1
    # The model adds no BOS in raw mode (tokenizer.ggml.add_bos_token = false).
    assert encode_raw(smol, "Hello")[0] != smol.bos_token_id


def test_default_digits_split_one_by_one(smol):
    ids = encode_raw(smol, "12345")
    assert [smol.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]
    assert [smol.decode([i]) for i in encode_raw(smol, "year 2024")][-4:] == ["2", "0", "2", "4"]


def test_default_chat_template_renders_chatml(smol):
    text = smol.apply_chat_template(FRANCE, add_generation_prompt=True, tokenize=False)
    assert text == CHATML_FRANCE
    ids = encode_chat(smol, FRANCE)
    assert smol.decode(ids) == CHATML_FRANCE
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # markers are single tokens
    assert len(ids) == 37  # the prompt llama.cpp tokenizes to 37 tokens (DESIGN §7)
    no_prompt = encode_chat(smol, FRANCE, add_generation_prompt=False)
    assert smol.decode(no_prompt) == CHATML_FRANCE.removesuffix("<|im_start|>assistant\n")


def test_default_eos_ids(smol):
    assert 2 in smol.eos_token_ids  # <|im_end|> ends a reply
    assert smol.eos_token_id == 2


def test_default_streaming_never_splits_a_character(smol):
    text = "Paris 🗼 est la capitale. 北京是中国的首都。 Ünïcödé 👨‍👩‍👧 ok"
    ids = smol.encode(text, add_special_tokens=False)
    pieces = stream(smol, ids)
    assert "".join(pieces) == smol.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    # Some character really was split across byte tokens, and held back meanwhile.
    assert any(smol.decode([i]).endswith("\ufffd") for i in ids)
    assert "" in pieces[:-1]


def test_default_streaming_is_exact_for_random_text(smol):
    rng = random.Random(7)
    # ASCII, Latin-1 and Extended-A, CJK, emoji, kana, Hangul
    blocks = [(0x20, 0x7E), (0xC0, 0x17F), (0x4E00, 0x9FFF), (0x1F300, 0x1F6FF), (0x3040, 0x30FF)]
    blocks.append((0xAC00, 0xD7A3))
    for _ in range(40):
        text = "".join(chr(rng.randint(*rng.choice(blocks))) for _ in range(rng.randint(1, 25)))
        text = rng.choice(["", " ", "  "]) + text  # a reply may start with spaces
        ids = smol.encode(text, add_special_tokens=False)
        pieces = stream(smol, ids)
        assert "".join(pieces) == text, text
        assert not any("\ufffd" in p for p in pieces), text


def test_default_streaming_keeps_leading_space_of_completion(smol):
    # A raw completion " Paris" must not glue onto its prompt "The capital is".
    ids = smol.encode(" Paris.", add_special_tokens=False)
    assert "".join(stream(smol, ids)) == " Paris."


def test_missing_chat_template_uses_fallback(smol_meta):
    meta = {k: v for k, v in smol_meta.items() if k != "tokenizer.chat_template"}
    tok = load_gguf_tokenizer(meta)
    ids = encode_chat(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert tok.decode(ids) == "System: Be brief.\n\nUser: Hi\n\nAssistant:"


# ----------------------------------------------------------------------------- pre-tokenizers


def _tiny_byte_level(pre: str | None) -> dict:
    """A byte-level vocabulary of the 256 byte symbols plus a few merges."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokens = ["<|endoftext|>", *sorted(alphabet), "12", "123", "Ġa"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["1 2", "12 3", "Ġ a"],
        "tokenizer.ggml.token_type": mx.array([3] + [1] * (len(tokens) - 1), dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": mx.array(0, dtype=mx.uint32),
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    return meta


@pytest.mark.parametrize(
    "pre, pieces",
    [
        ("smollm", ["1", "2", "3", "4", "5", " a", "!!"]),
        ("qwen2", ["1", "2", "3", "4", "5", " a", "!!"]),
        ("llama-bpe", ["123", "45", " a", "!!"]),
        ("gpt-2", ["12345", " a", "!!"]),
        ("default", ["123", "45", " a", "!!"]),
    ],
)
def test_pre_tokenizer_splits_like_llama_cpp(pre, pieces):
    tok = load_gguf_tokenizer(_tiny_byte_level(pre))
    ids = tok.encode("12345 a!!", add_special_tokens=False)
    assert tok.decode(ids) == "12345 a!!"
    split = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("12345 a!!")
    assert [tok.convert_tokens_to_string([p]) for p, _ in split] == pieces


def test_llama3_pre_tokenizer_adds_bos_by_default():
    meta = _tiny_byte_level("llama-bpe")
    meta["tokenizer.ggml.bos_token_id"] = mx.array(0, dtype=mx.uint32)
    tok = load_gguf_tokenizer(meta)
    assert encode_raw(tok, "12") == [0, tok.convert_tokens_to_ids("12")]


def test_added_tokens_match_whole_and_stream_as_text():
    meta = _tiny_byte_level("qwen2")
    tokens = [*meta["tokenizer.ggml.tokens"], "<｜User｜>", "<think>", "héllo wörld"]
    meta["tokenizer.ggml.tokens"] = tokens
    meta["tokenizer.ggml.token_type"] = mx.array([3] + [1] * (len(tokens) - 4) + [3, 4, 4], dtype=mx.int32)
    tok = load_gguf_tokenizer(meta)
    text = "a<｜User｜>b<think>héllo wörld 世"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[1:4] == [len(tokens) - 3, tok.convert_tokens_to_ids("b"), len(tokens) - 2]
    assert ids[4] == len(tokens) - 1
    assert "".join(stream(tok, ids)) == tok.decode(ids) == text
    # A stream cut inside a character after such a token still flushes (one U+FFFD, as decode).
    cut = ids[:2] + tok.encode("世", add_special_tokens=False)[:1]
    assert "".join(stream(tok, cut)) == tok.decode(cut) == "a<｜User｜>\ufffd"


def test_unknown_pre_tokenizer_warns_and_falls_back_to_gpt2(caplog):
    with caplog.at_level(logging.WARNING, logger="mlotspark.models.gguf_tokenizer"):
        tok = load_gguf_tokenizer(_tiny_byte_level("some-future-model"))
    assert "some-future-model" in caplog.text
    assert tok.decode(tok.encode("12345 a", add_special_tokens=False)) == "12345 a"


# ----------------------------------------------------------------------------- SentencePiece


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    """A tiny BPE SentencePiece model with byte fallback, trained on generated text."""
    rng = random.Random(0)
    words = "the quick brown fox jumps over lazy dog café naïve über straße river token memory".split()
    lines = [
        " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice([".", "!", "?", ""])
        + f" {rng.randint(0, 9999)}"
        for _ in range(400)
    ]
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        # As Llama's tokenizer.model: no normalization, spaces kept as written.
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_file=f"{prefix}.model"), lines


def _gguf_metadata(sp: spm.SentencePieceProcessor) -> dict:
    """The metadata llama.cpp's converter writes for a SentencePiece model."""
    n = sp.get_piece_size()

    def kind(i: int) -> int:  # gguf TokenType: 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
        for test, token_type in ((sp.is_unknown, 2), (sp.is_control, 3), (sp.is_unused, 5), (sp.is_byte, 6)):
            if test(i):
                return token_type
        return 1

    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": mx.array([sp.get_score(i) for i in range(n)], dtype=mx.float32),
        "tokenizer.ggml.token_type": mx.array([kind(i) for i in range(n)], dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(sp.bos_id(), dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(sp.eos_id(), dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(sp.unk_id(), dtype=mx.uint32),
        "tokenizer.ggml.add_bos_token": mx.array(True),
    }


@pytest.fixture(scope="module")
def sp_tok(sp_model):
    return load_gguf_tokenizer(_gguf_metadata(sp_model[0]))


def test_sentencepiece_encodes_like_sentencepiece(sp_model, sp_tok):
    sp, lines = sp_model
    extra = ["  two  spaces  ", "tab\tand\nnewline", " leading", "fox", "x" * 40, "Ünïcödé", ""]
    for text in lines[:150] + extra:
        assert sp_tok.encode(text, add_special_tokens=False) == sp.encode(text), text
        assert encode_raw(sp_tok, text) == [sp.bos_id(), *sp.encode(text)]
        assert sp_tok.decode(sp.encode(text)) == text


def test_sentencepiece_byte_fallback_round_trips_emoji(sp_model, sp_tok):
    sp, _ = sp_model
    text = "the fox 👋 saw 世界"
    ids = sp_tok.encode(text, add_special_tokens=False)
    assert ids == sp.encode(text)
    assert any(sp.is_byte(i) for i in ids)  # 👋 and 世界 are not in the vocabulary
    assert sp_tok.decode(ids) == text
    pieces = stream(sp_tok, ids)
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_sentencepiece_streaming_keeps_indentation(sp_tok):
    # Only the dummy-prefix space is dropped, as decode() drops it.
    for text in ["    indented", " one", "fox  \n  river"]:
        ids = sp_tok.encode(text, add_special_tokens=False)
        assert "".join(stream(sp_tok, ids)) == sp_tok.decode(ids) == text


def test_sentencepiece_specials_and_fallback_template(sp_model, sp_tok):
    sp, _ = sp_model
    assert sp_tok.encode("</s>", add_special_tokens=False) == [sp.eos_id()]
    assert sp.eos_id() in sp_tok.eos_token_ids
    ids = encode_chat(sp_tok, [{"role": "user", "content": "the fox"}])
    assert ids[0] == sp.bos_id() and ids.count(sp.bos_id()) == 1
    assert sp_tok.decode(ids[1:]) == "User: the fox\n\nAssistant:"


# ----------------------------------------------------------------------------- errors, HF directories


def test_unsupported_tokenizer_model_is_named():
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    with pytest.raises(ModelFormatError, match="'bert'"):
        load_gguf_tokenizer(meta)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"tokenizer.ggml.merges": None}, "merges"),
        ({"tokenizer.ggml.merges": ["1 2", "x y"]}, "inconsistent"),
        ({"tokenizer.ggml.eos_token_id": mx.array(9999, dtype=mx.uint32)}, "9999"),
        ({"tokenizer.ggml.token_type": mx.array([1, 1], dtype=mx.int32)}, "token_type"),
        ({"tokenizer.ggml.tokens": []}, "tokens"),
    ],
)
def test_bad_vocabulary_raises_naming_the_value(change, named):
    meta = {**_tiny_byte_level("gpt-2"), **change}
    with pytest.raises(ModelFormatError, match=named):
        load_gguf_tokenizer(meta)


def test_hf_directory_tokenizer(smol, tmp_path):
    smol._tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"eos_token_id": 2}')
    tok = load_hf_tokenizer(tmp_path)
    assert encode_chat(tok, FRANCE) == encode_chat(smol, FRANCE)
    assert encode_raw(tok, MIXED) == encode_raw(smol, MIXED)
    assert 2 in tok.eos_token_ids
    ids = tok.encode(" " + MIXED, add_special_tokens=False)
    assert "".join(stream(tok, ids)) == " " + MIXED


def test_hf_directory_errors(tmp_path):
    with pytest.raises(ModelNotFoundError):
        load_hf_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="tokenizer"):
        load_hf_tokenizer(tmp_path)
