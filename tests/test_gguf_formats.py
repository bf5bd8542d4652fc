"""Every common GGUF quantization loads; gemma3 / phi3 / Llama 3 RoPE from GGUF; the
conversion cache; bad files fail with one line naming the file and the culprit."""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGUFReader
from mlx_lm.utils import _get_classes

from mlotspark.cli.entry import main
from mlotspark.errors import ModelFormatError
from mlotspark.models import llama, loader
from mlotspark.models.formats import gguf, gguf_convert
from mlotspark.models.hub.catalogue import ModelSource
from tiny_gguf import HAND_PACKED, QUANTIZABLE, write_tiny

TOKENS = mx.array([[5, 40, 41, 42, 100, 7, 250, 3]])


def _source(path):
    return ModelSource(name=path.stem, kind="gguf", path=path)


def _reference(path, reference: dict[str, np.ndarray]) -> nn.Module:
    """The same model built straight from gguf-py's dequantized float32 tensors."""
    reader = GGUFReader(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arrays = {k: mx.array(v) for k, v in reference.items()}
    config = gguf.gguf_config(meta, arrays)
    weights = gguf.map_weight_names(arrays, meta["general.architecture"])
    spec = gguf.ARCHITECTURES[meta["general.architecture"]]
    if spec.ours:
        model = llama.Model(llama.ModelArgs.from_dict(config))
    else:  # mlx-lm's own class: the yardstick for architectures we do not implement
        cls, args_cls = _get_classes(config)
        model = cls(args_cls.from_dict(config))
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    return model


def _close(a: mx.array, b: mx.array, rel: float) -> bool:
    scale = float(mx.abs(b).max().item())
    return float(mx.abs(a - b).max().item()) <= rel * max(scale, 1.0)


@pytest.mark.parametrize("qtype", QUANTIZABLE + HAND_PACKED)
def test_every_quantization_loads_with_float_logits(tmp_path, qtype):
    path, ref = write_tiny(tmp_path / f"tiny-{qtype}.gguf", "llama", qtype)
    loaded = loader.load(_source(path), weights="float32")
    assert loaded.weights == "float32"
    assert loaded.extra["gguf_types"].get(qtype, 0) > 0 or qtype == "F32"
    # float16 cache of quantized values: ~1e-3 relative
    assert _close(loaded.model(TOKENS), _reference(path, ref)(TOKENS), 1e-2)
    # one line per stored format says how it runs
    assert loaded.extra["weight_formats"][qtype].startswith("float32")


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_other_architectures_match_mlx_lm(tmp_path, arch):
    path, ref = write_tiny(tmp_path / f"tiny-{arch}.gguf", arch, "Q4_K")
    loaded = loader.load(_source(path), weights="float32")
    assert loaded.supports_cascade is False
    assert loaded.config["model_type"] == {"gemma3": "gemma3_text", "phi3": "phi3"}[arch]
    assert _close(loaded.model(TOKENS), _reference(path, ref)(TOKENS), 1e-2)


def test_gemma3_norms_are_shifted_back(tmp_path):
    """llama.cpp stores gemma norms as 1 + w; mlx-lm's gemma RMSNorm adds the 1 itself."""
    path, ref = write_tiny(tmp_path / "g.gguf", "gemma3", "Q8_0")
    loaded = loader.load(_source(path), weights="float32")
    got = loaded.model.model.layers[0].input_layernorm.weight
    assert mx.allclose(got, mx.array(ref["blk.0.attn_norm.weight"]) - 1, atol=1e-6).item()
    assert loaded.config["sliding_window"] == 4 and loaded.config["sliding_window_pattern"] == 6


def test_llama3_rope_freqs_tensor_matches_mlx_lm_llama3_scaling(tmp_path):
    """llama.cpp bakes `rope_scaling: llama3` into a rope_freqs tensor; our RoPE from
    it equals mlx-lm's Llama3RoPE from the HF config."""
    from mlx_lm.models.rope_utils import initialize_rope

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    dims, base = 64, 500000.0
    # llama.cpp's convert_hf_to_gguf LlamaModel.generate_extra_tensors
    freqs = 1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float32) / dims))
    low_wl = 64 / 1.0
    high_wl = 64 / 4.0
    factors = []
    for f in freqs:
        wl = 2 * np.pi / f
        if wl < high_wl:
            factors.append(1.0)
        elif wl > low_wl:
            factors.append(8.0)
        else:
            smooth = (64 / wl - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 8.0 + smooth))
    ours = llama.FactorRoPE(dims, False, base, factors)
    theirs = initialize_rope(dims, base, False, scaling, 131072)
    x = mx.random.normal((1, 2, 300, dims))
    assert mx.allclose(ours(x, offset=5), theirs(x, offset=5), atol=1e-4).item()


