"""The declared interfaces: ``Engine`` and the test fakes implement ``EngineProtocol``
(and conversations ``ConversationProtocol``), name by name and parameter by parameter,
so a fake cannot drift from the engine it stands for; ``Generation`` implements the
``DecodeRequest`` the decoding strategies drive."""

from __future__ import annotations

import pytest

import mlotspark
from mlotspark import ConversationProtocol, EngineProtocol
from mlotspark.decoding.request import DecodeRequest
from mlotspark.runtime.generation import Generation

from protocol_check import mismatches
from test_tui_fakes import FakeConversation, FakeEngine


@pytest.mark.parametrize("impl, protocol", [
    (mlotspark.Engine, EngineProtocol),
    (mlotspark.Conversation, ConversationProtocol),
    (FakeEngine, EngineProtocol),
    (FakeConversation, ConversationProtocol),
    (Generation, DecodeRequest),
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
        assert engine.cache_decision is None
        r = engine.generate("hello there", raw=True, max_tokens=3, cache_kind="auto")
        decision = engine.cache_decision
        assert decision is not None and r.stats.extra["cache"] == {"kind": decision.kind,
                                                                   "why": f"auto: {decision.reason}"}
        assert engine.generate("hello", raw=True, max_tokens=2, cache_kind="float16").stats.extra["cache"]["kind"] == "float16"
        assert engine.cache_decision is decision  # a kind asked for by name decides nothing
    finally:
        engine.close()
