"""The chat TUI on a reasoning model (the tiny engine on the R1 distill's real tokenizer and
template, ``r1_tiny_engine``): the thinking streams into a folded "Thinking…" block above the
reply, F6 opens it, and neither the reply nor the stored history holds it."""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import R1_TINY_ANSWER, R1_TINY_THOUGHT
from test_tui_fakes import until

from tui import ChatApp
from tui.widgets import PromptInput


def test_the_thinking_is_folded_above_the_reply_and_f6_opens_it(r1_tiny_engine):
    from mlotspark import Engine, GenerationOptions

    engine = Engine(r1_tiny_engine.loaded, GenerationOptions(temperature=0.0, max_tokens=32))
    app = ChatApp(engine, memory_probe=lambda: 1)

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.chat is not None, "the app ready")
            app.query_one(PromptInput).insert("Two and two?")
            await pilot.press("enter")
            await until(pilot, lambda: app.chat.replies and app.chat.reply is None, "the reply finished")
            reply = app.chat.replies[-1]
            assert reply.text.strip() == R1_TINY_ANSWER and "Okay" not in reply.text
            block = reply.thinking
            assert block is not None and block.text == R1_TINY_THOUGHT
            assert block.collapsed and str(block.title).startswith("Thought (5 words)")
            await pilot.press("f6")
            await pilot.pause()
            assert not block.collapsed
            await pilot.press("f6")
            await pilot.pause()
            assert block.collapsed
            stored = engine.conversation(app.current).messages
            assert stored[-1]["content"] == R1_TINY_ANSWER

    try:
        asyncio.run(main())
    finally:
        engine.close()