def test_quantized_weights_requantize_k_quants(tmp_path):
    """The Metal rule, asked for explicitly on the CPU: Q4_K -> 4-bit, Q6_K -> 8-bit."""
    for qtype, bits in (("Q4_K", 4), ("Q6_K", 8)):
        path, ref = write_tiny(tmp_path / f"q-{qtype}.gguf", "llama", qtype)
        loaded = loader.load(_source(path), weights="quantized")
        assert loaded.weights == "quantized"
        proj = loaded.model.model.layers[0].self_attn.q_proj
        assert isinstance(proj, nn.QuantizedLinear) and proj.bits == bits and proj.group_size == 32
        assert f"{bits}-bit" in loaded.extra["weight_formats"][qtype]
        assert loaded.extra["weight_formats"]["F32"] == "bfloat16"
        got, want = loaded.model(TOKENS).astype(mx.float32), _reference(path, ref)(TOKENS)
        # bfloat16 activations and group-32 affine steps on random (unsmooth) weights:
        # close in direction, not to the digit
        cos = (got * want).sum(-1) / (mx.linalg.norm(got, axis=-1) * mx.linalg.norm(want, axis=-1))
        assert float(cos.min().item()) > 0.97, cos


def test_conversion_is_cached_and_redone_when_the_file_changes(tmp_path):
    path, _ = write_tiny(tmp_path / "c.gguf", "llama", "Q5_K")
    first = loader.load(_source(path), weights="float32")
    load = first.extra["load"]
    assert {k: load[k] for k in ("reader", "from_cache")} == {"reader": "gguf", "from_cache": False}
    assert set(load["phases"]) == {"read", "widen", "tokenizer", "materialize"}  # where the seconds went
    assert load["seconds_total"] >= load["phases"]["read"] + load["phases"]["widen"] and load["seconds"] >= 0
    second = loader.load(_source(path), weights="float32")
    assert second.extra["load"]["from_cache"] is True
    assert mx.array_equal(first.model(TOKENS), second.model(TOKENS)).item()
    text = "hi there, 12 <|im_end|> ok"
    assert second.tokenizer.encode(text) == first.tokenizer.encode(text)  # the cached vocabulary
    assert second.tokenizer.decode(second.tokenizer.encode(text)) == text
    entry = gguf_convert.cache_dir(path)
    assert (entry / "tensors.safetensors").is_file() and gguf_convert.tokenizer_cache(path).is_file()
    # a new file under the same name: converted again, not served stale
    write_tiny(path, "llama", "Q5_K", seed=1)
    os.utime(path, ns=(1, 1))
    third = loader.load(_source(path), weights="float32")
    assert third.extra["load"]["from_cache"] is False
    assert not mx.array_equal(first.model(TOKENS), third.model(TOKENS)).item()


def test_a_fresh_cache_entry_is_read_without_the_gguf_again(tmp_path, monkeypatch):
    """Second load: no header check and no failing ``mx.load`` of the GGUF (the entry was
    written from this file after both); the streaming detokenizer's token map, built
    from the GGUF vocabulary, is the one mlx-lm builds from ``convert_ids_to_tokens``."""
    path, _ = write_tiny(tmp_path / "s.gguf", "llama", "Q4_K")
    first = loader.load(_source(path), weights="float32")

    def read_again(*_a, **_k):
        raise AssertionError("the GGUF was read again on a cache hit")

    real_load = mx.load
    monkeypatch.setattr(gguf, "check_gguf", read_again)
    monkeypatch.setattr(mx, "load", lambda p, *a, **k: read_again() if str(p).endswith(".gguf") else real_load(p, *a, **k))
    second = loader.load(_source(path), weights="float32")
    assert second.extra["load"]["from_cache"] is True
    assert mx.array_equal(first.model(TOKENS), second.model(TOKENS)).item()
    detok = second.tokenizer.detokenizer
    hf = second.tokenizer._tokenizer
    rebuilt = type(detok)(hf) if not hasattr(detok, "trim_space") else type(detok)(hf, trim_space=detok.trim_space)
    assert detok.tokenmap == rebuilt.tokenmap and len(detok.tokenmap) == len(hf)
    text = "hi there, 12 <|im_end|> ok"
    ids = second.tokenizer.encode(text)
    detok.reset()
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    assert detok.text == second.tokenizer.decode(ids)


def test_mlx_native_files_keep_the_fast_path(tmp_path):
    path, _ = write_tiny(tmp_path / "n.gguf", "llama", "Q8_0")
    loaded = loader.load(_source(path), weights="quantized")
    assert loaded.extra["load"]["reader"] == "mlx"
    assert loaded.extra["weight_formats"]["Q8_0"] == "MLX affine 8-bit (as stored, group 32)"


