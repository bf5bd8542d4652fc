"""The RULER-style suite: generated cases (fast) and one real-model case through the cascade (slow)."""

from __future__ import annotations

import pytest

from mlotspark.bench.ruler import (
    TASKS,
    _haystack,
    depths,
    haystack_sentences,
    make_case,
    messages,
    more_sentences,
    package_sentences,
)
from mlotspark.errors import OptionError


def words(text: str) -> int:
    return len(text.split())


def test_cases_are_seeded_varied_and_hold_their_answers():
    for task in TASKS:
        a = make_case(task, 1500, 0.3, seed=7, count_tokens=words)
        assert a == make_case(task, 1500, 0.3, seed=7, count_tokens=words)  # same seed, same case
        assert a.text != make_case(task, 1500, 0.3, seed=8, count_tokens=words).text
        assert abs(words(a.text) - 1500) <= 60, (task, words(a.text))
        assert all(n in a.text for n in a.needles) and a.answers
        assert a.score(" ".join(a.answers)) == 1.0 and a.score("no idea") == 0.0
        haystack = a.text.split("\n\n")[1]
        sentences = haystack.split(". ")
        assert len(set(sentences)) > 0.95 * len(sentences)  # natural text, not repeated filler
    multi = make_case("niah_multivalue", 800, 0.5, seed=1, count_tokens=words)
    assert len(multi.answers) == 4 and multi.score(multi.answers[0]) == 0.25
    vt = make_case("vt", 800, 0.5, seed=1, count_tokens=words)
    assert len(vt.answers) == 5 and f"VAR {vt.answers[1]} = {vt.answers[0]}." in vt.text


def test_needle_depth_is_where_asked():
    text = make_case("sentence", 3000, 0.25, seed=3, count_tokens=words).text
    needle = make_case("sentence", 3000, 0.25, seed=3, count_tokens=words).needles[0]
    assert 0.2 < text.index(needle) / len(text) < 0.3
    assert depths(4) == [0.125, 0.375, 0.625, 0.875]
    assert len(haystack_sentences()) > 400


def _first_corpus_haystack(rng, n_chars):
    """``_haystack`` as it was before the docstrings were added (commit 76ae927)."""
    paragraphs = haystack_sentences()
    start = rng.randrange(len(paragraphs))
    out, size, i = [], 0, start
    while size < n_chars:
        for s in paragraphs[i % len(paragraphs)]:
            out.append(s)
            size += len(s) + 1
        i += 1
    return out


def test_long_haystacks_go_on_with_the_stdlib_docstrings_without_repeating():
    """Past pydoc's topics (~180k characters) the haystack takes the standard library's
    docstrings, then the installed packages': a 900k-character haystack (~200k tokens)
    repeats no sentence but pydoc's own few, and a short one is unchanged by it (same
    seeds, same cases as before)."""
    import random

    topics = sum(len(s) + 1 for p in haystack_sentences() for s in p)
    assert sum(len(s) + 1 for p in more_sentences() for s in p) > 3 * topics
    for seed in range(5):  # within pydoc's topics, the same haystacks as before (the cases measured)
        assert _haystack(random.Random(seed), topics - 2000) == _first_corpus_haystack(random.Random(seed), topics - 2000)
    sentences = _haystack(random.Random(5), 900_000)
    assert sum(len(s) + 1 for s in sentences) >= 900_000 and package_sentences.read  # all three tiers
    first = {s for p in haystack_sentences() for s in p}
    more = [s for p in more_sentences() for s in p]
    assert len(set(more)) == len(more) and not first & set(more)
    # Only pydoc's own few repeated sentences recur (as in every case before).
    repeats = len(sentences) - len(set(sentences))
    assert repeats <= sum(len(p) for p in haystack_sentences()) - len(first)


def test_bad_values_are_named():
    with pytest.raises(OptionError, match="unknown RULER task 'niah'"):
        make_case("niah", 1000, 0.5, 0, words)
    with pytest.raises(OptionError, match="needle depth 1.5"):
        make_case("vt", 1000, 1.5, 0, words)
    with pytest.raises(OptionError, match="RULER length 10"):
        make_case("vt", 10, 0.5, 0, words)


