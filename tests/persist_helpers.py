"""Fixtures and helpers of the persistence tests: small KV caches, tiny random llama
models that use the real default model's tokenizer (so chat templates and token
counts are real), and engines over them. Imported by test_conversation.py,
test_snapshot.py and test_prefix_cache.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
from mlx.utils import tree_flatten

TINY_CONFIG = dict(
    model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
    max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True,
)


def tiny_model(vocab_size: int = 512, seed: int = 0, layers: int = 2):
    """A random llama-family model (our class), for cache tests without a tokenizer."""
    from mlotspark.models import llama

    mx.random.seed(seed)
    cfg = {**TINY_CONFIG, "vocab_size": vocab_size, "num_hidden_layers": layers}
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    return model


def kv_cache(tokens: int, layers: int = 2, seed: int = 0) -> list:
    """A plain KV cache holding ``tokens`` random tokens, filled as the model fills it."""
    from mlotspark.caches.kv import KVCache

    mx.random.seed(seed)
    caches = [KVCache() for _ in range(layers)]
    for c in caches:
        for n in (tokens // 2, tokens - tokens // 2):  # two updates: a buffer with spare room
            if n:
                c.update_and_fetch(mx.random.normal((1, 2, n, 8)), mx.random.normal((1, 2, n, 8)))
    return caches


def kv_equal(a: list, b: list) -> bool:
    """Same offsets and the same keys and values up to them, layer by layer."""
    return all(
        x.offset == y.offset
        and mx.array_equal(x.keys[..., : x.offset, :], y.keys[..., : y.offset, :]).item()
        and mx.array_equal(x.values[..., : x.offset, :], y.values[..., : y.offset, :]).item()
        for x, y in zip(a, b)
    )


def extend(caches: list, n: int, seed: int = 1) -> None:
    """Append ``n`` random tokens to every layer, as a forward pass would."""
    mx.random.seed(seed)
    for c in caches:
        c.update_and_fetch(mx.random.normal((1, 2, n, 8)), mx.random.normal((1, 2, n, 8)))


def write_tiny_dir(directory: Path, hf_tokenizer, eos: list[int], seed: int) -> Path:
    """An mlx-lm model directory: random weights, the given tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    hf_tokenizer.save_pretrained(directory)
    cfg = {**TINY_CONFIG, "vocab_size": len(hf_tokenizer), "eos_token_id": eos}
    (directory / "config.json").write_text(json.dumps(cfg))
    model = tiny_model(len(hf_tokenizer), seed)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return directory


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, default_gguf) -> tuple[Path, Path]:
    """Two tiny model directories (different random weights: different fingerprints)."""
    from mlotspark.models.formats import gguf
    from mlotspark.models.tokenizer import load_gguf_tokenizer

    _, meta = gguf.read_gguf(default_gguf)
    tok = load_gguf_tokenizer(meta)
    root = tmp_path_factory.mktemp("tiny-models")
    eos = sorted(tok.eos_token_ids)
    return (write_tiny_dir(root / "tiny-a", tok._tokenizer, eos, 0), write_tiny_dir(root / "tiny-b", tok._tokenizer, eos, 1))


def _load(path: Path):
    from mlotspark.models import loader
    from mlotspark.models.hub.catalogue import ModelSource

    return loader.load(ModelSource(path.name, "hf_dir", path), weights="float32")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_dirs):
    return _load(tiny_dirs[0])


@pytest.fixture(scope="session")
def tiny_loaded_other(tiny_dirs):
    return _load(tiny_dirs[1])


@pytest.fixture
def engines():
    """``engines(loaded)`` -> a fresh Engine over ``loaded`` (a "new process" for the
    persistence layer: nothing shared but the weights); all closed at teardown."""
    from mlotspark.engine import Engine
    from mlotspark.options import GenerationOptions

    made = []

    def make(loaded, **defaults):
        e = Engine(loaded, GenerationOptions().merged(temperature=0.0, **defaults))
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()
