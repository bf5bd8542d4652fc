"""Beam search, multiple returns, speculative decoding and KV cache kinds (tiny models)."""

from __future__ import annotations

import itertools
import math
import os
import stat

import mlotspark  # noqa: F401  (BLAS before MLX)
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from mlotspark.caches import policy as cache_policy
from mlotspark.decoding.beam import beam_search, sample_sequences
from mlotspark.caches.policy import KindProbe, choose_cache_kind, decide_cache_kind
from mlotspark.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from mlotspark.caches.kinds import KINDS, kv_bytes, make_cache
from mlotspark.decoding.speculative import DraftLength, SpeculativeConfig, sampling_distribution, speculative_generate_step, verify
from mlotspark.errors import OptionError
from mlotspark.caches.kv import KVCache
from mlotspark.options import GenerationOptions
from mlotspark.decoding.sampling import build_logits_processors, build_sampler
from tiny import prefilled, tiny_model, write_tiny_gguf


def greedy(model, prompt, n, cache=None, **opts):
    o = GenerationOptions(temperature=0, **opts)
    procs = build_logits_processors(o) or None
    steps = generate_step(mx.array(prompt), model, max_tokens=n, logits_processors=procs,
                          prompt_cache=cache if cache is not None else model.make_cache())
    return [t for t, _ in steps]


def speculate(model, prompt, n, drafter, cache=None, stats=None, **opts):
    o = GenerationOptions(**{"temperature": 0, **opts})
    cache = prefilled(model, prompt, cache if cache is not None else model.make_cache())
    steps = speculative_generate_step(
        mx.array(prompt), model, drafter=drafter, options=o, max_tokens=n,
        logits_processors=build_logits_processors(o) or None, prompt_cache=cache, stats=stats)
    return [t for t, _ in steps]


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper chi-square quantile (Wilson-Hilferty); z = 3.09 is p = 0.001."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(observed: np.ndarray, expected: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic, cells with expectation < 5 pooled; (statistic, df)."""
    big = expected >= 5
    o, e = list(observed[big]), list(expected[big])
    if (~big).any():
        o.append(observed[~big].sum())
        e.append(expected[~big].sum())
    o_, e_ = np.array(o), np.array(e)
    return float(((o_ - e_) ** 2 / np.maximum(e_, 1e-12)).sum()), len(o_) - 1


# ------------------------------------------------------------ beam search
class MarkovModel:
    """A hand-written 'model': the next-token distribution depends on the last token.

    Token 0 is EOS. From the start token 3, greedy takes 1 (p .5), but 2 (p .4) is
    followed by EOS with p .9, so the best short hypothesis is [2].
    """

    P = {
        3: [0.10, 0.50, 0.40, 0.00],
        1: [0.10, 0.35, 0.30, 0.25],
        2: [0.90, 0.05, 0.05, 0.00],
        0: [1.00, 0.00, 0.00, 0.00],
    }

    def __init__(self):
        table = np.array([self.P[i] for i in range(4)], dtype=np.float32)
        self.logp = mx.array(np.log(np.maximum(table, 1e-30)))
        self.layers = [None]

    def __call__(self, tokens, cache=None):
        B, L = tokens.shape
        for c in cache or ():
            c.update_and_fetch(mx.zeros((B, 1, L, 4)), mx.zeros((B, 1, L, 4)))
        return self.logp[tokens]  # (B, L, V)


def test_beam_search_hand_checked_scores():
    m = MarkovModel()
    hyps = beam_search(m, [3], [KVCache()], num_beams=2, max_tokens=3, eos={0}, num_return=2)
    # [2, EOS]: log(.4 * .9) over 2 tokens; [1, 2, EOS]: log(.5 * .3 * .9) over 3.
    assert [h.tokens for h in hyps] == [[2], [1, 2]]
    assert hyps[0].logprob == pytest.approx(math.log(0.36), abs=1e-5)
    assert hyps[0].score == pytest.approx(math.log(0.36) / 2, abs=1e-5)
    assert hyps[1].score == pytest.approx(math.log(0.135) / 3, abs=1e-5)
    assert all(h.finish_reason == "stop" for h in hyps)
    # length_penalty 0: plain summed logprobs
    hyps = beam_search(m, [3], [KVCache()], num_beams=2, max_tokens=3, eos={0}, num_return=2, length_penalty=0.0)
    assert [round(h.score, 4) for h in hyps] == [round(math.log(0.36), 4), round(math.log(0.135), 4)]