def test_the_suite_answers_through_the_engine_path():
    """The RULER suite's answer is a user's request: the same tokens and the same number
    of question passes as ``engine.submit`` with the engine's own cascade."""
    from test_cache_interface import CASCADE, _cascade_engine, _prompt

    from mlotspark.bench.ruler import answer

    engine = _cascade_engine()
    try:
        ids = _prompt(150, seed=11)
        suite = answer(engine, ids, "cascade", engine.caches.cascade, 6)
        user = engine.submit(prompt_ids=ids, max_tokens=6).result()  # the engine's cascade (forced)
        assert suite.stats.extra["cascade"]["question_passes"] == user.stats.extra["cascade"]["question_passes"] == 1
        assert suite.tokens == user.tokens
        streaming = answer(engine, ids, "streaming", engine.caches.cascade, 6)
        assert streaming.stats.extra["cascade"]["question_passes"] == 0  # top_k 0: nothing to choose
        assert CASCADE["window"] == engine.caches.cascade.window
        with pytest.raises(OptionError, match="full attention over 150 tokens"):
            answer(engine, ids, "full", engine.caches.cascade, 6)  # this engine forces the cascade
        with pytest.raises(OptionError, match="unknown RULER mode 'fast'"):
            answer(engine, ids, "fast", engine.caches.cascade, 6)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def multikey_past_the_window(default_gguf):
    """niah_multikey at 1024 tokens, four times a 256-token window (the conformance matrix's
    cascade cell's), needle at depth 0.25, on the default model's engine: ``(engine, case,
    ids, config)``. More than 512 tokens are evicted, and all of them fit the default top_k
    blocks."""
    from mlotspark.engine import Engine
    from mlotspark.memory.cascade import CascadeConfig

    engine = Engine.load(str(default_gguf), progress=False)
    config = CascadeConfig.for_model(engine.loaded.context_length, window=256)
    case = make_case("niah_multikey", 4 * config.window, 0.25, seed=2048, count_tokens=lambda t: len(engine.encode(t)))
    ids = engine.encode(case.text)
    assert len(ids) > config.sinks + config.window + 512  # the needle is evicted from the window
    yield engine, case, ids, config
    engine.close()


@pytest.mark.slow
def test_real_model_multikey_past_the_window(multikey_past_the_window):
    """Found through the cascade — through the engine, as the RULER suite and a user run it ..."""
    from mlotspark.bench.ruler import answer

    engine, case, ids, config = multikey_past_the_window
    got = answer(engine, ids, "cascade", config, 32)
    # ~700 evicted tokens are at most top_k blocks: all attended, nothing for the question pass to choose.
    assert got.stats.extra["cascade"]["tokens"]["episodic"] <= config.top_k * config.block_size
    assert got.stats.extra["cascade"]["question_passes"] == 0
    assert case.score(got.text) == 1.0, got.text


@pytest.mark.slow
def test_real_model_multikey_past_the_window_is_lost_by_sinks_and_window(multikey_past_the_window):
    """... and lost with sinks + window only."""
    from mlotspark.bench.ruler import answer

    engine, case, ids, config = multikey_past_the_window
    assert case.score(answer(engine, ids, "streaming", config, 32).text) == 0.0


