"""The memory cascade (working + episodic tiers) on tiny random models.

What a user would notice: the same answer as full attention while the text fits
the working memory; bounded memory and work per token however long the text;
retrieval of the block that matters; storage formats and spill to disk that do not
change the answer; snapshots that resume exactly.
"""

from __future__ import annotations

import json
import stat

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from mlotspark.memory.cascade import (
    CascadeCache,
    CascadeConfig,
    EpisodicStore,
    cascade_state,
    cascade_stats,
    make_cascade_cache,
    restore_cascade_cache,
)
from mlotspark.memory.cascade.block_codec import decode, encode
from mlotspark.errors import OptionError, SnapshotError
from mlotspark.models.llama import Model, ModelArgs


@pytest.fixture(scope="module")
def model() -> Model:
    mx.random.seed(3)
    m = Model(
        ModelArgs(
            hidden_size=64,
            num_hidden_layers=2,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            max_position_embeddings=512,
            rope_traditional=True,
        )
    )
    mx.eval(m.parameters())
    return m


def tokens(n: int, seed: int = 0) -> mx.array:
    return mx.array(np.random.default_rng(seed).integers(0, 256, n))


def forward(model: Model, cache: list, toks: mx.array, chunks: list[int]) -> mx.array:
    """Logits (1, L, V) of ``toks`` fed in pieces of ``chunks`` tokens, as generate_step does."""
    outs, i = [], 0
    for c in chunks:
        outs.append(model(toks[None, i : i + c], cache=cache))
        mx.eval([x.state for x in cache])
        i += c
    assert i == toks.size
    return mx.concatenate(outs, axis=1)


def greedy(model: Model, cache: list, prompt: mx.array, n: int, chunk: int) -> tuple[list[int], list[mx.array]]:
    toks, logps = [], []
    for t, lp in generate_step(prompt, model, max_tokens=n, prompt_cache=cache, prefill_step_size=chunk):
        toks.append(t)
        logps.append(lp)
    return toks, logps


# --------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "field, value",
    [("window", 0), ("sinks", -1), ("block_size", 0), ("top_k", -2), ("routing", "random"),
     ("block_kind", "q3"), ("episodic_budget_mb", -1.0), ("rolling_window", 0), ("representation", "median")],
)
def test_bad_config_names_the_value(field, value):
    with pytest.raises(OptionError, match=repr(value).replace("[", r"\[")):
        CascadeConfig(**{field: value})


def test_block_larger_than_window_refused():
    with pytest.raises(OptionError, match="block_size"):
        CascadeConfig(window=16, block_size=32)


def test_a_small_window_alone_takes_blocks_of_the_window():
    """``generate --window 16`` was refused with "invalid cascade block_size 32", a size the
    user never gave (the default for a long context); a block size given is still checked."""
    from mlotspark.runtime.cache_choice import VALUES_ONLY_CONTEXT

    for ctx in (8192, VALUES_ONLY_CONTEXT):  # the model's; the CLI's check before loading
        assert CascadeConfig.for_model(ctx, window=16).block_size == 16
        assert CascadeConfig.for_model(ctx, window=2048).block_size == 32
    with pytest.raises(OptionError, match="block_size 32: must not exceed the window"):
        CascadeConfig.for_model(8192, window=16, block_size=32)


@pytest.mark.parametrize("ctx", [256, 2048, 8192, 32768, 131072])
def test_defaults_fit_the_trained_context(ctx):
    c = CascadeConfig.for_model(ctx)
    assert c.window < ctx and c.span <= ctx
    assert c.routing == "question"


def test_for_model_refuses_a_span_past_the_context():
    with pytest.raises(OptionError, match="8192"):
        CascadeConfig.for_model(8192, window=7168)
    with pytest.raises(OptionError, match="unknown"):
        CascadeConfig.for_model(8192, windw=512)


