"""One-token products in OpenBLAS's fast form (models/matvec.py): same results, same tokens."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache
from mlotspark.models.matvec import Linear, block_rows, matvec
from mlotspark.models import cpu_step
from tiny import greedy, tiny_model


@pytest.fixture(autouse=True)
def _mlx_path_only(monkeypatch):
    """These tests are about the MLX one-token path; keep the NumPy step (cpu_step.py) out."""
    monkeypatch.setattr(cpu_step, "enabled", lambda model: False)


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
    lin = Linear(32, 48, bias=True)
    lin.matvec = True
    one, many = mx.random.normal((1, 1, 32)), mx.random.normal((2, 3, 32))
    ref = lambda x: x @ lin.weight.T + lin.bias  # noqa: E731
    np.testing.assert_allclose(np.array(lin(one)), np.array(ref(one)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(lin(many)), np.array(ref(many)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("variant", [{}, {"model_type": "qwen2", "tie_word_embeddings": False}])
def test_decode_with_matvec_gives_the_reference_tokens(variant, compiled):
    model = tiny_model(**variant)
    model.model.compiled_decode = compiled
    prompt = [5, 17, 42, 99, 3, 250, 7]
    model.model.decode_matvec = False
    ref_toks, ref = greedy(model, model.make_cache(), prompt, 16)
    model.model.decode_matvec = True
    toks, got = greedy(model, model.make_cache(), prompt, 16)
    assert model.model.matvec_on and model.model.layers[0].mlp.up_proj.matvec
    if "tie_word_embeddings" in variant:
        assert model.lm_head.matvec  # the untied head too
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert toks == ref_toks


def test_cascade_window_decodes_with_matvec():
    model = tiny_model()
    cfg = CascadeConfig(window=120, sinks=4, block_size=8, top_k=2, chunk=16)
    prompt = list(range(3, 90))
    model.model.decode_matvec = False
    ref_toks, ref = greedy(model, make_cascade_cache(model, cfg), prompt, 40)  # crosses evictions
    model.model.decode_matvec = True
    toks, got = greedy(model, make_cascade_cache(model, cfg), prompt, 40)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert toks == ref_toks


def test_default_is_on_for_the_cpu_backend_only():
    model = tiny_model()
    assert model.model.decode_matvec is None
    model(mx.array([[5, 6]]), model.make_cache())
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert model.model.matvec_on == on_cpu
    model.model.decode_matvec = False
    model(mx.array([[5, 6]]), model.make_cache())
    assert not model.model.layers[1].self_attn.q_proj.matvec
