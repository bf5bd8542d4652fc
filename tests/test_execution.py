"""The runners (models/execution.py): each, forced on the CPU, gives plain MLX's greedy
tokens through the Engine; the device chooses the default; an override wins; the model keeps
its class and its caches get their attention when they are made."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest

from mlotspark.engine import Engine
from mlotspark.errors import OptionError
from mlotspark.models import execution
from mlotspark.models.execution import choose_runner, prepare
from mlotspark.models.loader import LoadedModel
from mlotspark.options import GenerationOptions
from tiny import tiny_model, tiny_runner

#: A short prompt, one past the CPU prefill's 64-query attention block, one single token.
PROMPTS = [[5, 9, 14, 3], [(7 * i) % 290 + 3 for i in range(150)], [7]]


class _Tokenizer:
    """Token t -> one character; EOS outside the vocabulary, so replies run to max_tokens."""

    eos_token_ids = [1000]
    bos_token_id = None

    class _Detokenizer:
        def __init__(self) -> None:
            self.tokens: list[int] = []

        def reset(self) -> None:
            self.tokens = []

        def add_token(self, t: int) -> None:
            self.tokens.append(t)

        def finalize(self) -> None:
            pass

        @property
        def text(self) -> str:
            return "".join(chr(33 + t % 90) for t in self.tokens)

    @property
    def detokenizer(self) -> "_Tokenizer._Detokenizer":
        return self._Detokenizer()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + ord(c) % 120 for c in text]


def _engine(strategy: str) -> Engine:
    model = tiny_model(seed=3, execution="plain")
    # Peaky logits: no near-ties, so greedy is well defined across summation orders.
    model.update({"model": {"embed_tokens": {"weight": model.model.embed_tokens.weight * 8}}})
    mx.eval(model.parameters())
    loaded = LoadedModel(model=model, tokenizer=_Tokenizer(), config={},
                         source=SimpleNamespace(name="tiny", path="tiny"), weights="float32",
                         fingerprint="tiny", context_length=4096, supports_cascade=True,
                         runner=prepare(model, strategy))
    return Engine(loaded, GenerationOptions(temperature=0.0))


def _tokens(engine: Engine) -> tuple[list, list]:
    """Each prompt alone, then all three decoding together."""
    solo = [engine.submit(prompt_ids=p, max_tokens=20).result().tokens for p in PROMPTS]
    handles = [engine.submit(prompt_ids=p, max_tokens=20) for p in PROMPTS]
    return solo, [h.result().tokens for h in handles]


@pytest.fixture(scope="module")
def plain_tokens():
    return _tokens(_engine("plain"))


@pytest.mark.parametrize("strategy", ["cpu", "gpu"])
def test_each_strategy_forced_on_the_cpu_gives_plain_mlx_greedy_tokens(strategy, plain_tokens):
    engine = _engine(strategy)
    assert engine.loaded.execution.name == strategy
    solo, together = _tokens(engine)
    assert solo == plain_tokens[0] and together == plain_tokens[1]
    assert together == solo
    ran = engine.loaded.execution
    if strategy == "cpu":
        assert ran.numpy_steps >= 3 * 19  # the one-token steps of solo rows went through NumPy
    else:
        assert ran.compiled  # the compiled decode pieces ran


def test_the_device_chooses_and_an_override_wins(monkeypatch):
    monkeypatch.delenv(execution.ENV, raising=False)
    assert choose_runner(mx.Device(mx.cpu)).name == "cpu"
    assert choose_runner(mx.Device(mx.gpu)).name == "gpu"
    assert choose_runner(mx.Device(mx.gpu), override="plain").name == "plain"
    monkeypatch.setenv(execution.ENV, "gpu")
    assert choose_runner(mx.Device(mx.cpu)).name == "gpu"
    with pytest.raises(OptionError, match="'fast'"):
        choose_runner(override="fast")


@pytest.mark.parametrize("name", ["cpu", "gpu", "plain"])
def test_the_model_keeps_its_class_and_a_bare_model_runs_plain(name):
    from mlotspark.models import llama

    runner = tiny_runner(execution=name)
    assert type(runner.model) is llama.Model  # no class swap of the model: only its layers' (cpu)
    assert execution.runner_for(runner) is runner
    bare = execution.runner_for(runner.model)
    assert bare.name == "plain" and bare.model is runner.model


@pytest.mark.parametrize("name", ["cpu", "gpu", "plain"])
def test_caches_get_the_runners_attention_when_made(name):
    from mlotspark.caches.kinds import make_cache
    from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache
    from mlotspark.models.cpu import prefill_ops

    runner = tiny_runner(execution=name)
    want = prefill_ops.cpu_attention if name == "cpu" else prefill_ops.attention
    cascade = make_cascade_cache(runner.model, CascadeConfig(sinks=4, window=16, block_size=4, top_k=2),
                                 attention=runner.attention)
    for caches in (runner.make_cache(), make_cache(runner, None), make_cache(runner, "float16"), cascade):
        assert all(c.attention is want for c in caches)
    restored = runner.adopt([type(c)() for c in make_cache(runner.model, None)])  # e.g. from a snapshot
    assert all(c.attention is want for c in restored)


RIVERS = "Name three rivers of Europe."


@pytest.fixture(scope="module")
def default_strategy_tokens(default_gguf):
    """The default model's greedy reply to RIVERS with the device's default strategy (once for both cases)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(execution.ENV, raising=False)
        engine = Engine.load(str(default_gguf))
        try:
            return engine.generate(RIVERS, temperature=0, max_tokens=24).tokens
        finally:
            engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["gpu", "plain"])
