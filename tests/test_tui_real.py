"""The chat TUI with the real default model (SmolLM2-135M-Instruct), driven by Pilot.

The app loads the model itself (in its worker, as ``mlotspark chat`` does). Waits
are for events — a piece arriving, a reply ending — with a generous give-up limit
for this shared 2-core machine, never an assertion on time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import pytest

from tui import ChatApp
from tui.widgets import ConversationList, PromptInput

pytestmark = pytest.mark.slow

SIZE = (120, 36)
GIVE_UP_S = 240  # only so a hung test ends; nothing is asserted about speed


async def until(pilot: Any, check: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        await pilot.pause(0.02)


async def type_line(pilot: Any, text: str) -> None:
    pilot.app.query_one(PromptInput).insert(text)
    await pilot.press("enter")
    await pilot.pause()


async def loaded(pilot: Any) -> None:
    app = pilot.app
    await until(pilot, lambda: app.chat is not None or app.sub_title == "no model", "the model loaded")
    assert app.chat is not None, app.sub_title


def test_reply_streams_escape_cancels_and_slash_commands(default_gguf):
    app = ChatApp(model=str(default_gguf))

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            # a long first load shows its progress
            assert app.query_one("#logs").current == "loading"
            assert "Loading" in str(app.query_one("#loading-text").render())
            await loaded(pilot)

            # settings: good values change them, bad ones get a message and change nothing
            await type_line(pilot, "/temp 0")
            await type_line(pilot, "/max_tokens 24")
            for bad in ["/temp -1", "/top_p 1.5", "/max_tokens lots", "/repeat_penalty 0"]:
                await type_line(pilot, bad)
            assert app.overrides == {"temperature": 0.0, "max_tokens": 24}
            errors = [n.text for n in app.chat.notes if n.error]
            assert len(errors) == 4 and "invalid /temp -1.0" in errors[0] and "invalid /top_p 1.5" in errors[1]
            assert "temp 0.0" in app.panel.text() and "max 24" in app.panel.text()

            # a reply appears piece by piece
            # (a short reply may start and end between two polls: read the widget it left)
            before = len(app.chat.replies)
            await type_line(pilot, "What is the capital of France?")
            await until(pilot, lambda: len(app.chat.replies) > before and app.chat.reply is None, "the reply ended")
            reply = app.chat.replies[-1]
            assert reply.pieces >= 3  # it came piece by piece, not at once
            assert "Paris" in reply.text and reply.finish_reason == "stop" and not reply.marked
            panel = app.panel.text()
            assert "tok/s    —" not in panel and "TTFT     —" not in panel

            # Escape stops a long reply; what came is kept, marked, and stored
            await type_line(pilot, "/max_tokens 400")
            await type_line(pilot, "Write a long story about a dragon who learns to bake bread.")
            await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.pieces >= 3, "three pieces")
            reply = app.chat.reply
            await pilot.press("escape")
            await until(pilot, lambda: app.chat.reply is None, "the reply stopped")
            assert reply.finish_reason == "cancelled" and reply.marked and reply.text.strip()
            stored = app.engine.conversation(app.current).messages
            assert stored[-1]["role"] == "assistant" and stored[-1]["content"].startswith(reply.text[:10])
            assert app.engine.status()["running"] == 0  # the request is gone, not left running
            await pilot.press("ctrl+q")

    try:
        asyncio.run(main())
    finally:
        app.close_engine()


def test_new_conversation_is_listed_and_survives_a_restart(default_gguf):
    first = ChatApp(model=str(default_gguf))

    async def before() -> None:
        async with first.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            assert first.current == "chat-1"
            await pilot.press("ctrl+n")
            await until(pilot, lambda: "chat-2" in first.query_one(ConversationList).names, "chat-2 listed")
            assert first.current == "chat-2"
            await type_line(pilot, "/rename Trip plans")
            await until(pilot, lambda: "Trip plans" in [r.label for r in first.query_one(ConversationList).rows],
                        "renamed")
            await pilot.press("ctrl+q")

    try:
        asyncio.run(before())
    finally:
        first.close_engine()

    again = ChatApp(model=str(default_gguf))

    async def after() -> None:
        async with again.run_test(size=SIZE) as pilot:
            await loaded(pilot)
            rows = {r.name: r.label for r in again.query_one(ConversationList).rows}
            assert rows == {"chat-2": "Trip plans", "chat-1": "chat-1"}
            assert again.current == "chat-2"  # the newest opens

    try:
        asyncio.run(after())
    finally:
        again.close_engine()
