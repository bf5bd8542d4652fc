"""The chat TUI's progress and quitting while a long prompt prefills, with the scripted fake
engine (``App.run_test`` + Pilot): the prefill line and first-time steps in the reply, the line
kept in view under a long paste, Escape and Ctrl+Q stopping a turn without losing it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import time

from test_tui import SIZE, drive, make_app, type_line
from test_tui_fakes import FakeEngine, until
from tui import app as tui_app
from tui import panel_figures


class FakeClock:
    """``time`` for tui/app.py: monotonic() moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_a_long_prefill_shows_its_progress_counts_down_and_escape_stops_it(monkeypatch):
    from mlotspark import PrefillProgress

    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate)
    engine.prefill = PrefillProgress(done=4096, total=12000, elapsed_s=48.0, cascade=True)
    app = make_app(engine, poll_s=0.1)
    clock = FakeClock()
    # The app's own reads of the clock only: its turns' start (app.py) and the prefill line's
    # countdown (panel_figures.py; unpatched, the check below waited 10 real seconds).
    monkeypatch.setattr(tui_app, "time", clock)
    monkeypatch.setattr(panel_figures, "time", clock)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Summarise this long document")

        def line() -> str:
            reply = app.chat.reply
            return str(reply.query_one(".mark").render()) if reply is not None else ""

        await until(pilot, lambda: "4,096/12,000 tokens" in line(), "the prefill line")
        assert "ETA" in line() and "memory cascade" in line() and "Escape" in line()
        clock.now += 10.0  # no new event for 10 s (a chunk takes long): the ETA counts down
        await until(pilot, lambda: "ETA 83 s" in line(), "the ETA counting down")
        await pilot.press("escape")
        gate.release()  # the fake notices the cancel before its first piece
        await until(pilot, lambda: app.chat.reply is None, "the reply ended")
        reply = app.chat.replies[-1]
        assert reply.finish_reason == "cancelled" and reply.text == ""
        assert "4,096" not in str(reply.query_one(".mark").render())

    drive(app, script)


def test_the_prefill_line_scrolls_into_view_below_a_long_pasted_prompt():
    # A pasted document fills the log; the progress line that appears under it once the
    # prefill reports must be on screen without the user scrolling (a helper's audit of the
    # real app found it drawn below the view).
    from mlotspark import PrefillProgress

    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate)
    app = make_app(engine, poll_s=0.1)

    async def script(pilot: Any) -> None:
        try:
            await checks(pilot)
        finally:
            for _ in range(50):  # a failed check must not leave the fake blocked on its gate
                gate.release()

    async def checks(pilot: Any) -> None:
        await type_line(pilot, "\n".join(f"line {i} of a long pasted document" for i in range(300)))
        await until(pilot, lambda: app.chat.reply is not None, "the reply")
        await pilot.pause()
        log = app.chat
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y  # the prompt is taller than the view
        engine.prefill = PrefillProgress(done=2048, total=9000, elapsed_s=20.0, cascade=False)

        def line() -> str:
            return str(app.chat.reply.query_one(".mark").render())

        await until(pilot, lambda: "2,048/9,000 tokens" in line(), "the prefill line")
        await pilot.pause()
        await pilot.pause()
        mark = app.chat.reply.query_one(".mark")
        assert log.scroll_y == log.max_scroll_y, (log.scroll_y, log.max_scroll_y)
        assert mark.region.height > 0 and log.region.contains_region(mark.region), (mark.region, log.region)

    drive(app, script)


def test_quitting_mid_prefill_keeps_the_message_the_user_sent():
    # Ctrl+Q during a long first turn: the turn is stopped as Escape stops it, and the app
    # waits for it to be stored (the user's pasted document with the cut reply) before it
    # exits and the engine closes; a helper's audit lost the message of a new conversation.
    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate)
    app = make_app(engine, poll_s=0.1)
    stored_at_exit: list = []

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.chat is not None, "the app ready")
            await type_line(pilot, "a long pasted document")
            await until(pilot, lambda: app.chat.reply is not None, "the reply")
            threading.Timer(0.5, gate.release).start()  # the engine notices the stop at its next chunk
            await pilot.press("ctrl+q")
        stored_at_exit.extend(m for rec in engine.store.values() for m in rec["messages"])

    try:
        asyncio.run(main())
    finally:
        for _ in range(20):
            gate.release()
    assert [m["role"] for m in stored_at_exit] == ["user", "assistant"], stored_at_exit
    assert stored_at_exit[0]["content"] == "a long pasted document"
    assert stored_at_exit[1]["finish_reason"] == "cancelled"


def test_a_first_time_step_before_the_prefill_shows_in_the_reply_and_the_loading_panel():
    """The ``--cache-kind auto`` probe (or the embedding model's load) runs before the
    prefill: the reply says so; a GGUF conversion shows under the loading line."""
    from mlotspark import steps

    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate)
    app = make_app(engine, poll_s=0.1)

    async def script(pilot: Any) -> None:
        def line() -> str:
            reply = app.chat.reply
            return str(reply.query_one(".mark").render()) if reply is not None else ""

        with steps.step("choosing the KV cache kind", total=3, unit="kinds") as s:
            s.advance()
            await type_line(pilot, "Hello")
            await until(pilot, lambda: "choosing the KV cache kind · 1/3 kinds" in line(), "the step line")
        for _ in range(64):  # the fake takes the gate once per word
            gate.release()
        await until(pilot, lambda: app.chat.reply is None, "the reply ended")

    drive(app, script)