def test_one_beam_is_greedy_and_greedy_misses_the_best():
    m = MarkovModel()
    one = beam_search(m, [3], [KVCache()], num_beams=1, max_tokens=3, eos={0})
    assert one[0].tokens == [1, 1, 1] and one[0].finish_reason == "length"
    assert one[0].score == pytest.approx(math.log(0.5 * 0.35 * 0.35) / 3, abs=1e-5)
    model = tiny_model(hidden_size=128, vocab_size=64)
    for prompt in ([5, 6, 7], [9], [1, 2, 3, 1, 2, 3, 1]):
        hyp = beam_search(model, prompt, prefilled(model, prompt, model.make_cache()), num_beams=1, max_tokens=12,
                          eos={2})[0]
        assert hyp.tokens == greedy(model, prompt, 12)


def test_wider_beams_never_score_worse_and_num_return_is_bounded():
    model = tiny_model(hidden_size=128, vocab_size=64)
    prompt = [4, 8, 15, 16, 23, 42]
    scores = [beam_search(model, prompt, prefilled(model, prompt, model.make_cache()), num_beams=b, max_tokens=6,
                          eos={2})[0].score
              for b in (1, 4)]
    assert scores[1] >= scores[0] - 1e-6
    with pytest.raises(OptionError, match="num_return_sequences 3"):
        beam_search(model, prompt, model.make_cache(), num_beams=2, max_tokens=4, eos={2}, num_return=3)


def test_beam_search_with_quantized_cache_runs():
    model = tiny_model(hidden_size=128, vocab_size=64)
    hyps = beam_search(model, [1, 2, 3], prefilled(model, [1, 2, 3], make_cache(model, "q8")), num_beams=3, max_tokens=5, eos={2}, num_return=3)
    assert len(hyps) == 3 and all(len(h.tokens) <= 5 for h in hyps)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_sampled_returns_are_independent_and_scored():
    model = tiny_model(hidden_size=128, vocab_size=64)
    mx.random.seed(3)
    hyps = sample_sequences(model, [1, 2, 3], prefilled(model, [1, 2, 3], model.make_cache()), n=4, max_tokens=8, eos={2},
                            sampler=build_sampler(GenerationOptions(temperature=1.0)))
    assert len(hyps) == 4 and len({tuple(h.tokens) for h in hyps}) > 1
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


# ------------------------------------------------- speculative: greedy exactness
def test_prompt_lookup_proposes_what_followed_the_latest_match():
    d = PromptLookupDrafter(ngram_max=3, ngram_min=2)
    ctx = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2]
    assert d.propose(ctx, 3)[0] == [3, 5, 7]  # the latest "1 2" was followed by 3 5 7
    assert d.propose(ctx + [6], 3)[0] == []  # "2 6" never occurred
    assert PromptLookupDrafter().propose([1, 2, 1, 2], 5)[0] == [1, 2]  # overlapping copy is fine


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_speculative_greedy_equals_plain_greedy(penalty):
    model = tiny_model(hidden_size=128, vocab_size=64)
    draft = tiny_model(seed=5, hidden_size=64, vocab_size=64)
    for prompt in ([3, 4, 5, 6, 3, 4, 5], [7, 1, 9, 30, 2], list(range(10, 30)) * 2):
        ref = greedy(model, prompt, 24, repetition_penalty=penalty)
        for drafter in (PromptLookupDrafter(), DraftModelDrafter(draft), DraftModelDrafter(model)):
            stats: dict = {}
            out = speculate(model, prompt, 24, drafter, stats=stats, repetition_penalty=penalty)
            assert out == ref, drafter.name
            assert stats["speculative"]["target_calls"] <= 25


def test_self_draft_accepts_everything_in_few_target_calls():
    model = tiny_model(hidden_size=128, vocab_size=64)
    stats: dict = {}
    out = speculate(model, [1, 2, 3], 30, DraftModelDrafter(model), stats=stats)
    s = stats["speculative"]
    assert out == greedy(model, [1, 2, 3], 30)
    assert s["acceptance_rate"] > 0.9 and s["target_calls"] < 12 and s["tokens_per_call"] > 2.5


