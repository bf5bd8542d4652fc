"""One text stream, one token acceptance, one logits-processor loop (issue 25, Deliver 4).

Unit tests feed hand-made token pieces and hand-written processors; the Engine tests
run every decode path (batched, a model without ``cache.attend`` whose rows step one by one,
speculative, beams, sampled returns) with a detokenizer whose pieces straddle a stop string, and check that the
stop never reaches the streamed text on any of them. The real default model checks
the same with its own byte-level tokenizer (slow).
"""

from __future__ import annotations

import dataclasses
import threading

import mlotspark  # noqa: F401  (BLAS before MLX)
import mlx.core as mx
import pytest

from mlotspark.decoding.acceptance import Acceptance
from mlotspark.decoding.sampling import process_logits, to_logprobs
from mlotspark.decoding.text_stream import TextStream
from mlotspark.engine import Engine
from mlotspark.models import llama
from mlotspark.options import GenerationOptions
from mlotspark.runtime.scheduler import SchedulerConfig
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading, ScriptedProbe
from test_scheduler import EOS, PROMPTS, FakeClock, tiny_engine


# ------------------------------------------------------------ hand-made pieces
class PieceDetokenizer:
    """Token t -> ``PIECES[t]``; a token's text may hold several characters."""

    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def add_token(self, t: int) -> None:
        self.tokens.append(t)

    def finalize(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(self.pieces[t] for t in self.tokens)


PIECES = {0: "The", 1: " capital", 2: " of", 3: " France", 4: " is", 5: " Paris", 6: "."}


def stream(stops=()) -> TextStream:
    return TextStream(lambda: PieceDetokenizer(PIECES), stops)


def feed_all(s: TextStream, tokens: list[int]) -> list[str]:
    return [s.feed(t) for t in tokens] + [s.finish()]


def test_a_stop_split_across_tokens_is_held_back_then_cut():
    s = stream(["of Fr"])
    # " of" could start the stop: held back; " France" completes it: cut, nothing leaks.
    assert feed_all(s, [0, 1, 2, 3, 4]) == ["The", " capital", " ", "", "", ""]
    assert s.stopped and s.text == "The capital "


def test_a_held_back_start_that_does_not_complete_is_released():
    s = stream(["of Lyon"])
    assert feed_all(s, [0, 1, 2, 3, 6]) == ["The", " capital", " ", "of France", ".", ""]
    assert not s.stopped and s.text == "The capital of France."


def test_the_held_back_tail_comes_out_at_the_end_and_the_earliest_stop_wins():
    s = stream(["Paris!", " is"])
    assert feed_all(s, [0, 5]) == ["The", " ", "Paris"]  # " P..." might be "Paris!": held to the end
    s = stream(["France", "capital"])
    assert "".join(feed_all(s, [0, 1, 2, 3])) == "The " and s.text == "The " and s.stop == "capital"
    assert stream(["Lyon"]).stop is None


def test_fork_is_independent_mid_character_with_a_byte_level_detokenizer(tmp_path):
    """A real byte-level detokenizer (GGUF vocabulary): "é" is two byte tokens."""
    from mlotspark.models.tokenizer import load_gguf_tokenizer
    from tiny import tiny_model, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model())
    _, meta = mx.load(str(path), return_metadata=True)
    tok = load_gguf_tokenizer(meta, tmp_path / "tok")
    ids = lambda text: [3 + b for b in text.encode("utf-8")]  # noqa: E731  byte b is token 3 + b
    s = TextStream.of(tok, ["é!"])
    a, c3, a9 = ids("a") + ids("é")
    assert [s.feed(t) for t in (a, c3)] == ["a", ""]  # half a character is never shown
    other = s.fork()
    assert s.feed(a9) == ""  # "é" might start "é!": held back
    assert s.feed(ids("!")[0]) == "" and s.stopped and s.text == "a"
    # The fork goes on from the half character, unaffected by the original.
    assert [other.feed(t) for t in [a9] + ids("?")] == ["", "é?"] and other.finish() == ""
    assert other.text == "aé?" and not other.stopped


