"""The declared interfaces: ``Engine`` and the test fakes implement ``EngineProtocol``
(and conversations ``ConversationProtocol``), name by name and parameter by parameter,
so a fake cannot drift from the engine it stands for; ``Sequence`` implements the
``DecodeRequest`` the decoding strategies drive."""

from __future__ import annotations

import pytest

import mlotspark
from mlotspark import ConversationProtocol, EngineProtocol
from mlotspark.decoding.request import DecodeRequest
from mlotspark.runtime.sequence import Sequence

from protocol_check import mismatches
from test_tui_fakes import FakeConversation, FakeEngine


@pytest.mark.parametrize("impl, protocol", [
    (mlotspark.Engine, EngineProtocol),
    (mlotspark.Conversation, ConversationProtocol),
    (FakeEngine, EngineProtocol),
    (FakeConversation, ConversationProtocol),
    (Sequence, DecodeRequest),
])
def test_implements_the_declared_interface(impl, protocol):
    assert mismatches(impl, protocol) == []


def test_the_server_fake_declares_what_the_engine_declares():
    from test_server_unit import FakeEngine as ServerFake

    assert mismatches(ServerFake, EngineProtocol, partial=True) == []


def test_a_drifted_fake_is_caught():
    class Drifted(FakeEngine):
        def conversation(self, name):  # the keyword-only ``system`` is gone
            return super().conversation(name)

    wrong = mismatches(Drifted, EngineProtocol)
    assert len(wrong) == 1 and wrong[0].startswith("Drifted.conversation(self, name) != ")


def test_fakes_pass_the_runtime_check():
    engine = FakeEngine()
    assert isinstance(engine, EngineProtocol)
    assert isinstance(engine.conversation("a"), ConversationProtocol)


def test_the_cache_kind_decision_is_the_engines_own():
    from test_scheduler import tiny_engine

    engine = tiny_engine()
    try:
        assert engine.caches.decision is None
        r = engine.generate("hello there", raw=True, max_tokens=3, cache_kind="auto")
        decision = engine.caches.decision
        assert decision is not None and r.stats.extra["cache"] == {"kind": decision.kind,
                                                                   "why": f"auto: {decision.reason}"}
        assert engine.generate("hello", raw=True, max_tokens=2, cache_kind="float16").stats.extra["cache"]["kind"] == "float16"
        assert engine.caches.decision is decision  # a kind asked for by name decides nothing
    finally:
        engine.close()


def test_submit_takes_request_options_and_generation_options_by_name():
    from mlotspark import OptionError, RequestOptions
    from test_scheduler import tiny_engine

    request, generation = RequestOptions.split({"priority": 2, "raw": True, "max_tokens": 3, "temperature": 0})
    assert (request.priority, request.raw, generation) == (2, True, {"max_tokens": 3, "temperature": 0})
    engine = tiny_engine()
    try:
        seen = []
        handle = engine.submit("hello", raw=True, priority=1, on_finish=seen.append, max_tokens=3)
        assert len(handle.result().tokens) == 3 and handle.generation.options.max_tokens == 3
        assert seen == [handle.generation]
        with pytest.raises(OptionError, match="priority"):
            engine.submit("hello", raw=True, priority=True)
        with pytest.raises(OptionError, match="colour"):
            engine.submit("hello", raw=True, colour="blue")
    finally:
        engine.close()


def test_the_engine_keeps_to_fifteen_public_members():
    """Methods and the properties that start or open something count (the class docstring's rule)."""
    import inspect

    data = {"model_name", "tokenizer", "vocab_size", "rank"}  # read-only facts of what it loaded
    counted = {n for n, v in vars(mlotspark.Engine).items() if not n.startswith("_") and n not in data
               and (inspect.isfunction(v) or isinstance(v, (property, classmethod)))}
    assert len(counted) <= 15, sorted(counted)
    assert all(f"``{n}``" in mlotspark.Engine.__doc__ for n in counted)  # each one named by the docstring
