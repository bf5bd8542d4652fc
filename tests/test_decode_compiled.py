"""The GPU runner's compiled decode pieces: same tokens and logits as the op-by-op
forward (the plain runner), any cache; forced on the CPU here."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache
from mlotspark.models.execution import prepare
from tiny import tiny_model, tiny_runner


def _decode(model, cache, prompt, steps):
    logits = model(mx.array([prompt]), cache)
    out, tok = [], mx.argmax(logits[:, -1, :], axis=-1)
    for _ in range(steps):
        logits = model(tok[None], cache)
        out.append(logits[0, -1])
        tok = mx.argmax(logits[:, -1, :], axis=-1)
    return np.array(mx.stack(out))


@pytest.mark.parametrize("variant", [{}, {"model_type": "qwen3", "tie_word_embeddings": False}])
def test_compiled_step_equals_the_op_by_op_step(variant):
    model = tiny_model(execution="plain", **variant)
    prompt = [5, 17, 42, 99, 3, 250, 7]
    ref = _decode(model, model.make_cache(), prompt, 12)
    gpu = prepare(model, "gpu")
    got = _decode(gpu, model.make_cache(), prompt, 12)
    assert gpu.compiled  # the compiled path asked for ran
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_cascade_window_decodes_through_the_compiled_pieces():
    model = tiny_model(execution="plain")
    cfg = CascadeConfig(window=120, sinks=4, block_size=8, top_k=2, chunk=16)
    prompt = list(range(3, 90))
    ref = _decode(model, make_cascade_cache(model, cfg), prompt, 40)  # crosses block evictions
    gpu = prepare(model, "gpu")
    got = _decode(gpu, make_cascade_cache(model, cfg), prompt, 40)
    assert gpu.compiled
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_updated_weights_reach_the_compiled_step():
    runner = tiny_runner(execution="gpu")
    model = runner.model
    cache = runner.make_cache()
    runner(mx.array([[5, 6, 7]]), cache)
    before = runner(mx.array([[8]]), cache)
    model.update({"model": {"norm": {"weight": model.model.norm.weight * 2}}})
    cache2 = runner.make_cache()
    runner(mx.array([[5, 6, 7]]), cache2)
    after = runner(mx.array([[8]]), cache2)
    assert runner.compiled and not mx.allclose(before, after).item()  # not frozen into the compiled graph


def test_the_runner_by_default_is_the_devices():
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    assert tiny_runner().name == ("gpu" if on_gpu else "cpu")
