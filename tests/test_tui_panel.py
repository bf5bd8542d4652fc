"""The chat's memory lines and side panel, and what a reply leaves in view (split from test_tui.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from test_tui import make_app, type_line
from test_tui_fakes import FakeEngine, until


def test_memory_lines_name_a_forgotten_successor_and_keep_one_row_an_entry():
    # A user's audit: /memory said "(superseded by #16)" after #16 was forgotten, and /forget 16
    # then knew no #16; an entry told over two lines printed as a row without an id.
    from types import SimpleNamespace

    from tui.slash import _one_line, _replaced

    store = SimpleNamespace(get=lambda i: None if i == 16 else object())
    assert _replaced(SimpleNamespace(superseded_by=16), store) == "  (superseded by an entry forgotten since)"
    assert _replaced(SimpleNamespace(superseded_by=3), store) == "  (superseded by #3)"
    assert _replaced(SimpleNamespace(superseded_by=None), store) == ""
    assert _one_line("Line one.\nLine two: my dentist is Dr Vos.") == "Line one. ⏎ Line two: my dentist is Dr Vos."


def test_a_replys_end_mark_scrolls_into_view():
    # A user's audit: "… stopped at max_tokens" / "⏹ cancelled" were drawn just below the view.
    engine = FakeEngine()
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "/max_tokens 3")
        for _ in range(6):  # enough lines that the chat scrolls
            await type_line(pilot, "/system")
        await type_line(pilot, "Hi")
        await until(pilot, lambda: app.chat.replies and app.chat.reply is None, "reply")
        await pilot.pause()
        await pilot.pause()
        chat = app.chat
        assert chat.replies[-1].finish_reason == "length" and chat.max_scroll_y > 0
        assert chat.scroll_y >= chat.max_scroll_y - 1, (chat.scroll_y, chat.max_scroll_y)

    async def main() -> None:
        async with app.run_test(size=(80, 14)) as pilot:
            await until(pilot, lambda: app.chat is not None, "the app ready")
            await script(pilot)

    asyncio.run(main())


def test_the_stats_panel_says_what_a_turn_learned_and_forgot():
    from tui.backend import TurnFigures
    from tui.widgets.stats import memories_text

    text = memories_text(TurnFigures(memories=["I live in Porto."], learned=1, forgotten=2)).plain
    assert "I live in Porto." in text and "+ learned 1" in text and "- forgot 2" in text
    assert "forgot" not in memories_text(TurnFigures(learned=1)).plain
    assert "+ learned 1 · updated 1: /memory" in memories_text(TurnFigures(learned=1, updated=1)).plain
    # A retraction that named nothing clearly deleted nothing: the panel says so, and how to.
    assert "? 1 not forgotten: /memory, /forget ID" in memories_text(TurnFigures(not_forgotten=1)).plain
    # "Remember that ..." that kept nothing (too short, a reminder, too long): the panel says so
    assert "? 1 not remembered: /remember TEXT" in memories_text(TurnFigures(not_remembered=1)).plain
