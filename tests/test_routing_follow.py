"""``follow``: each retrieved block brings the block after it (a needle's value crosses block boundaries);
``lead``: the block before it (a needle whose value scored best and whose key did not)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from test_cascade import greedy, model, tokens  # noqa: F401  (the tiny model fixture)

from mlotspark.errors import OptionError
from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, cascade_stats, make_cascade_cache
from mlotspark.memory.cascade.routing import top_blocks


def test_each_block_brings_its_successor_and_k_is_exact():
    rel = mx.array([[0.0, 0.9, 0.1, 0.0, 0.8, 0.0, 0.0, 0.7], [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.6, 0.0]])
    assert top_blocks(rel, 4, follow=0)[0] == (1, 2, 4, 7)  # plain top 4
    got = top_blocks(rel, 4, follow=1)
    assert got[0] == (1, 2, 4, 5)  # 1 (+2), 4 (+5): the budget is spent in pairs, best first
    assert got[1] == (0, 1, 6, 7)
    assert top_blocks(rel, 3, follow=1)[0] == (1, 2, 4)  # an odd budget ends on a block without its successor
    assert top_blocks(rel, 3, follow=2)[1] == (0, 6, 7)  # the last block has no successor: the next best fills
    assert all(len(h) == 5 for h in top_blocks(rel, 5, follow=3))


def test_lead_brings_the_block_before_and_the_budget_keeps_the_chosen_block_first():
    rel = mx.array([[0.0, 0.9, 0.1, 0.0, 0.8, 0.0, 0.0, 0.7]])
    assert top_blocks(rel, 4, follow=0, lead=1)[0] == (0, 1, 3, 4)  # 1 (+0), 4 (+3)
    assert top_blocks(rel, 4, follow=1, lead=1)[0] == (0, 1, 2, 4)  # 1 (+0, +2), then 4 itself, not its neighbours
    assert top_blocks(rel, 5, follow=1, lead=1)[0] == (0, 1, 2, 3, 4)  # 4, then the block before it
    assert top_blocks(rel, 2, follow=0, lead=3)[0] == (0, 1)  # block 0 has nothing before it
    assert top_blocks(rel, 4, follow=0, lead=1, exclude={3})[0] == (0, 1, 4, 7)  # 3 excluded: 4 alone, then 7


def test_follow_and_lead_are_checked():
    with pytest.raises(OptionError, match="follow -1"):
        CascadeConfig(follow=-1)
    with pytest.raises(OptionError, match="lead -1"):
        CascadeConfig(lead=-1)


@pytest.mark.parametrize("follow, lead", [(0, 0), (1, 0), (2, 0), (1, 1)])
def test_equals_full_attention_while_it_fits(model, follow, lead):  # noqa: F811
    cfg = CascadeConfig(window=180, sinks=8, block_size=8, top_k=4, chunk=24, routing="question", follow=follow,
                        lead=lead)
    prompt = tokens(90, seed=3)
    ref_toks, ref_lp = greedy(model, model.make_cache(), prompt, 60, chunk=32)
    cas = make_cascade_cache(model, cfg)
    toks, lp = greedy(model, cas, prompt, 60, chunk=32)
    assert toks == ref_toks
    np.testing.assert_allclose(np.array(mx.stack(lp)), np.array(mx.stack(ref_lp)), atol=1e-4)
    assert cascade_stats(cas)["tokens"]["episodic"] == 0


def _selection_for_a_key_at(token: int, follow: int, lead: int = 0) -> tuple[tuple[int, ...], ...]:
    """The blocks a question attends when it matches the remembered token ``token`` (counted
    from the first block) far better than anything else: 12 blocks of 4, top_k 2."""
    Hq, Hkv, D, B = 4, 2, 16, 4
    cfg = CascadeConfig(window=8, sinks=2, block_size=B, top_k=2, routing="question", rolling_window=4, chunk=64,
                        follow=follow, lead=lead)
    cache = CascadeCache(cfg, 0, EpisodicStore.from_config(cfg))
    rng = np.random.default_rng(1)
    u = rng.standard_normal(D).astype(np.float32)
    u /= np.linalg.norm(u)
    n = cfg.sinks + 12 * B + cfg.window
    k = 0.3 * rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    k[0, :, cfg.sinks + token] = 4.0 * u
    q = 0.3 * rng.standard_normal((1, Hq, n, D)).astype(np.float32)
    q[0, :, -4:] = 3.0 * u
    v = rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    cache.attend(mx.array(q), mx.array(k), mx.array(v), rope=nn.RoPE(D, traditional=True), scale=D**-0.5)
    cache.settle()
    qd = 0.5 * rng.standard_normal((1, Hq, 1, D)).astype(np.float32)
    kd = 0.3 * rng.standard_normal((1, Hkv, 1, D)).astype(np.float32)
    cache.attend(mx.array(qd), mx.array(kd), mx.array(kd), rope=nn.RoPE(D, traditional=True), scale=D**-0.5)
    return cache.selection


def test_the_value_after_the_matching_key_is_attended():
    """The question matches a key at the end of block 5; the value sits at the start of block 6."""
    assert all(head == (5, 6) for head in _selection_for_a_key_at(5 * 4 + 3, follow=1))


@pytest.mark.parametrize("lead, attended", [(0, (6, 7)), (1, (5, 6))])
def test_the_key_before_the_best_block_is_attended_with_lead(lead, attended):
    """The question matches the first token of block 6 best (the value); with lead 1 block 5
    (where its key ends) comes with it instead of block 7."""
    assert all(head == attended for head in _selection_for_a_key_at(6 * 4, follow=1, lead=lead))


def test_cli_routing_choices_are_the_configs():
    """``--routing`` spells its choices out (the CLI stays MLX-free); they must be ``ROUTINGS``."""
    from mlotspark.cli.entry import build_parser
    from mlotspark.memory.cascade.config import ROUTINGS

    args = build_parser().parse_args(["generate", "-p", "hi", "--routing", "question"])
    assert args.routing == "question"
    sub = next(a for a in build_parser()._subparsers._group_actions[0].choices["generate"]._actions if a.dest == "routing")
    assert tuple(sub.choices) == ROUTINGS
