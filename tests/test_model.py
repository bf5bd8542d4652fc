"""Our llama-family model on tiny random weights: caching, GGUF round trip."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlotspark.models import loader
from mlotspark.models.formats import gguf
from mlotspark.errors import ModelFormatError
from mlotspark.models.hub.catalogue import ModelSource
from tiny import tiny_model, write_tiny_gguf


@pytest.mark.parametrize("variant", [{}, {"model_type": "qwen2", "rope_traditional": False},
                                     {"model_type": "qwen3", "tie_word_embeddings": False}])
def test_incremental_decoding_matches_full_forward(variant):
    model = tiny_model(**variant)
    tokens = mx.array([[5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11, 12]])
    full = model(tokens)  # (1, 12, V), no cache
    cache = model.make_cache()
    parts = [model(tokens[:, :5], cache)]  # a 5-token prefill, then one token at a time
    for i in range(5, tokens.shape[1]):
        parts.append(model(tokens[:, i : i + 1], cache))
    incremental = mx.concatenate(parts, axis=1)
    assert cache[0].offset == tokens.shape[1]
    assert mx.allclose(incremental, full, atol=1e-4).item()


def test_tiny_gguf_round_trips_through_the_loader(tmp_path):
    model = tiny_model(seed=3)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", model)
    loaded = loader.load(ModelSource(name="tiny", kind="gguf", path=path), weights="float32")
    assert loaded.weights == "float32"
    assert loaded.context_length == 512
    assert loaded.config["rope_traditional"] is True
    tokens = mx.array([[1, 2, 3, 40, 50, 60]])
    assert mx.allclose(loaded.model(tokens), model(tokens), atol=1e-5).item()
    # The byte-level vocabulary came with it.
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("hi there")) == "hi there"


def test_gguf_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        gguf.read_gguf(bad)
    good = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model())
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ModelFormatError, match="cut.gguf"):
        gguf.read_gguf(cut)
    with pytest.raises(ModelFormatError, match="unsupported GGUF architecture 'falcon'"):
        gguf.gguf_config({"general.architecture": "falcon"}, {})


def test_weight_formats_are_honoured(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model())
    src = ModelSource(name="tiny", kind="gguf", path=path)
    for fmt, dtype in (("float16", mx.float16), ("bfloat16", mx.bfloat16)):
        loaded = loader.load(src, weights=fmt)
        assert loaded.weights == fmt
        assert loaded.model.model.layers[0].mlp.up_proj.weight.dtype == dtype
    q = loader.load(src, weights="quantized")
    assert q.weights == "quantized"
    from mlotspark.errors import OptionError

    with pytest.raises(OptionError, match="invalid weights 'int3'"):
        loader.load(src, weights="int3")