def test_acceptance_decides_cancel_eos_stop_and_length_in_one_order():
    def acc(**kw):
        return Acceptance(stream(["of Fr"]), eos={9}, max_tokens=kw.pop("max_tokens", 10), **kw)

    a = acc()
    assert [a.accept(t) for t in (0, 1, 9)] == ["The", " capital", ""]
    assert a.finish == "stop" and a.ended_on_eos and a.tokens == [0, 1] and a.close() == ""
    a = acc()
    for t in (0, 1, 2, 3):
        a.accept(t)
    assert a.finish == "stop" and not a.ended_on_eos and a.tokens == [0, 1, 2, 3] and a.text == "The capital "
    a = acc(max_tokens=3)
    assert "".join(a.accept(t) for t in (0, 1, 2)) + a.close() == "The capital of"
    assert a.finish == "length"
    cancel = threading.Event()
    a = acc(cancel=cancel)
    a.accept(0)
    cancel.set()
    assert a.accept(1) == "" and a.finish == "cancelled" and a.tokens == [0]
    assert a.close() == "" and a.text == "The"
    # A child (a beam candidate) leaves its parent as it was.
    a = acc()
    a.accept(2)
    child = a.child(3)
    assert child.finish == "stop" and child.text == " " and a.finish is None and a.tokens == [2]
    assert a.accept(4) == "of is"