def test_cache_holds_exactly_the_fed_tokens_after_an_early_stop():
    model = tiny_model(hidden_size=128, vocab_size=64)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    cache = prefilled(model, prompt, model.make_cache())
    steps = speculative_generate_step(mx.array(prompt), model, drafter=DraftModelDrafter(model),
                                      options=GenerationOptions(temperature=0), max_tokens=40, prompt_cache=cache)
    got = [next(steps)[0] for _ in range(5)]  # stop in the middle of an accepted run
    steps.close()
    assert cache[0].offset == len(prompt) + len(got)
    # continuing from that cache gives what plain greedy gives after the same tokens
    for c in cache:
        c.trim(1)  # re-feed the last token to get its logits
    assert greedy(model, [got[-1]], 6, cache=cache) == greedy(model, prompt, 11)[5:]


def test_max_tokens_is_respected_and_every_token_is_fed():
    model = tiny_model(hidden_size=128, vocab_size=64)
    prompt = [1, 2, 1, 2, 1, 2]
    for n in (1, 2, 3, 7):
        cache = model.make_cache()
        out = speculate(model, prompt, n, PromptLookupDrafter(), cache=cache)
        assert out == greedy(model, prompt, n)
        assert cache[0].offset == len(prompt) + n  # as generate_step: each yielded token fed


def test_draft_length_adapts_and_pauses_on_low_acceptance():
    length = DraftLength(SpeculativeConfig(k_init=4, k_max=8, warmup=2, cooldown=3))
    length.update(4, 4)
    assert length.k == 6
    length.update(6, 6)
    assert length.k == 8  # capped
    ks = []
    for _ in range(30):  # every draft rejected
        k = length.next_k()
        ks.append(k)
        if k:
            length.update(k, 0)
    first_pause = ks.index(0)
    assert ks[first_pause : first_pause + 4] == [0, 0, 0, 1]  # 3 plain steps, then it tries again
    assert length.pauses >= 2 and ks.count(0) > 3 + 6 - 1  # pauses double in length


# ------------------------------------------------ speculative: sampling exactness
def test_verify_greedy_and_residual_rule():
    lp = mx.log(mx.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3], [0.2, 0.2, 0.6]]))
    assert verify(lp, [1, 0], None, None) == (2, 2)  # both drafts are the argmax; bonus 2
    assert verify(lp, [1, 2], None, None) == (1, 0)  # 2 is not the argmax: corrected to 0
    # sampling, point-mass drafts: the first emitted token must follow p[0] exactly
    dist = sampling_distribution(GenerationOptions(temperature=1.0, top_p=1.0))
    mx.random.seed(11)
    n = 3000
    counts = np.zeros(3)
    for _ in range(n):
        m, tok = verify(lp, [2], None, dist)
        counts[2 if m == 1 else tok] += 1
    stat_, df = chi2(counts, np.array([0.1, 0.7, 0.2]) * n)
    assert stat_ < chi2_critical(df)


def _exact_joint(model, prompt, V, options):
    """P(t1, t2, t3) under plain sampling, from V^2 teacher-forced passes."""
    dist = sampling_distribution(options)
    seqs = list(itertools.product(range(V), repeat=2))
    logits = model(mx.array([prompt + list(s) for s in seqs]))
    P = np.array(dist(logits - mx.logsumexp(logits, axis=-1, keepdims=True)))  # (V^2, L + 2, V)
    L = len(prompt)
    joint = np.zeros((V, V, V))
    for i, (a, b) in enumerate(seqs):
        joint[a, b] = P[i, L - 1, a] * P[i, L, b] * P[i, L + 1]
    return joint


@pytest.mark.parametrize("which", ["prompt_lookup", "draft"])
def test_speculative_sampling_matches_the_target_distribution(which):
    V, n = 8, 600
    model = tiny_model(vocab_size=V)
    draft = tiny_model(seed=1, vocab_size=V)
    prompt = [1, 2, 3, 4, 1, 2, 3]  # lookup drafts "4 1 ..."; the model gives 4 p ~ .8
    opts = dict(temperature=0.9, top_k=6, top_p=1.0)
    joint = _exact_joint(model, prompt, V, GenerationOptions(**opts))
    mx.random.seed(1234)
    counts = np.zeros((V, V, V))
    stats: dict = {}
    for _ in range(n):
        drafter = PromptLookupDrafter() if which == "prompt_lookup" else DraftModelDrafter(draft)
        a, b, c = speculate(model, prompt, 3, drafter, stats=stats, **opts)
        counts[a, b, c] += 1
    assert stats["speculative"]["drafted"] > 0
    for axes in ((1, 2), (0, 2), (0, 1), (2,)):  # t1, t2, t3 and the pair (t1, t2)
        stat_, df = chi2(counts.sum(axes).ravel(), joint.sum(axes).ravel() * n)
        assert stat_ < chi2_critical(df), (axes, stat_, df)