def test_capture_report_ranks_each_needle_as_the_pass_scored(tmp_path):
    # ruler_capture.py's report: each needle's blocks, pinned or not, and their rank under
    # the consensus the case ran with (mass ** question_sharpen summed over layers and heads).
    import json
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from ruler_capture import report

    mass = np.zeros((2, 2, 6), dtype=np.float32)
    mass[0, 0] = [0.1, 0.5, 0.2, 0.0, 0.3, 0.0]
    mass[1, 0] = [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]  # block 1: two heads a little, best by the sum
    mass[1, 1] = [0.0, 0.0, 0.0, 0.9, 0.0, 0.0]  # block 3: one confident head, best when cubed
    record = {"task": "niah_multikey", "tokens": 900, "depth": 0.5, "score": 0.0, "reply": "is 111.",
              "answers": ["222"], "cfg": {"question_sharpen": 1}}
    path = tmp_path / "case.npz"
    np.savez_compressed(path, mass=mass, chosen=np.array([1, 2]), n_blocks=6, sinks=4, block_size=8,
                        needle_blocks=np.array([[3, 3], [1, 2], [-1, -1]]), wanted=np.array([1, 0, 0]),
                        record=json.dumps(record))
    lines = report(path).splitlines()
    assert "6 blocks, 2 pinned; score 0.0" in lines[0] and "(answer 222)" in lines[0]
    assert lines[1] == "  needed: blocks 3-3, pinned 0/1, rank 1"  # 0.9 < 0.5 + 0.5
    assert lines[2] == "  look-alike: blocks 1-2, pinned 2/2, rank 0, 3"
    assert lines[3].startswith("  look-alike: in sinks or window")
    record["cfg"]["question_sharpen"] = 3
    np.savez_compressed(path, mass=mass, chosen=np.array([1, 2]), n_blocks=6, sinks=4, block_size=8,
                        needle_blocks=np.array([[3, 3]]), wanted=np.array([1]), record=json.dumps(record))
    assert report(path).splitlines()[1].endswith("rank 0")
    assert report(path, sharpen=1).splitlines()[1].endswith("rank 1")  # another rule, the same masses
    per_query = np.zeros((2, 2, 3, 6), dtype=np.float32)  # --capture-queries: the largest query's share counts
    per_query[:, :, 0] = mass
    per_query[1, 1, 2, 3] = 0.2  # below that pair's largest (0.9): changes nothing
    np.savez_compressed(path, mass=per_query, chosen=np.array([1, 2]), n_blocks=6, sinks=4, block_size=8,
                        needle_blocks=np.array([[3, 3]]), wanted=np.array([1]), record=json.dumps(record))
    assert report(path).splitlines()[1].endswith("rank 0") and report(path, 1).splitlines()[1].endswith("rank 1")


def test_capture_report_says_what_a_rule_taking_blocks_around_would_pin(tmp_path):
    # --around BEFORE AFTER: a needle split over two blocks whose second scores best is
    # whole only when the block before the best one comes with it.
    import json
    import sys
    from pathlib import Path

    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from ruler_capture import pinned_by, report

    score = np.array([0.0, 0.1, 0.9, 0.0, 0.5, 0.2])
    assert pinned_by(score, 4, 0, 1) == {2, 3, 4, 5}  # follow 1: each best block and the next
    assert pinned_by(score, 4, 1, 1) == {1, 2, 3, 4}  # the block before too, four in all
    assert pinned_by(score, 2, 0, 0) == {2, 4}
    record = {"task": "niah_single", "tokens": 900, "depth": 0.5, "score": 0.0, "reply": "is 1.",
              "answers": ["2"], "cfg": {"question_sharpen": 1, "top_k": 4}}
    path = tmp_path / "case.npz"
    np.savez_compressed(path, mass=score.reshape(1, 1, 6).astype(np.float32), chosen=np.array([2, 3, 4, 5]),
                        n_blocks=6, sinks=4, block_size=8, needle_blocks=np.array([[1, 2]]), wanted=np.array([1]),
                        record=json.dumps(record))
    assert report(path).splitlines()[1] == "  needed: blocks 1-2, pinned 1/2, rank 3, 0"
    assert report(path, around=(1, 1)).splitlines()[1].endswith("; 1 before + 1 after: pinned 2/2")
    assert report(path, around=(0, 1)).splitlines()[1].endswith("; 0 before + 1 after: pinned 1/2")


