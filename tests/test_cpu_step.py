"""One-token decode steps in NumPy (models/cpu/cpu_step.py): the MLX step's logits and tokens,
the cache left as MLX would leave it, and MLX wherever the NumPy step does not apply."""

from __future__ import annotations

import gc

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlotspark.caches.kinds import make_cache
from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache
from mlotspark.models.cpu import cpu_step
from mlotspark.models.execution import CpuRunner, fuse_projections, prepare
from tiny import greedy, tiny_model

PROMPT = [5, 17, 42, 99, 3, 250, 7]


_RUNNERS: dict = {}  # id(model) -> the runner _decode last bound to it


def _decode(model, numpy_step: bool, steps: int, cache=None, prompt=PROMPT, fuse: bool = True, runner=None):
    """Greedy tokens, the logits of each one-token step, and the cache: through the CPU
    runner (the NumPy step) or plain MLX (a given ``runner`` as it is)."""
    want = "cpu" if numpy_step else "plain"
    runner = runner or _RUNNERS.get(id(model))
    if runner is None or runner.model is not model or runner.name != want:
        runner = prepare(model, CpuRunner(fuse=fuse) if numpy_step else "plain")
    _RUNNERS[id(model)] = runner
    cache = runner.make_cache() if cache is None else cache
    return (*greedy(runner, cache, prompt, steps), cache)


VARIANTS = [
    {},  # llama, traditional RoPE, GQA, tied output
    {"model_type": "qwen2", "tie_word_embeddings": False, "rope_traditional": False},  # q/k/v bias
    {"model_type": "qwen3", "num_key_value_heads": 4},  # q/k norms, no GQA
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}},
    {"rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_freq_factors": [1.0 + i / 8 for i in range(8)]},  # GGUF Llama 3 form
]


def _fused(plan) -> bool:
    """Whether every layer of ``plan`` reads q/k/v and gate/up with one product each."""
    return all(len(proj) == 1 and len(mlp) == 1 for proj, mlp, *_ in plan.layers)


@pytest.mark.parametrize("fuse", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_numpy_step_gives_the_mlx_steps_logits_and_tokens(variant, fuse):
    model = tiny_model(execution="plain", **variant)
    ref_toks, ref, ref_cache = _decode(model, False, 24)
    toks, got, cache = _decode(model, True, 24, fuse=fuse)  # fused: as the loader leaves a float32 model
    assert _RUNNERS[id(model)].numpy_steps == 24, "the NumPy step did not take this model"
    assert _fused(model.__dict__["_cpu_plan"]) == fuse
    assert toks == ref_toks
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    for a, b in zip(cache, ref_cache):  # the cache holds what the MLX step would have put there
        assert a.offset == b.offset
        np.testing.assert_allclose(np.array(a.state[0][..., : a.offset, :]),
                                   np.array(b.state[0][..., : b.offset, :]), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(a.state[1][..., : a.offset, :]),
                                   np.array(b.state[1][..., : b.offset, :]), rtol=1e-4, atol=1e-4)


def test_across_buffer_growth_and_back_to_mlx_for_a_prefill():
    model = tiny_model(execution="plain")
    ref_toks, ref, ref_cache = _decode(model, False, 300)  # past the 256-position buffer step
    toks, got, cache = _decode(model, True, 300)
    assert toks == ref_toks
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)
    # A next turn: a multi-token prefill runs on MLX over the buffers the NumPy step wrote.
    turn = [11, 12, 13, 14]
    a = model(mx.array([turn]), cache)
    b = model(mx.array([turn]), ref_cache)
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-3, atol=1e-3)


def test_a_view_taken_before_a_trim_keeps_its_tokens():
    """MLX copies a shared buffer before writing into it; the NumPy step writes in place,
    so after a trim it must move to a buffer of its own first."""
    model = tiny_model()
    _, _, cache = _decode(model, True, 8)
    n = cache[0].offset
    kept = [c.keys[..., :n, :] for c in cache]  # e.g. a snapshot's slices: views of the buffer
    mx.eval(kept)
    before = [np.array(k) for k in kept]
    for c in cache:
        assert c.trim(4) == 4
    _decode(model, True, 6, cache=cache, prompt=[1])
    for k, b in zip(kept, before):
        np.testing.assert_array_equal(np.array(k), b)