def test_real_model_forced_strategy_gives_the_default_tokens(strategy, default_gguf, default_strategy_tokens,
                                                            monkeypatch):
    """The default model loaded with MLOTSPARK_EXECUTION forcing a strategy: the same greedy
    tokens as the device's default (the CPU strategy here)."""
    monkeypatch.setenv(execution.ENV, strategy)
    forced = Engine.load(str(default_gguf))
    try:
        assert forced.loaded.execution.name == strategy
        assert forced.generate(RIVERS, temperature=0, max_tokens=24).tokens == default_strategy_tokens
    finally:
        forced.close()


@pytest.mark.parametrize("strategy", ["cpu", "gpu", "plain"])
def test_only_the_cpu_strategy_prefills_with_the_cpu_forms(strategy, monkeypatch):
    from mlotspark.models.cpu import prefill_ops

    ran = []
    for name in ("causal_attention", "silu_mul"):
        real = getattr(prefill_ops, name)
        monkeypatch.setattr(prefill_ops, name, lambda *a, _n=name, _f=real, **k: ran.append(_n) or _f(*a, **k))
    runner = tiny_runner(execution=strategy)
    runner(mx.array([PROMPTS[1]]), runner.make_cache())  # 150 tokens: past one attention block
    if strategy == "cpu":
        assert ran.count("causal_attention") == ran.count("silu_mul") == 2  # each layer
    else:
        assert not ran


@pytest.mark.parametrize("variant", ["gemma3", "phi3"])
def test_cpu_strategy_gives_models_not_ours_matvec_products_with_plain_tokens(variant, tmp_path, monkeypatch):
    """mlx-lm's classes (gemma3, phi3) on the CPU strategy: their dense float32 products
    take the one-token ``W @ x`` form (the tied output layer included) and the engine's greedy
    tokens equal plain MLX's; switching to the plain strategy puts the classes back."""
    import mlx.nn as nn

    from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear
    from zoo import write_gguf

    path = write_gguf(tmp_path / f"{variant}.gguf", variant, "F16")
    tokens = {}
    for strategy in ("plain", "cpu"):
        monkeypatch.setenv(execution.ENV, strategy)
        engine = Engine.load(str(path), progress=False, cascade=None)
        kinds = {type(m) for _, m in engine.loaded.model.named_modules()}
        if strategy == "cpu":
            assert MatvecLinear in kinds and MatvecEmbedding in kinds and nn.Linear not in kinds
        else:
            assert MatvecLinear not in kinds and MatvecEmbedding not in kinds
        tokens[strategy] = engine.generate("a b c d", temperature=0, max_tokens=12).tokens
        engine.close()
    assert tokens["cpu"] == tokens["plain"] and len(tokens["cpu"]) > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_gemma3_numpy_step_gives_mlx_logits_past_the_sliding_window(seed, tmp_path, monkeypatch):
    """Gemma 3's NumPy step (``cpu_step_gemma``) against mlx-lm's forward, one token at a time
    from the same prefilled caches, 30 steps past the tiny model's 4-token sliding window (so the
    rotating caches wrap): the same logits to float32 rounding."""
    from mlotspark.models.cpu import cpu_step_gemma
    from zoo import write_gguf

    monkeypatch.setenv(execution.ENV, "plain")
    engine = Engine.load(str(write_gguf(tmp_path / "g.gguf", "gemma3", "F16", seed=seed)), progress=False, cascade=None)
    model = engine.loaded.model
    ours, theirs = model.make_cache(), model.make_cache()
    assert model.args.sliding_window < 8 and {type(c).__name__ for c in ours} == {"RotatingKVCache", "KVCache"}
    prompt = mx.array([[5, 9, 14, 3, 22, 7, 8]])
    model(prompt, cache=ours), model(prompt, cache=theirs)
    token, worst = 11, 0.0
    for i in range(30):
        x = mx.array([[token]])
        want = model(x, cache=theirs)
        got = cpu_step_gemma.run(model, x, ours)
        assert got is not None
        worst = max(worst, float(mx.abs(want - got).max()))
        token = int(mx.argmax(want[0, -1]).item()) if i % 2 else (token * 7 + 3) % 290
    assert worst < 1e-3 * float(mx.abs(want).max())
    assert [c.offset for c in ours] == [c.offset for c in theirs]
    engine.close()


