"""CPU prefill forms (models/cpu/prefill_ops.py): same results as MLX's own ops, within float32 rounding."""

from __future__ import annotations

import mlotspark  # noqa: F401  isort: skip
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import llama as mlx_llama

from mlotspark.models.cpu import prefill_ops
from tests.tiny import TINY, tiny_model


def test_fast_exp_within_float32_rounding():
    x = mx.concatenate([mx.linspace(-87.0, 88.0, 200_001), mx.random.normal((10_000,)) * 4])
    got, want = prefill_ops.fast_exp(x), mx.exp(x)
    rel = (mx.abs(got - want) / want).max().item()
    assert rel < 5e-7, rel
    # Masked scores and huge negative inputs stay finite, positive and tiny.
    tiny = prefill_ops.fast_exp(mx.array([-mx.inf, -1e4, -87.0]))
    assert mx.all(tiny > 0).item() and tiny.max().item() < 2e-38


def test_silu_mul_matches_nn_silu():
    g, u = mx.random.normal((3, 37, 96)) * 6, mx.random.normal((3, 37, 96))
    want = nn.silu(g) * u
    got = prefill_ops.silu_mul(g, u)
    assert mx.allclose(got, want, rtol=1e-6, atol=1e-6).item()
    # Other shapes retrace; other dtypes fall back to MLX's sigmoid.
    assert prefill_ops.silu_mul(g[:1, :5], u[:1, :5]).shape == (1, 5, 96)
    half = prefill_ops.silu_mul(g.astype(mx.float16), u.astype(mx.float16))
    assert half.dtype == mx.float16


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("L,past", [(5, 0), (200, 0), (130, 70)])
def test_causal_attention_matches_masked_sdpa(L, past, explicit, monkeypatch):
    monkeypatch.setattr(prefill_ops, "EXPLICIT_SOFTMAX", explicit)
    q = mx.random.normal((2, 6, L, 16))
    k, v = mx.random.normal((2, 2, past + L, 16)), mx.random.normal((2, 2, past + L, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    got = prefill_ops.causal_attention(q, k, v, scale=0.25, block=32)
    assert got.shape == want.shape
    assert mx.allclose(got, want, rtol=1e-5, atol=1e-6).item()


def test_tiny_model_prefill_matches_mlx_lm():
    """Our model (CPU prefill forms on) against mlx-lm's llama class with the same weights,
    in one pass and in chunks through the KV cache."""
    ours = tiny_model(seed=3)
    ref = mlx_llama.Model(mlx_llama.ModelArgs.from_dict({**TINY, "rms_norm_eps": 1e-5}))
    ref.update(ours.parameters())
    ids = mx.random.randint(0, TINY["vocab_size"], (1, 150))
    want = ref(ids)
    assert mx.allclose(ours(ids), want, rtol=1e-4, atol=1e-4).item()
    cache = ours.make_cache()
    parts = [ours(ids[:, s:e], cache=cache) for s, e in ((0, 90), (90, 149), (149, 150))]
    got = mx.concatenate(parts, axis=1)
    assert mx.allclose(got, want, rtol=1e-4, atol=1e-4).item()
    assert mx.array_equal(got.argmax(-1), want.argmax(-1)).item()
    assert len(tree_flatten(ours.parameters())) == len(tree_flatten(ref.parameters()))
