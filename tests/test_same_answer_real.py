"""Same prompt, same answer everywhere: ``generate``, the API, a conversation and the
TUI use one default system prompt policy (the model's template default unless the
user sets one), so the same message gives the same greedy tokens in all four."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from mlotspark import Engine
from mlotspark.cli.entry import main
from tui import ChatApp
from tui.widgets import PromptInput

pytestmark = pytest.mark.slow

MESSAGE = "What is the capital of France?"
OPTS = {"temperature": 0.0, "max_tokens": 12}


def tui_reply(engine: Engine) -> str:
    app = ChatApp(engine, conversation="tui", options=dict(OPTS), memory_probe=lambda: 0)

    async def run() -> str:
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 240  # only so a hung test ends
            while app.chat is None and time.monotonic() < deadline:
                await pilot.pause(0.02)
            app.query_one(PromptInput).insert(MESSAGE)
            await pilot.press("enter")
            while not (app.chat.replies and app.chat.reply is None) and time.monotonic() < deadline:
                await pilot.pause(0.02)
            return app.chat.replies[-1].text

    return asyncio.run(run())


def test_generate_api_conversation_and_tui_give_the_same_greedy_tokens(default_gguf, capsys):
    assert main(["generate", "-m", str(default_gguf), "-p", MESSAGE, "--temp", "0",
                 "--max-tokens", str(OPTS["max_tokens"]), "--json"]) == 0
    cli: dict[str, Any] = json.loads(capsys.readouterr().out)
    engine = Engine.load(str(default_gguf))
    try:
        # Conversations start cold here: no memory section, no shared prefix from another one.
        engine.persistence.set_budgets(memory=False, learn=False, prefix_cache_mb=0)
        api = engine.generate(MESSAGE, **OPTS)
        conv = engine.conversation("plain").send(MESSAGE, **OPTS)
        tui = tui_reply(engine)
    finally:
        engine.close()
    assert "Paris" in api.text
    assert cli["tokens"] == api.tokens == conv.tokens
    assert cli["text"] == api.text == conv.text == tui