# ------------------------------------------------------------ KV cache kinds
def test_cache_kinds_bytes_and_outputs():
    model = tiny_model(hidden_size=128, vocab_size=64)
    prompt = list(range(3, 40))
    ref = model(mx.array(prompt)[None], cache=model.make_cache())
    sizes = {}
    for kind in KINDS:
        cache = make_cache(model, kind)
        out = model(mx.array(prompt)[None], cache=cache)
        assert cache[0].offset == len(prompt)
        sizes[kind] = sum(c.nbytes for c in cache)
        assert sizes[kind] == kv_bytes(model, kind, len(prompt))
        err = mx.abs(out - ref).max().item()
        assert err < {"float16": 1e-2, "q8": 5e-2, "q4": 0.5}[kind], (kind, err)
    assert sizes["float16"] > sizes["q8"] > sizes["q4"]
    with pytest.raises(OptionError, match="'q3'"):
        make_cache(model, "q3")


def test_quantized_cache_trims_for_speculation():
    model = tiny_model(hidden_size=128, vocab_size=64)
    prompt = [3, 4, 5, 6, 3, 4, 5]
    ref = greedy(model, prompt, 16, cache=make_cache(model, "q8"))
    assert speculate(model, prompt, 16, PromptLookupDrafter(), cache=make_cache(model, "q8")) == ref


def _probes(**steps):
    q = {"float16": (0.0, 0.0), "q8": (0.002, 0.001), "q4": (0.03, 0.02)}
    return {k: KindProbe(k, q[k][0], q[k][1], steps.get(k, 0.010)) for k in KINDS}


def test_auto_policy_budget_gates_and_speed():
    need = {"float16": 4_000_000, "q8": 2_200_000, "q4": 1_200_000}
    assert choose_cache_kind(_probes(), need, 10**9, 1000).kind == "float16"  # ample
    assert choose_cache_kind(_probes(), need, 3_000_000, 1000).kind == "q8"  # tight
    assert choose_cache_kind(_probes(), need, 1_500_000, 1000).kind == "q4"
    assert choose_cache_kind(_probes(q8=0.005), need, 10**9, 1000).kind == "q8"  # clearly faster
    assert choose_cache_kind(_probes(q8=0.0095), need, 10**9, 1000).kind == "float16"  # a tie
    with pytest.raises(OptionError, match=r"no KV cache kind fits the budget of 1\.0 MB"):
        choose_cache_kind(_probes(), need, 1_000_000, 1000)
    bad = _probes()
    bad["q4"] = KindProbe("q4", 0.4, 0.3, 0.01)
    with pytest.raises(OptionError, match="no kind keeps quality.*q4 fails the quality gate"):
        choose_cache_kind(bad, need, 1_500_000, 1000)