def test_a_softmax_that_overflows_runs_again_with_the_maximum(monkeypatch):
    """The step shifts scores by the new token's own score; when another score is ~88 or
    more above it, exp overflows and the step runs again with each row's maximum."""
    model = tiny_model(execution="plain")
    for layer in model.layers:  # scores in the thousands: far past exp's float32 range
        at = layer.self_attn
        at.q_proj.weight = at.q_proj.weight * 40
        at.k_proj.weight = at.k_proj.weight * 40
    mx.eval(model.parameters())
    ref_toks, ref, _ = _decode(model, False, 8)
    runs = []
    real = cpu_step.CpuStep._layers
    monkeypatch.setattr(cpu_step.CpuStep, "_layers", lambda self, *a, exact: runs.append(exact) or real(self, *a, exact=exact))
    toks, got, _ = _decode(model, True, 8)
    assert True in runs, "no step needed the exact softmax: the test's scores are too small"
    assert toks == ref_toks
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3)


def test_fusing_keeps_the_weights_and_their_memory():
    model = tiny_model(execution="plain")
    ref = np.array(model(mx.array([PROMPT])))
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    gc.collect()
    used = mx.get_active_memory()
    assert fuse_projections(model) == 2 * len(model.layers)
    gc.collect()
    assert mx.get_active_memory() <= used  # the modules hold views of one buffer, no copies
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == before.keys()
    for k, v in before.items():
        np.testing.assert_array_equal(np.array(after[k]), v, err_msg=k)
    # MLX's own paths read the views as they read the separate arrays.
    np.testing.assert_allclose(np.array(model(mx.array([PROMPT]))), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fuse", [False, True], ids=["separate", "fused"])
def test_new_weights_are_seen(fuse):
    model = tiny_model(execution="plain")
    runner = prepare(model, CpuRunner(fuse=fuse))
    _decode(model, True, 2, runner=runner)
    first = model.__dict__["_cpu_plan"]
    w = model.model.layers[0].mlp.up_proj.weight
    model.model.layers[0].mlp.update({"up_proj": {"weight": w * 2}})
    toks, got, _ = _decode(model, True, 6)
    assert model.__dict__["_cpu_plan"] is not first and runner.numpy_steps == 8
    ref_toks, ref, _ = _decode(model, False, 6)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def _runs_numpy(model, cache, tokens) -> bool:
    prepare(model, "cpu")
    model(mx.array([PROMPT] * tokens.shape[0]), cache)
    return cpu_step.run(model, tokens, cache) is not None


def test_mlx_keeps_every_step_the_numpy_step_does_not_do():
    model = tiny_model()
    assert _runs_numpy(model, model.make_cache(), mx.array([[3]]))
    assert not _runs_numpy(model, model.make_cache(), mx.array([[3], [4]]))  # a batch
    assert not _runs_numpy(model, make_cache(model, "float16"), mx.array([[3]]))
    wide = tiny_model(num_attention_heads=2, num_key_value_heads=1)  # q8 KV needs head_dim 32
    assert not _runs_numpy(wide, make_cache(wide, "q8"), mx.array([[3]]))
    cfg = CascadeConfig(sinks=4, window=16, block_size=4, top_k=2)
    assert not _runs_numpy(model, make_cascade_cache(model, cfg), mx.array([[3]]))
    runner = prepare(model, "plain")  # a plain runner never asks the NumPy step
    cache = runner.make_cache()
    runner(mx.array([PROMPT]), cache)
    assert not runner.takes(cache)
    half = tiny_model()
    half.set_dtype(mx.float16)
    assert not _runs_numpy(half, half.make_cache(), mx.array([[3]]))
    quant = tiny_model()
    nn.quantize(quant, group_size=32, bits=8)
    assert not _runs_numpy(quant, quant.make_cache(), mx.array([[3]]))


def test_a_one_token_prompt_on_an_empty_cache():
    model = tiny_model(execution="plain")
    ref_toks, ref, _ = _decode(model, False, 5, prompt=[9])
    toks, got, cache = _decode(model, True, 5, prompt=[9])
    assert toks == ref_toks and cache[0].offset == 6
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)