def test_cascade_needs_our_model_and_a_fitting_span(model):
    with pytest.raises(OptionError, match="llama-family"):
        make_cascade_cache(nn.Linear(2, 2), CascadeConfig())
    with pytest.raises(OptionError, match="512"):
        make_cascade_cache(model, CascadeConfig(window=256, sinks=4, block_size=8, top_k=4))


# ------------------------------------------------------------ full attention
def test_equals_full_attention_while_it_fits(model):
    cfg = CascadeConfig(window=180, sinks=8, block_size=8, top_k=4, chunk=24)
    prompt = tokens(90, seed=1)
    ref_toks, ref_lp = greedy(model, model.make_cache(), prompt, 60, chunk=32)
    cas = make_cascade_cache(model, cfg)
    toks, lp = greedy(model, cas, prompt, 60, chunk=32)
    assert toks == ref_toks
    np.testing.assert_allclose(np.array(mx.stack(lp)), np.array(mx.stack(ref_lp)), atol=1e-4)
    assert cascade_stats(cas)["tokens"]["episodic"] == 0


def test_logits_equal_full_attention_for_every_chunking(model):
    toks = tokens(100, seed=2)
    ref = forward(model, model.make_cache(), toks, [100])
    cas = make_cascade_cache(model, CascadeConfig(window=120, sinks=4, block_size=8, top_k=2, chunk=16))
    out = forward(model, cas, toks, [1, 30, 40, 1, 1, 27])
    np.testing.assert_allclose(np.array(out), np.array(ref), atol=1e-4)


# ------------------------------------------------------------------- bounds
def test_long_sequence_keeps_kv_bounded(model):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16)
    bound = cfg.sinks + cfg.top_k * cfg.block_size + cfg.window
    cas = make_cascade_cache(model, cfg)
    prompt = tokens(160, seed=4)  # ~7 windows
    seen = []
    for i, _ in enumerate(generate_step(prompt, model, max_tokens=80, prompt_cache=cas, prefill_step_size=32)):
        for c in cas:
            assert c.n_window <= cfg.window + cfg.max_chunk  # the last call's tokens leave at the next
            assert c._ctx_len <= bound + 1  # + the token being decoded
            c.settle()
            assert c.n_window <= cfg.window
            seen.append(c._ctx_k.shape[2])
    stats = cascade_stats(cas)
    assert stats["tokens"]["total"] == 160 + 80  # generate_step feeds the last token too
    t = stats["tokens"]
    assert t["sinks"] + t["window"] + t["episodic"] == t["total"]
    assert t["episodic"] >= 240 - cfg.sinks - cfg.window
    # buffers stop growing: memory per token does not depend on the length
    assert max(seen) <= bound + cfg.max_chunk + 256


# ------------------------------------------------------------------ routing
def planted_cache(routing: str, representation: str, n_blocks: int = 12, target: int = 5, seed: int = 0, rolling: int = 4):
    """A cache whose episodic block ``target`` holds one key along ``u``; also returns
    a RoPE module and ``u`` (D,)."""
    Hq, Hkv, D, B = 4, 2, 16, 4
    cfg = CascadeConfig(window=8, sinks=2, block_size=B, top_k=2, routing=routing, representation=representation, rolling_window=rolling, chunk=64)
    cache = CascadeCache(cfg, 0, EpisodicStore.from_config(cfg))
    rope = nn.RoPE(D, traditional=True)
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(D).astype(np.float32)
    u /= np.linalg.norm(u)
    n = cfg.sinks + n_blocks * B + cfg.window
    k = 0.3 * rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    k[0, :, cfg.sinks + target * B + 1] = 4.0 * u  # one token of block `target`, every KV head
    v = rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    q = 0.3 * rng.standard_normal((1, Hq, n, D)).astype(np.float32)
    cache.attend(mx.array(q), mx.array(k), mx.array(v), rope=rope, scale=D**-0.5)
    cache.settle()
    assert cache.n_blocks == n_blocks
    return cache, rope, u, rng


