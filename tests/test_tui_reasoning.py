"""The chat TUI on a reasoning model (the tiny engine on the R1 distill's real tokenizer and
template, ``r1_tiny_engine``): the thinking streams into a folded "Thinking…" block above the
reply, F6 opens it, and neither the reply nor the stored history holds it."""

from __future__ import annotations

import asyncio
from typing import Any

from model_cache import R1_TINY_ANSWER, R1_TINY_THOUGHT
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


def test_the_block_streams_folded_under_thinking_until_the_answer_begins():
    """One ``Reply`` in a tiny host app: pieces of thinking grow the folded block, titled
    "Thinking…"; the first piece of the answer renames it and the answer stays outside it."""
    from textual.app import App, ComposeResult

    from tui.widgets import Reply

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield Reply(streaming=True)

    async def main() -> None:
        app = Host()
        async with app.run_test(size=(80, 20)) as pilot:
            reply = app.query_one(Reply)
            await reply.add_thinking("Okay, the")
            await reply.add_thinking(" sum is four")
            await pilot.pause()
            block = reply.thinking
            assert block.collapsed and str(block.title) == "Thinking…" and block.text == "Okay, the sum is four"
            assert reply.children[0] is block  # above the reply's text
            await reply.append("Four.")
            await reply.finish("stop")
            await pilot.pause()
            assert str(block.title) == "Thought (5 words)" and reply.text == "Four."
            await pilot.click(block.query_one("CollapsibleTitle"))
            assert not block.collapsed

    asyncio.run(main())