def test_gemma3_decodes_through_the_numpy_step_on_the_cpu_strategy(tmp_path, monkeypatch):
    """Through the engine: the CPU strategy takes gemma3's one-token steps into NumPy, and the
    greedy reply equals plain MLX's; a batch of two stays on MLX and agrees too."""
    from zoo import write_gguf

    path = write_gguf(tmp_path / "g.gguf", "gemma3", "F16", seed=2)
    replies = {}
    for strategy in ("plain", "cpu"):
        monkeypatch.setenv(execution.ENV, strategy)
        engine = Engine.load(str(path), progress=False, cascade=None)
        replies[strategy] = engine.generate("a b c d e f", temperature=0, max_tokens=16).tokens
        together = [engine.submit("a b c d e f", max_tokens=16, temperature=0) for _ in range(2)]
        assert [h.result().tokens for h in together] == [replies[strategy]] * 2
        if strategy == "cpu":
            assert engine.loaded.execution.numpy_steps >= 15
        engine.close()
    assert replies["cpu"] == replies["plain"]


# ------------------------------------------------------------------ widening (models/cpu/widen.py)


def _raw_model(seed: int = 3):
    """The tiny model as a loader holds it before widening: float16 layers, the MLP's
    gate/up/down quantized 4-bit and the embedding 8-bit (as in a Q4_1 GGUF)."""
    import mlx.nn as nn

    from mlotspark.models import llama
    from tiny import TINY

    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(TINY))
    model.set_dtype(mx.float16)
    nn.quantize(model, class_predicate=lambda p, m: (
        {"group_size": 32, "bits": 8} if p.endswith("embed_tokens") else
        {"group_size": 32, "bits": 4} if ".mlp." in p else False))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("workers", [1, 2])
def test_the_cpu_strategy_widens_into_fused_buffers_with_the_plain_values(workers):
    import mlx.nn as nn
    import numpy as np
    from mlx.utils import tree_flatten

    from mlotspark.models.cpu import cpu_step, widen

    expected = {}  # quantized layers dequantized in float32 arithmetic, floats cast
    for name, m in _raw_model().named_modules():
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            expected[f"{name}.weight"] = np.array(mx.dequantize(
                m.weight, m.scales.astype(mx.float32), m.biases.astype(mx.float32), group_size=m.group_size,
                bits=m.bits, dtype=mx.float32))
    for name, v in tree_flatten(_raw_model().parameters()):
        if mx.issubdtype(v.dtype, mx.floating) and not name.endswith((".scales", ".biases")):
            expected.setdefault(name, np.array(v.astype(mx.float32)))

    model = _raw_model()
    groups = execution.CpuRunner().fused_groups(model)
    fused = widen.widen(model, mx.float32, groups=groups, workers=workers)
    assert set(fused) == {widen.group_key(g) for g in groups}  # every group, quantized (gate/up) or float (q/k/v)
    got = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    assert got.keys() == expected.keys() and all(v.dtype == np.float32 for v in got.values())
    for k in got:
        np.testing.assert_array_equal(got[k], expected[k], err_msg=k)
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        assert cpu_step.one_buffer([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
        assert cpu_step.one_buffer([mlp.gate_proj.weight, mlp.up_proj.weight])
        assert type(mlp.down_proj) is nn.Linear
    assert execution.fuse_projections(model) == 0


def test_the_plain_strategy_widens_as_mlx_lm_does():
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.utils import dequantize_model

    reference = _raw_model()
    dequantize_model(reference)
    reference.set_dtype(mx.float32)
    model = _raw_model()
    assert execution.PlainRunner().widen(model, mx.float32) == {}
    got, want = dict(tree_flatten(model.parameters())), dict(tree_flatten(reference.parameters()))
    assert got.keys() == want.keys()
    for k in got:
        np.testing.assert_array_equal(np.array(got[k]), np.array(want[k]), err_msg=k)