@pytest.mark.parametrize("representation", ["minmax", "mean", "keys"])
@pytest.mark.parametrize("routing", ["sequence", "rolling", "token", "hybrid"])
def test_decode_routing_finds_the_planted_key(routing, representation):
    cache, rope, u, rng = planted_cache(routing, representation)
    Hq, Hkv, D = 4, 2, u.size
    for _ in range(4):  # rolling routers need their window filled with on-topic queries
        q = np.tile(u, (1, Hq, 1, 1)) + 0.05 * rng.standard_normal((1, Hq, 1, D))
        k = 0.3 * rng.standard_normal((1, Hkv, 1, D))
        cache.attend(mx.array(q, mx.float32), mx.array(k, mx.float32), mx.array(k, mx.float32), rope=rope, scale=D**-0.5)
    assert all(5 in head for head in cache.selection)


@pytest.mark.parametrize("routing", ["sequence", "token", "hybrid"])
def test_prefill_routing_lets_a_few_tokens_win_their_block(routing):
    cache, rope, u, rng = planted_cache(routing, "minmax")
    Hq, Hkv, D, L = 4, 2, u.size, 64
    q = 0.3 * rng.standard_normal((1, Hq, L, D))
    q[0, :, 40:43] = 3 * u  # three tokens of 64 ask for the planted block
    k = 0.3 * rng.standard_normal((1, Hkv, L, D))
    cache.attend(mx.array(q, mx.float32), mx.array(k, mx.float32), mx.array(k, mx.float32), rope=rope, scale=D**-0.5)
    assert all(5 in head for head in cache.selection)


def test_rolling_choice_is_steadier_than_per_token():
    """Noisy decode queries around one topic: hybrid keeps the planted block every
    step and re-scores less often than per-token routing, which flips more."""
    runs = {}
    for routing in ("token", "hybrid"):
        cache, rope, u, rng = planted_cache(routing, "minmax", seed=1, rolling=12)
        rng = np.random.default_rng(11)  # the same noise for both routers
        held = []
        for _ in range(16):
            q = np.tile(u, (1, 4, 1, 1)) + 0.6 * rng.standard_normal((1, 4, 1, u.size))
            k = 0.3 * rng.standard_normal((1, 2, 1, u.size))
            cache.attend(mx.array(q, mx.float32), mx.array(k, mx.float32), mx.array(k, mx.float32), rope=rope, scale=u.size**-0.5)
            held.append(all(5 in head for head in cache.selection))
        runs[routing] = (cache.counters, held)
    token, hybrid = runs["token"][0], runs["hybrid"][0]
    assert all(runs["hybrid"][1])
    assert hybrid.routed < token.routed
    assert hybrid.changes <= token.changes


def test_kv_heads_choose_their_own_blocks():
    cache, rope, u, rng = planted_cache("token", "minmax")
    c = cache
    # give KV head 1 a different planted block (9) along another direction w
    w = rng.standard_normal(u.size).astype(np.float32)
    w /= np.linalg.norm(w)
    blk = c.store.blocks[(0, 9)]
    k, v = c.store.unpack(blk, blk.payload, mx.float32)
    k = np.array(k)
    k[1, 2] = 4.0 * w
    c.store.blocks[(0, 9)].payload = {f"k.{n}": a for n, a in encode(mx.array(k), "float16").items()} | {
        f"v.{n}": a for n, a in encode(v, "float16").items()
    }
    from mlotspark.memory.cascade.routing import summarize

    c.index.buf[:, :, 9] = summarize(mx.array(k), "minmax")
    q = np.stack([u, u, w, w])[None, :, None, :]  # query heads 0-1 -> KV head 0, 2-3 -> KV head 1
    kk = 0.3 * rng.standard_normal((1, 2, 1, u.size))
    c.attend(mx.array(q, mx.float32), mx.array(kk, mx.float32), mx.array(kk, mx.float32), rope=rope, scale=u.size**-0.5)
    assert 5 in c.selection[0] and 9 in c.selection[1]