def test_auto_probes_once_per_model_and_persists(monkeypatch, _isolated_home):
    model = tiny_model(hidden_size=128, vocab_size=64)
    calls = []
    real = cache_policy.probe_cache_kinds

    def counted(model_, ids, *a, **kw):
        calls.append(len(ids))
        ticks = itertools.count()
        return real(model_, ids, *a, clock=lambda: next(ticks) * 0.01, **kw)  # equal step times

    monkeypatch.setattr(cache_policy, "probe_cache_kinds", counted)
    ids = list(range(3, 60))
    per_token = {k: kv_bytes(model, k, 2048) for k in KINDS}
    kw = dict(fingerprint="tinyfp", setup="float32@cpu", tokens=2048, probe_ids=ids)
    d1 = decide_cache_kind(model, None, budget_bytes=10**9, **kw)
    assert d1.kind == "float16" and len(calls) == 1
    d2 = decide_cache_kind(model, None, budget_bytes=per_token["q8"], **kw)
    assert d2.kind == "q8" and len(calls) == 1  # the stored probe is reused
    with pytest.raises(OptionError, match="budget"):
        decide_cache_kind(model, None, budget_bytes=per_token["q4"] // 2, **kw)
    path = _isolated_home / "decoding" / "cache_kinds.json"
    assert path.exists() and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "tinyfp" in path.read_text()


def test_auto_on_a_head_size_quantized_kinds_cannot_run_falls_back_with_a_note(_isolated_home):
    """Head dimension 48 (not a multiple of 32): q8/q4 cannot run, so ``auto`` chooses
    among the rest and says why; a model where no kind runs gets its own cache."""
    from mlx_lm.models import llama as mlx_llama

    from mlotspark.caches.policy import PLAIN

    ids = list(range(3, 60))
    model = tiny_model(hidden_size=96, num_attention_heads=2, num_key_value_heads=1, vocab_size=64)
    d = decide_cache_kind(model, None, fingerprint="h48", setup="float32@cpu", budget_bytes=10**9,
                          tokens=512, probe_ids=ids)
    assert d.kind == "float16" and set(d.probes) == {"float16"}
    assert "q8 cannot run: head dimension 48 is not a multiple of 32" in d.reason
    assert "head dimension 48" in d.rejected["q4"]
    # mlx-lm's own llama in float32: float16 KV does not run either, so the plain cache.
    args = mlx_llama.ModelArgs(model_type="llama", hidden_size=96, num_hidden_layers=1, intermediate_size=64,
                               num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=64)
    other = mlx_llama.Model(args)
    d = decide_cache_kind(other, None, fingerprint="h48-mlx", setup="float32@cpu", budget_bytes=10**9,
                          tokens=512, probe_ids=ids)
    assert d.kind == PLAIN and "no other kind runs here" in d.reason and "head dimension 48" in d.reason


# ------------------------------------------------------------ through the Engine
@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    from mlotspark.engine import Engine

    d = tmp_path_factory.mktemp("tinyengine")
    path = write_tiny_gguf(d / "tiny.gguf", tiny_model(hidden_size=128))
    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(d / "home")  # loading runs before the per-test home exists
    try:
        engine = Engine.load(str(path), progress=False, temperature=0, max_tokens=16)
    finally:
        if old is None:
            os.environ.pop("MLOTSPARK_HOME", None)
        else:
            os.environ["MLOTSPARK_HOME"] = old
    engine.tiny_path = path
    yield engine
    engine.close()


def test_engine_routes_beams_speculation_and_cache_kinds(tiny_engine):
    e = tiny_engine
    ref = e.generate("abcabcabc", raw=True)
    spec = e.generate("abcabcabc", raw=True, speculative="prompt_lookup")
    assert spec.tokens == ref.tokens and spec.stats.extra["speculative"]["target_calls"] >= 1
    drafted = e.generate("abcabcabc", raw=True, speculative="draft", draft_model=str(e.tiny_path))
    assert drafted.tokens == ref.tokens and drafted.stats.extra["speculative"]["acceptance_rate"] > 0.8
    beams = e.generate("abcabcabc", raw=True, num_beams=3, num_return_sequences=2)
    assert len(beams.sequences) == 2 and beams.text == beams.sequences[0].text
    assert beams.sequences[0].score >= beams.sequences[1].score
    one = e.generate("abcabcabc", raw=True, num_beams=1, num_return_sequences=1)
    assert one.tokens == ref.tokens and one.sequences == []
    samples = e.generate("abcabcabc", raw=True, num_return_sequences=3, temperature=1.0, seed=7)
    assert len(samples.sequences) == 3
    for kind in ("float16", "q8"):
        assert e.generate("abcabcabc", raw=True, cache_kind=kind).tokens == ref.tokens
    with pytest.raises(OptionError, match="num_return_sequences 3"):
        e.generate("abc", raw=True, num_beams=2, num_return_sequences=3)


def test_draft_model_with_another_vocabulary_is_refused(tiny_engine, tmp_path):
    other = write_tiny_gguf(tmp_path / "other.gguf", tiny_model(hidden_size=128, vocab_size=320))
    with pytest.raises(OptionError, match="other.gguf.*vocabulary"):
        tiny_engine.generate("abc", raw=True, speculative="draft", draft_model=str(other))


def test_cli_decoding_flags_reach_the_options(monkeypatch):
    from mlotspark.cli.entry import build_parser
    from mlotspark.cli.generate import _decoding_options

    args = build_parser().parse_args(["generate", "--beams", "4", "--length-penalty", "0.5",
                                      "--num-return-sequences", "2", "--cache-kind", "q8"])
    opts = GenerationOptions().merged(**_decoding_options(args))
    assert (opts.num_beams, opts.length_penalty, opts.num_return_sequences, opts.cache_kind) == (4, 0.5, 2, "q8")
    # Speculation cannot join beams (refused: tests/test_option_conflicts.py), so alone:
    args = build_parser().parse_args(["generate", "--speculative", "prompt_lookup"])
    assert GenerationOptions().merged(**_decoding_options(args)).speculative == "prompt_lookup"
