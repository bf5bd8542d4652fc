"""Snapshots of the chat TUI at a fixed terminal size (pytest-textual-snapshot).

A scripted fake engine gives fixed figures (no timestamps, no measured speeds) and
the cursor does not blink, so the screens are the same on every run. Update the
SVGs under ``tests/__snapshots__/`` with ``pytest --snapshot-update`` after a
deliberate change, and look at them (``pytest`` writes a report on a mismatch).
"""

from __future__ import annotations

from typing import Any

from test_tui_fakes import fake_with_history, until

from tui import ChatApp
from tui.backend import ModelRow
from tui.picker import ModelPicker
from tui.widgets import PromptInput

SIZE = (120, 36)


ROWS = [
    ModelRow("fake-135m", "catalogue", 98_362_432, True, "/m/fake.gguf", default=True),
    ModelRow("qwen2.5-coder-0.5b", "catalogue", 491_400_064, False, "/m/qwen.gguf"),
    ModelRow("/home/me/models/llama-3.2-1b.Q4_K_M.gguf", "used before", 807_690_656, True,
             "/home/me/models/llama-3.2-1b.Q4_K_M.gguf"),
]


def make_app() -> ChatApp:
    # No periodic poll: a tok/s sample taken mid-reply would depend on timing.
    return ChatApp(fake_with_history(), memory_probe=lambda: 123_000_000, poll_s=3600, model_lister=lambda: ROWS)


async def settle(pilot: Any) -> None:
    """The conversation open, one more finished turn, and the side panel's figures in."""
    app = pilot.app
    await until(pilot, lambda: app.chat is not None, "a conversation open")
    prompt = app.query_one(PromptInput)
    prompt.cursor_blink = False
    prompt.insert("And of Italy?")
    await pilot.press("enter")
    await until(pilot, lambda: len(app.chat.replies) == 2 and app.chat.reply is None, "the reply")
    await until(pilot, lambda: app.panel.machine is not None and app.panel.tiers is not None, "figures")
    prompt.insert("a draft\nover two lines")
    await pilot.pause()


def test_main_screen(snap_compare):
    assert snap_compare(make_app(), terminal_size=SIZE, run_before=settle)


def test_help_screen(snap_compare):
    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        await pilot.press("f1")

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_model_picker(snap_compare):
    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(pilot.app.screen, ModelPicker) and pilot.app.screen.rows, "the rows")

    assert snap_compare(make_app(), terminal_size=SIZE, run_before=run_before)


def test_an_80_column_terminal_keeps_the_chat_readable(snap_compare):
    # A user's audit: at 80x24 the list (28) and the side panel (38) left the chat 12 cells
    # ("█ wn", "█ for"). Under 110 columns the side panel waits for F4, in the list's place.
    async def run_before(pilot: Any) -> None:
        await settle(pilot)
        app = pilot.app
        assert app.query_one("#stats").display is False and app.query_one("#sidebar").display is True
        assert app.query_one("#center").size.width >= 45
        await pilot.press("f4")
        await pilot.pause()
        assert app.query_one("#stats").display is True and app.query_one("#sidebar").display is False
        await pilot.press("f4")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=run_before)