def test_streaming_baseline_retrieves_nothing(model):
    cas = make_cascade_cache(model, CascadeConfig(window=16, sinks=4, block_size=8, top_k=0))
    forward(model, cas, tokens(120, seed=5), [40, 40, 40])
    s = cascade_stats(cas)
    assert s["retrieval"]["blocks_per_call"] == 0 and s["store"]["hits"] == 0
    assert s["tokens"]["episodic"] > 0  # evicted blocks are still kept for later


# ------------------------------------------------------------------ storage
@pytest.mark.parametrize("kind, tol", [("float16", 1e-3), ("q8", 2e-2), ("q4", 0.2)])
def test_block_kinds_round_trip_within_tolerance(kind, tol):
    x = mx.random.normal((3, 32, 64), key=mx.random.key(1))
    packed = encode(x, kind)
    y = decode(packed, kind, mx.float32, x.shape)
    assert y.shape == x.shape and y.dtype == mx.float32
    err = mx.abs(y - x).max().item() / mx.abs(x).max().item()
    assert err < tol
    nbytes = sum(a.nbytes for a in packed.values())
    assert nbytes <= x.nbytes / (2 if kind == "float16" else 3)


@pytest.mark.parametrize("kind", ["q8", "q4"])
def test_quantized_blocks_stay_close_to_float16(model, kind):
    toks = tokens(150, seed=6)
    base = CascadeConfig(window=24, sinks=4, block_size=8, top_k=3, chunk=16)
    ref = forward(model, make_cascade_cache(model, base), toks, [50, 50, 50])
    cfg = CascadeConfig(**{**base.to_dict(), "block_kind": kind})
    out = forward(model, make_cascade_cache(model, cfg), toks, [50, 50, 50])
    top_ref, top = np.array(ref.argmax(-1)), np.array(out.argmax(-1))
    assert (top_ref == top).mean() > (0.9 if kind == "q8" else 0.7)


def test_spill_to_disk_and_back_gives_the_same_output(model, tmp_path):
    toks = tokens(200, seed=7)
    base = dict(window=24, sinks=4, block_size=8, top_k=2, chunk=16, routing="token", block_kind="float16")
    ref_cache = make_cascade_cache(model, CascadeConfig(**base))
    ref = forward(model, ref_cache, toks, [60, 60] + [1] * 80)
    spill = tmp_path / "spill"
    cas = make_cascade_cache(model, CascadeConfig(**base, episodic_budget_mb=0.004, spill_dir=str(spill)))
    out = forward(model, cas, toks, [60, 60] + [1] * 80)
    assert np.array_equal(np.array(out), np.array(ref))
    assert [c.selection for c in cas] == [c.selection for c in ref_cache]
    s = cascade_stats(cas)
    assert s["blocks"]["on_disk"] > 0 and s["store"]["loads"] > 0
    assert s["bytes"]["episodic_memory"] <= 4000 + 2 * 2 * 2 * 8 * 16 * 2  # + the blocks in use
    files = list(spill.rglob("*.safetensors"))
    assert files
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(files[0].parent.stat().st_mode) == 0o700
    cas[0].store.close()
    assert not list(spill.rglob("*.safetensors"))


