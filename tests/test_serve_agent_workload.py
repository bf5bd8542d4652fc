"""The agent-workload benchmark's client (``benchmarks/agent_workload.py``) against the real app
on a tiny tool-capable model: the system prompt is natural text of the asked length, tool calls
come back as streamed deltas and go back into the resent history with their results, and the
resent history is served from the prompt cache."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from tool_models import write_tool_model  # noqa: E402

SHORT_TOOL = [{"type": "function", "function": {"name": "git", "description": "Run git.", "parameters": {
    "type": "object", "properties": {"subcommand": {"type": "string", "enum": ["status", "diff"]}},
    "required": ["subcommand"], "additionalProperties": False}}}]


class Words:
    def encode(self, text: str) -> list[str]:
        return text.split()


def test_the_system_prompt_is_natural_text_of_the_asked_length_new_for_each_seed():
    from agent_workload import PREAMBLE, system_prompt

    text, n = system_prompt(Words(), 3000, seed=1)
    assert n >= 3000 and len(text.split()) == n and text.startswith(PREAMBLE)
    paragraphs = [p for p in text[len(PREAMBLE):].split("\n\n") if p]
    assert len(paragraphs) == len(set(paragraphs)) > 10  # not one paragraph repeated
    assert system_prompt(Words(), 3000, seed=2)[0] != text


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine
    from mlotspark.server import PromptCache

    path = write_tool_model(tmp_path_factory.mktemp("agent") / "tools.gguf", seed=3)
    engine = Engine.load(str(path), progress=False, cascade=None)
    srv = LiveServer(engine, prompt_cache=PromptCache(engine, persist=False))
    yield srv
    srv.stop()


def test_a_tool_calling_session_resends_its_history_and_hits_the_prompt_cache(live):
    from agent_workload import conversation

    # 96 tokens: the tiny model's vocabulary spells a call byte by byte, laid out as the template does
    run = conversation(live.url, live.model, "You are an agent. " * 20, 3, SHORT_TOOL, 96, "test",
                       tool_options={"tool_choice": "required", "parallel_tool_calls": False})
    turns = run["turns"]
    assert [t["tool_calls"] for t in turns] == [1, 1, 1]  # streamed as tool-call deltas, parsed back
    assert all(t["ttft_s"] <= t["wall_s"] and t["completion_tokens"] > 0 for t in turns)
    assert turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"]
    # Turns 2 and 3 resend the history (a tool call and its result included): mostly from the cache.
    assert turns[0]["cached_tokens"] == 0
    assert all(t["cached_tokens"] >= turns[0]["prompt_tokens"] // 2 for t in turns[1:])
    assert run["completion_tokens"] == sum(t["completion_tokens"] for t in turns)