def test_process_logits_runs_each_rows_processors_over_its_own_history():
    def count(hist, row):  # adds how many tokens the row has seen to token 0's logit
        return row + mx.array([[hist.size, 0.0, 0.0]])

    def double(hist, row):
        return row * 2

    logits = mx.zeros((3, 3))
    out = process_logits(logits, [[1], [1, 2, 3], mx.array([4, 5])], [[count, double], None, [double, count]])
    assert out.tolist() == [[2.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    assert process_logits(logits, [[1]] * 3, [None, [], None]) is logits
    lp = to_logprobs(mx.array([[0.0, 0.0]]))
    assert mx.allclose(lp, mx.log(mx.array([[0.5, 0.5]]))).item()


# ------------------------------------------------------------ every path, through the Engine
class PieceTokenizer:
    """The scheduler tests' tokenizer, with text from position-cycled pieces: whatever
    tokens a path picks, its k-th token reads ``WORDS[k % len(WORDS)]``."""

    eos_token_ids = [EOS]
    bos_token_id = None
    WORDS = ["The", " capital", " of", " France", " is", " Paris", "."]

    class Detokenizer(PieceDetokenizer):
        @property
        def text(self) -> str:
            return "".join(PieceTokenizer.WORDS[k % len(PieceTokenizer.WORDS)] for k in range(len(self.tokens)))

    @property
    def detokenizer(self):
        return self.Detokenizer({})

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + ord(c) % 120 for c in text]


def _mlx_lm_twin(model: llama.Model):
    """mlx-lm's llama holding the same weights: its attention does not go through
    ``cache.attend``, so the batch steps each of its rows on its own (``runner.step``)."""
    from mlx_lm.models import llama as mlx_llama

    a = model.args
    twin = mlx_llama.Model(mlx_llama.ModelArgs(
        model_type="llama", hidden_size=a.hidden_size, num_hidden_layers=a.num_hidden_layers,
        intermediate_size=a.intermediate_size, num_attention_heads=a.num_attention_heads,
        num_key_value_heads=a.num_key_value_heads, rms_norm_eps=a.rms_norm_eps, vocab_size=a.vocab_size,
        rope_theta=a.rope_theta, rope_traditional=a.rope_traditional, tie_word_embeddings=a.tie_word_embeddings))
    twin.update(model.parameters())
    mx.eval(twin.parameters())
    return twin


@pytest.fixture(scope="module")
def engines():
    batched = tiny_engine()
    batched.loaded.tokenizer = PieceTokenizer()
    loaded = dataclasses.replace(batched.loaded, model=_mlx_lm_twin(batched.loaded.model),
                                 supports_cascade=False, fingerprint="tiny-mlx-lm")
    gov = ThermalGovernor([ScriptedProbe([Reading()])], clock=FakeClock(), min_interval_s=0)
    solo = Engine(loaded, GenerationOptions(temperature=0.0), SchedulerConfig(governor=gov))
    yield batched, solo
    batched.close()
    solo.close()


PATHS = {
    "batched": {},
    "speculative": {"speculative": "prompt_lookup"},
    "beams": {"num_beams": 3},
    "beams, two returned": {"num_beams": 3, "num_return_sequences": 2},
    "sampled returns": {"num_return_sequences": 2, "temperature": 1.0, "seed": 5},
}


MLX_LM = "mlx-lm model, rows stepped one by one"


@pytest.mark.parametrize("path", list(PATHS) + [MLX_LM])
def test_a_stop_split_across_tokens_never_leaks_on_any_path(engines, path):
    batched, solo = engines
    engine = solo if path == MLX_LM else batched
    in_batch = path in ("batched", MLX_LM)
    opts = {"max_tokens": 12, "stop": ["of Fr"], **PATHS.get(path, {})}
    handles = [engine.submit(prompt_ids=p, **opts) for p in PROMPTS]  # several at once: a batch
    for h in handles:
        streamed = "".join(h)
        r = h.result()
        assert streamed == r.text == "The capital ", (path, streamed)
        assert r.stats.finish_reason == "stop" and len(r.tokens) == 4  # the token that completed it counts
        assert r.stats.stop_sequence == "of Fr", path  # beams too: the best beam's acceptance is the reply's
        for seq in r.sequences:
            assert seq.text == "The capital " and seq.finish_reason == "stop" and len(seq.tokens) == 4
        assert ("mean_batch" in r.stats.extra) == in_batch  # the batch's steps, or an own loop
    if in_batch:
        assert max(h.result().stats.extra["mean_batch"] for h in handles) > 1


def test_without_a_stop_every_path_streams_the_whole_text(engines):
    batched, solo = engines
    want = "".join(PieceTokenizer.WORDS)[: len("The capital of France is")]
    for engine, opts in [(solo, {})] + [(batched, o) for o in PATHS.values()]:
        h = engine.submit(prompt_ids=PROMPTS[1], max_tokens=5, **opts)
        assert "".join(h) == h.result().text == want and h.result().stats.finish_reason == "length"


# ------------------------------------------------------------ the real default model
@pytest.fixture(scope="module")
def real(default_gguf):
    e = Engine.load(str(default_gguf), progress=False, temperature=0)
    yield e
    e.close()


@pytest.mark.slow
def test_real_model_same_text_and_no_leaked_stop_on_every_path(real):
    """"of Fr" straddles the tokens " of" and " France" of the greedy answer."""
    from mlotspark.models.mlx_lm_twin import mlx_lm_twin

    question = "What is the capital of France?"
    plain = real.generate(question, max_tokens=12)
    assert "The capital of France" in plain.text
    solo = Engine(dataclasses.replace(real.loaded, model=mlx_lm_twin(real.loaded), supports_cascade=False),
                  real.defaults)
    try:
        texts = {MLX_LM: solo.generate(question, max_tokens=12)}
        handles = [real.submit(question, max_tokens=12), real.submit("Name a fruit.", max_tokens=12)]
        texts["batched"] = handles[0].result()
        texts["speculative"] = real.generate(question, max_tokens=12, speculative="prompt_lookup")
        for name, r in texts.items():  # the same greedy tokens give the same text everywhere
            assert (r.tokens, r.text) == (plain.tokens, plain.text), name
        cut = plain.text.index("of Fr")
        runs = {MLX_LM: solo.submit(question, max_tokens=12, stop=["of Fr"])}
        for name, opts in [("batched", {}), ("speculative", {"speculative": "prompt_lookup"}), ("beams", {"num_beams": 2})]:
            runs[name] = real.submit(question, max_tokens=12, stop=["of Fr"], **opts)
        real.submit("Name a fruit.", max_tokens=12)  # company for the batched one
        for name, h in runs.items():
            streamed = "".join(h)
            assert streamed == h.result().text == plain.text[:cut], name
            assert h.result().stats.finish_reason == "stop", name
    finally:
        solo.close()