def test_spill_dir_that_cannot_be_made_is_a_clear_error(model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    from mlotspark.errors import StoreError

    cas = make_cascade_cache(model, CascadeConfig(window=16, sinks=2, block_size=8, top_k=1, episodic_budget_mb=0, spill_dir=str(blocker / "sub")))
    with pytest.raises(StoreError, match="spill"):
        forward(model, cas, tokens(60), [30, 30])


# ---------------------------------------------------------------- snapshots
def test_state_round_trips_exactly_and_resumes(model, tmp_path):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16, episodic_budget_mb=0.01, spill_dir=str(tmp_path / "s"))
    toks = tokens(190, seed=8)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, toks[:155], [64, 64, 22] + [1] * 5)  # saved mid-decode
    states = cascade_state(cas)
    # through files, as a persistence layer would store them
    for i, (arrays, meta) in enumerate(states):
        mx.save_safetensors(str(tmp_path / f"l{i}.safetensors"), arrays)
        (tmp_path / f"l{i}.json").write_text(json.dumps(meta))
    loaded = [
        (dict(mx.load(str(tmp_path / f"l{i}.safetensors"))), json.loads((tmp_path / f"l{i}.json").read_text()))
        for i in range(len(cas))
    ]
    restored = restore_cascade_cache(loaded, cfg)
    for (a1, m1), (a2, m2) in zip(states, cascade_state(restored)):
        assert m1 == m2
        assert a1.keys() == a2.keys()
        for name in a1:
            assert np.array_equal(np.array(a1[name]), np.array(a2[name])), name
    tail = toks[155:]
    out = forward(model, cas, tail, [1] * 25 + [10])
    again = forward(model, restored, tail, [1] * 25 + [10])
    np.testing.assert_array_equal(np.array(out), np.array(again))


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_trim_drops_the_newest_tokens_as_if_never_fed(model, cut):
    """A trimmed cascade continues exactly as one that never saw the dropped tokens
    (drafts rejected, a reply cut by a stop string); blocks left for the store stay."""
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, routing="sequence")
    toks, wrong = tokens(120, seed=4), tokens(cut, seed=5)
    ref = make_cascade_cache(model, cfg)
    forward(model, ref, toks[:100], [64, 36])
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, toks[:100], [64, 36])
    forward(model, cas, wrong, [cut])  # may seal a block: its tokens are old, valid ones
    assert all(c.trim(cut) == cut for c in cas)
    assert cas[0].offset == 100
    a = forward(model, ref, toks[100:], [20])
    b = forward(model, cas, toks[100:], [20])
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


def test_trim_past_working_memory_trims_nothing(model):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, tokens(100), [64, 36])
    n = cas[0].n_window
    assert cas[0].trim(n + 1) == 0 and cas[0].offset == 100  # the rest is in episodic blocks
    short = make_cascade_cache(model, cfg)
    forward(model, short, tokens(3), [3])  # all in the sinks
    assert all(c.trim(2) == 2 for c in short) and short[0].offset == 1
    a = forward(model, short, tokens(5, seed=9), [5])
    fresh = make_cascade_cache(model, cfg)
    b = forward(model, fresh, mx.concatenate([tokens(3)[:1], tokens(5, seed=9)]), [6])[:, 1:]
    np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)


def test_state_for_another_block_layout_is_refused(model):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, tokens(80), [40, 40])
    arrays, meta = cas[0].to_state()
    with pytest.raises(SnapshotError, match="block_size"):
        CascadeCache.from_state(arrays, meta, CascadeConfig(window=24, sinks=4, block_size=4, top_k=2))
    del arrays["win_k"]
    with pytest.raises(SnapshotError, match="win_k"):
        CascadeCache.from_state(arrays, meta, cfg)


# -------------------------------------------------------------------- stats
def test_stats_report_tiers_and_retrievals(model):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, tokens(130), [64, 64, 1, 1])
    s = cascade_stats(cas)
    assert s["tokens"]["total"] == 130
    assert s["blocks"]["total"] == len(cas) * s["tokens"]["episodic"] // cfg.block_size
    assert s["blocks"]["in_memory"] == s["blocks"]["total"] and s["blocks"]["on_disk"] == 0
    assert s["bytes"]["working"] > 0 and s["bytes"]["episodic_memory"] > 0
    assert 0 < s["retrieval"]["blocks_per_call"] <= cfg.top_k
    assert s["store"]["hits"] > 0 and s["store"]["hit_rate"] == 1.0
    json.dumps(s)
    assert cascade_stats(model.make_cache()) == {}