# ------------------------------------------------------------------ bad input


def _cli(capsys, path):
    code = main(["generate", "-m", str(path), "--max-tokens", "2", "-p", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _patch_type(path, tensor: str, type_id: int) -> None:
    """Overwrite the GGML type id in ``tensor``'s header entry."""
    reader = GGUFReader(path)
    t = next(t for t in reader.tensors if t.name == tensor)
    f = t.field
    offset = f.offset + sum(int(p.nbytes) for p in f.parts[:4])  # name_len, name, n_dims, dims
    del reader
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(np.uint32(type_id).tobytes())


def test_unknown_quantization_type_is_named(tmp_path, capsys):
    path, _ = write_tiny(tmp_path / "odd.gguf", "llama", "Q4_0")
    _patch_type(path, "blk.0.attn_q.weight", 99)
    code, err = _cli(capsys, path)
    assert code != 0 and len(err) == 1 and "Traceback" not in err[0]
    assert "odd.gguf" in err[0] and "blk.0.attn_q.weight" in err[0] and "type 99" in err[0]


def test_unknown_architecture_is_named(tmp_path, capsys):
    path, _ = write_tiny(tmp_path / "arch.gguf", "llama", "Q4_K")
    data = path.read_bytes().replace(b"llama", b"zorba")  # arch value and its key prefix
    path.write_bytes(data)
    code, err = _cli(capsys, path)
    assert code != 0 and len(err) == 1
    assert "arch.gguf" in err[0] and "'zorba'" in err[0]


def test_truncated_k_quant_tensor_is_named(tmp_path, capsys):
    path, _ = write_tiny(tmp_path / "cut.gguf", "llama", "Q6_K", last="blk.0.ffn_down.weight")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    code, err = _cli(capsys, path)
    assert code != 0 and len(err) == 1
    assert "cut.gguf" in err[0] and "blk.0.ffn_down.weight" in err[0] and "Q6_K" in err[0] and "truncated" in err[0]
    with pytest.raises(ModelFormatError, match="truncated"):
        gguf_convert.open_reader(path)


def test_a_prompt_past_the_context_of_a_model_the_cascade_cannot_serve_is_refused(tmp_path):
    from mlotspark.engine import Engine
    from mlotspark.errors import PromptTooLongError

    path, _ = write_tiny(tmp_path / "g.gguf", "gemma3", "Q8_0")  # trained context 512
    engine = Engine.load(str(path))
    try:
        with pytest.raises(PromptTooLongError, match=r"512-token context of g \(gemma3_text\)"):
            engine.generate("ab " * 400, raw=True, max_tokens=4)
        assert engine.generate("ab " * 20, raw=True, max_tokens=4, temperature=0).stats.generation_tokens > 0
    finally:
        engine.close()


def test_cascade_settings_a_model_cannot_run_are_said_at_load(tmp_path, caplog):
    """``--cascade auto --window 512`` on Gemma: the flags never apply, and the load says so."""
    from mlotspark.engine import Engine

    path, _ = write_tiny(tmp_path / "g.gguf", "gemma3", "Q8_0")
    with caplog.at_level("WARNING", logger="mlotspark.runtime.cache_choice"):
        Engine.load(str(path), cascade="auto", cascade_settings={"window": 128}).close()
    assert "g (gemma3_text) does not run the memory cascade: its settings (window) do not apply" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="mlotspark.runtime.cache_choice"):
        Engine.load(str(path)).close()  # no settings: nothing to say
    assert "memory cascade" not in caplog.text


def test_hf_llama3_rope_scaling_runs_on_our_model_as_in_mlx_lm():
    """An HF / mlx-lm directory's `rope_scaling: llama3` on our llama model equals mlx-lm's llama."""
    from mlx_lm.models import llama as mlx_llama

    config = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300,
                  rope_theta=500000.0, max_position_embeddings=131072, tie_word_embeddings=True,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    ours = llama.Model(llama.ModelArgs.from_dict(config))
    theirs = mlx_llama.Model(mlx_llama.ModelArgs.from_dict(config))
    theirs.update(ours.parameters())
    tokens = mx.array([list(range(1, 200))])
    assert mx.allclose(ours(tokens), theirs(tokens), atol=1e-4).item()


def test_mlx_lm_twin_of_a_tied_gemma3_shares_every_weight(tmp_path):
    """bench --compare mlx-lm builds the twin; gemma3's tied lm_head must not stay random."""
    from mlotspark.models.mlx_lm_twin import mlx_lm_twin

    path, _ = write_tiny(tmp_path / "g.gguf", "gemma3", "Q4_K")
    loaded = loader.load(_source(path), weights="float32")
    assert mx.allclose(mlx_lm_twin(loaded)(TOKENS), loaded.model(TOKENS), atol=1e-5).item()
