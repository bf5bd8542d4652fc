"""One-token products in OpenBLAS's fast form (models/cpu/matvec.py): same results, same tokens."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache
from mlotspark.models.execution import CpuRunner, prepare
from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear, block_rows, matvec
from tiny import greedy, tiny_model


def _cpu_on_mlx() -> CpuRunner:
    """The CPU runner with its one-token steps left on MLX (the NumPy step out): what these tests are about."""
    return CpuRunner(numpy_step=False)


def test_block_rows_stay_under_the_small_kernel_limit():
    assert block_rows(1536, 576) == 1536  # the MLP's gate/up fit whole
    assert block_rows(49152, 576) == 1536  # the output layer: 32 blocks, no remainder
    rows = block_rows(4099, 300)  # a prime: no divisor, a remainder block
    assert rows * 300 <= 1_000_000 and 4099 % rows != 0
    assert block_rows(10, 5, limit=1) == 1


@pytest.mark.parametrize("shape", [(96, 64), (4096, 320), (4099, 300)])
def test_matvec_equals_x_times_w_transposed(shape):
    mx.random.seed(1)
    w = mx.random.normal(shape)
    x = mx.random.normal((1, 1, shape[1]))
    got = matvec(w, x)
    assert got.shape == (1, 1, shape[0])
    np.testing.assert_allclose(np.array(got), np.array(x @ w.T), rtol=1e-5, atol=1e-4)


def test_linear_uses_matvec_for_one_token_only_and_keeps_its_bias():
    mx.random.seed(2)
    lin = MatvecLinear(32, 48, bias=True)
    one, many = mx.random.normal((1, 1, 32)), mx.random.normal((2, 3, 32))
    ref = lambda x: x @ lin.weight.T + lin.bias  # noqa: E731
    np.testing.assert_allclose(np.array(lin(one)), np.array(ref(one)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(lin(many)), np.array(ref(many)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", [{}, {"model_type": "qwen2", "tie_word_embeddings": False}])
def test_decode_with_matvec_gives_the_reference_tokens(variant):
    model = tiny_model(execution="plain", **variant)
    prompt = [5, 17, 42, 99, 3, 250, 7]
    ref_toks, ref = greedy(model, model.make_cache(), prompt, 16)
    prepare(model, _cpu_on_mlx())
    toks, got = greedy(model, model.make_cache(), prompt, 16)
    assert type(model.model.layers[0].mlp.up_proj) is MatvecLinear
    if "tie_word_embeddings" in variant:
        assert type(model.lm_head) is MatvecLinear  # the untied head too
    else:
        assert type(model.model.embed_tokens) is MatvecEmbedding  # the tied head
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert toks == ref_toks


def test_cascade_window_decodes_with_matvec():
    model = tiny_model(execution="plain")
    cfg = CascadeConfig(window=120, sinks=4, block_size=8, top_k=2, chunk=16)
    prompt = list(range(3, 90))
    ref_toks, ref = greedy(model, make_cascade_cache(model, cfg), prompt, 40)  # crosses evictions
    prepare(model, _cpu_on_mlx())
    toks, got = greedy(model, make_cascade_cache(model, cfg), prompt, 40)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert toks == ref_toks


def test_only_the_cpu_runner_swaps_the_layers_and_back():
    model = tiny_model(execution="cpu")
    assert type(model.model.layers[1].self_attn.q_proj) is MatvecLinear
    for name in ("gpu", "plain"):
        prepare(model, name)
        assert type(model.model.layers[1].self_attn.q_proj) is nn.Linear
        assert type(model.model.embed_tokens) is nn.Embedding