def test_flags_override_only_what_was_given():
    c = CascadeConfig.from_flags(8192, window=512, sinks=None, block_kind="q8", top_k=None)
    d = CascadeConfig.for_model(8192)
    assert (c.window, c.block_kind) == (512, "q8")
    assert (c.sinks, c.top_k, c.routing) == (d.sinks, d.top_k, d.routing)
    with pytest.raises(OptionError, match="'fast'"):
        CascadeConfig.from_flags(8192, routing="fast")


def test_cascade_flags_are_sized_from_the_loaded_models_context():
    """CLI flags become a config of the loaded model's own context (not a fixed 8k),
    and the one shared check refuses a span past it, naming the model."""
    from types import SimpleNamespace

    from mlotspark import Engine, GenerationOptions
    from mlotspark.memory.cascade import CascadeConfig, is_cascade
    from mlotspark.models.loader import LoadedModel

    model = Model(ModelArgs(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256, max_position_embeddings=2048))
    loaded = LoadedModel(model=model, tokenizer=None, config={}, source=SimpleNamespace(name="tiny", path="tiny"),
                         weights="float32", fingerprint="tiny", context_length=2048, supports_cascade=True)
    engine = Engine(loaded, GenerationOptions(), cascade={"window": 128})
    assert engine.caches.cascade == CascadeConfig.for_model(2048, window=128)
    assert is_cascade(engine.caches.make(10, engine.defaults)) and not is_cascade(None) and not is_cascade([])
    with pytest.raises(OptionError, match="trained context of 2048"):
        Engine(loaded, GenerationOptions(), cascade={"window": 2000, "sinks": 64})


def test_reading_many_spilled_blocks_holds_no_file_open(tmp_path):
    """``mx.load`` is lazy: each unevaluated array kept its file open, so a pass that read
    back thousands of spilled blocks (the question pass at 32k) ran out of descriptors."""
    import resource

    from mlotspark.memory.cascade.blocks import EpisodicStore

    store = EpisodicStore("float16", 0, str(tmp_path))  # budget 0: every block spills
    k = mx.random.normal((2, 8, 16))
    for i in range(300):
        store.add(0, i, 8 * i, k + i, k - i)
    assert store.counters.spills == 300
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))  # < 300 files
    try:
        payloads = [store.payload_of(store.blocks[(0, i)]) for i in range(300)]
        keys, _ = store.fetch(0, list(range(300)), mx.float32)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert len(payloads) == 300
    stored = (k + 299).astype(mx.float16).astype(mx.float32)  # float16 blocks
    np.testing.assert_array_equal(np.array(keys[:, 8 * 299 : 8 * 300]), np.array(stored))


@pytest.mark.parametrize("kind", ["float16", "q8"])
def test_peeking_at_keys_reads_spilled_blocks_without_counting_a_retrieval(tmp_path, kind):
    from mlotspark.memory.cascade.blocks import EpisodicStore

    k = mx.random.normal((2, 8, 64))
    store = EpisodicStore(kind, 3 * 2 * 2 * 8 * 64 * 2, str(tmp_path))  # ~3 of 10 blocks stay in memory
    for i in range(10):
        store.add(0, i, 8 * i, k + i, k - i)
    before = (dict(vars(store.counters)), store.resident_bytes, list(store._lru),
              [b.payload is None for b in store.blocks.values()])
    peeked = store.peek_keys(0, list(range(10)), mx.float32)
    after = (dict(vars(store.counters)), store.resident_bytes, list(store._lru),
             [b.payload is None for b in store.blocks.values()])
    assert before[0].pop("bytes_read") == 0 and after[0].pop("bytes_read") > 0  # spilled blocks were read
    assert after == before
    keys, _ = store.fetch(0, list(range(10)), mx.float32)
    np.testing.assert_array_equal(np.array(peeked), np.array(keys))