def test_resume_takes_auto_blocks_for_float16_unless_a_budget_was_set():
    # Records before block_kind auto said float16; auto stores float16 until the budget binds,
    # so under the machine's budget those records still count; a budget set on the command
    # line (where blocks may go 8-bit) is part of the measurement, and its own records count.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from ruler import case_key

    rec = {"task": "vt", "length": 4096, "mode": "cascade", "trial": 0, "trials": 8, "seed": 1,
           "cfg": {"window": 512, "block_kind": "float16", "episodic_budget_mb": None}}
    auto = {**rec, "cfg": {"window": 512, "block_kind": "auto", "episodic_budget_mb": None}}
    assert case_key(auto) == case_key(rec) == case_key({**auto, "compressed": 3})
    pressed = {**rec, "cfg": {"window": 512, "block_kind": "auto", "episodic_budget_mb": 25}}
    assert case_key(pressed) != case_key(rec)
    assert case_key({**pressed, "compressed": 2377}) == case_key(pressed)  # a resumed plan finds it
    assert case_key({**rec, "cfg": {"window": 512, "block_kind": "q8"}}) != case_key(rec)


def test_layouts_move_the_question_and_keep_the_text():
    # The cascade's question pass reads the prompt's last tokens; a question asked first (and,
    # after a system prompt, past the sinks) is a case of its own, built from the same haystack.
    case = make_case("niah_multikey", 600, 0.5, seed=3, count_tokens=lambda t: len(t) // 4)
    assert case.text.endswith(f"{case.question} Answer briefly.") and case.body in case.text
    assert all(n in case.body for n in case.needles)
    assert messages(case) == [{"role": "user", "content": case.text}]
    first = messages(case, "first")
    assert len(first) == 1 and first[0]["content"].endswith(case.body)
    asked = first[0]["content"][: -len(case.body)]
    assert "text below?" in asked and "provided text" not in asked and case.question.split(" for ")[1][:6] in asked
    system = messages(case, "system")
    assert [m["role"] for m in system] == ["system", "user"] and system[1] == first[0]
    with pytest.raises(OptionError, match="'middle'"):
        messages(case, "middle")


def test_a_layout_is_part_of_a_case_and_of_the_summary():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from ruler import case_key, latest, table

    rec = {"task": "niah_single", "length": 4096, "mode": "cascade", "trial": 0, "trials": 4, "seed": 1,
           "cfg": {"window": 512}, "score": 1.0}
    moved = {**rec, "layout": "system", "score": 0.0}
    assert case_key(rec) == case_key({**rec, "layout": "end"}) != case_key(moved)
    both = latest([rec, moved])
    assert len(both) == 2
    lines = table(both).splitlines()
    assert lines[2] == "| niah_single | 4096 | 1/1 (100%) |" and lines[3] == "| niah_single (system) | 4096 | 0/1 (0%) |"


@pytest.mark.slow
def test_the_turns_layout_asks_in_a_conversation_that_carries_the_cascade(default_gguf, tmp_path, monkeypatch):
    # The text in one turn, the question in the next: the second turn continues the first's
    # cascade (its tokens cached, a question pass on the question) and the conversation is gone after.
    from mlotspark.bench.ruler import answer_in_turns, turns
    from mlotspark.engine import Engine

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    engine = Engine.load(str(default_gguf), cascade={"window": 64, "sinks": 4, "block_size": 16, "top_k": 2},
                         progress=False)
    try:
        case = make_case("niah_single", 400, 0.5, seed=5, count_tokens=lambda t: len(engine.encode(t)))
        first, question = turns(case)
        assert first.startswith(case.text[: case.text.rindex("\n\n")]) and first.endswith("once you have read it.")
        assert question == f"{case.question} Answer briefly." and case.body in first
        with pytest.raises(OptionError, match="'turns' for one prompt"):
            messages(case, "turns")
        got = answer_in_turns(engine, case, 4, "ruler-case")
        assert got.stats.cached_tokens > 300  # the first turn's cache carried over
        assert got.stats.extra["cascade"]["question_passes"] >= 1  # the question's pass ran on the carried caches
        assert engine.conversations() == []
    finally:
        engine.close()
