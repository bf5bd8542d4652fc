# Past 500 lines on purpose: the core TUI tests share make_app, drive and the fake engine's scripts; topics split off into test_tui_*.py.
"""The chat TUI with a scripted fake engine: keys, slash commands, conversations,
streaming, cancelling and errors, as a user sees them (``App.run_test`` + Pilot).

The real-model Pilot tests are in ``test_tui_real.py``; the terminal run in tmux in
``test_tui_tmux.py``; snapshots in ``test_tui_snapshots.py``; progress and quitting during a
long prefill in ``test_tui_progress.py``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable

import pytest
from test_tui_fakes import FakeEngine, fake_with_history, until

from mlotspark.errors import MlotsparkError, ModelNotFoundError, StoreError
from tui import ChatApp
from tui.commands import CommandError, parse
from tui.picker import ModelPicker
from tui.screens import HelpScreen
from tui.widgets import ConversationItem, ConversationList, PromptInput
from tui.widgets.stats import DASH, sparkline

SIZE = (120, 36)


def drive(app: ChatApp, script: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``app`` headless, wait until a conversation is open, then run ``script(pilot)``."""

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.chat is not None or app.sub_title == "no model", "the app ready")
            await script(pilot)

    asyncio.run(main())


def notes(app: ChatApp) -> list[str]:
    assert app.chat is not None
    return [n.text for n in app.chat.notes]


def error_notes(app: ChatApp) -> list[str]:
    assert app.chat is not None
    return [n.text for n in app.chat.notes if n.error]


def notifications(app: ChatApp) -> list[tuple[str, str]]:
    """Every (message, severity) the app notified, expired toasts included."""
    return list(app.__dict__.get("notified", []))


def record_notifications(app: ChatApp) -> ChatApp:
    app.notified = []  # type: ignore[attr-defined]
    notify = app.notify

    def recording(message: str, **kw: Any) -> None:
        app.notified.append((message, kw.get("severity", "information")))  # type: ignore[attr-defined]
        notify(message, **kw)

    app.notify = recording  # type: ignore[method-assign]
    return app


async def type_line(pilot: Any, text: str) -> None:
    pilot.app.query_one(PromptInput).insert(text)
    await pilot.press("enter")
    await pilot.pause()


def make_app(engine: Any, **kw: Any) -> ChatApp:
    return record_notifications(ChatApp(engine, memory_probe=lambda: 123_000_000, **kw))


# -- commands (parsing, no app) --------------------------------------------------------
def test_parse_converts_values_and_rejects_bad_ones():
    assert parse("/temp 0.2").option == "temperature" and parse("/temp 0.2").value == 0.2
    assert parse("/top_k 40").value == 40
    assert parse("/repeat_penalty 1.1").option == "repetition_penalty"
    assert parse("/system Be brief.  ").argument == "Be brief."
    assert parse("/forget 7").value == 7 and parse("/forget #7").value == 7  # as /memory shows ids
    for bad, why in [("/temp hot", "^/temp: 'hot' is not a number"), ("/top_k 2.5", "^/top_k: '2.5' is not an integer"), ("/temp", "needs a value"),
                     ("/frobnicate", "unknown command"), ("/forget x", "^/forget: 'x' is not an integer"), ("/top_p 0.5 0.6", "one value"),
                     ("/forget -1", "ids start at 1")]:
        with pytest.raises(CommandError, match=why):
            parse(bad)


def test_sparkline_scales_from_zero():
    assert sparkline([10.0, 10.0, 5.0, 0.0], 8) == "██▅▁"
    assert sparkline([1.0] * 30, 8) == "█" * 8
    assert sparkline([0.0, 0.0], 8) == "▁▁"


# -- streaming, cancelling ---------------------------------------------------------------
def test_reply_streams_piece_by_piece_and_the_panel_shows_the_turn():
    gate = threading.Semaphore(0)
    engine = fake_with_history()
    engine.gate = gate
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Tell me about Paris")
        seen = []
        for _ in range(4):
            gate.release()
            n = len(seen) + 1
            await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.pieces >= n, "a piece")
            seen.append(app.chat.reply.text)
        assert seen == ["The", "The capital", "The capital of", "The capital of France"]
        items = {i.row.name: i.streaming for i in app.query_one(ConversationList).query(ConversationItem)}
        assert app.panel.streaming and items == {"chat-2": True, "chat-1": False}
        for _ in range(20):
            gate.release()
        await until(pilot, lambda: app.chat.reply is None, "the reply finished")
        reply = app.chat.replies[-1]
        assert reply.text == engine.reply and not reply.marked
        panel = app.panel.text()
        assert "12.5" in panel and "0.30 s" in panel and "27 in · 11 out" in panel
        assert "#1 My sister's name is Ilse." in panel and "20 tok (prefix)" in panel
        assert "nominal" in panel and "cap 8" in panel and "123.0 MB" in panel

    drive(app, script)


def test_escape_stops_the_reply_and_keeps_the_partial_reply_marked():
    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate)
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Tell me a long story")
        for _ in range(3):
            gate.release()
        await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.pieces == 3, "three pieces")
        await pilot.press("escape")
        gate.release()  # the fake checks for the cancel before its next piece
        await until(pilot, lambda: app.chat.reply is None, "the reply ended")
        reply = app.chat.replies[-1]
        assert reply.text == "The capital of" and reply.finish_reason == "cancelled" and reply.marked
        assert "cancelled" in str(reply.query_one(".mark").render())
        stored = engine.conversation(app.current).messages
        assert stored[-1] == {"role": "assistant", "content": "The capital of", "finish_reason": "cancelled"}
        # the app goes on: the next message gets a full reply
        for _ in range(20):
            gate.release()
        await type_line(pilot, "again")
        await until(pilot, lambda: len(app.chat.replies) == 2 and app.chat.reply is None, "second reply")
        assert app.chat.replies[-1].text == engine.reply

    drive(app, script)
    # opened again (as after a restart), the stopped reply still carries its mark
    again = make_app(engine, conversation=app.current)

    async def reopened(pilot: Any) -> None:
        first, second = again.chat.replies
        assert first.marked and "cancelled" in str(first.query_one(".mark").render()) and not second.marked

    drive(again, reopened)


def test_a_second_message_while_streaming_waits_and_enter_on_empty_does_nothing():
    gate = threading.Semaphore(0)
    app = make_app(FakeEngine(gate=gate))

    async def script(pilot: Any) -> None:
        await pilot.press("enter")
        assert app.chat.replies == []
        await type_line(pilot, "first")
        await type_line(pilot, "second")
        assert ("Cannot send a message while its reply streams: Escape stops it.", "warning") in notifications(app)
        assert app.query_one(PromptInput).text == "second"  # kept for later
        for _ in range(20):
            gate.release()
        await until(pilot, lambda: app.chat.reply is None, "reply finished")
        assert len(app.chat.replies) == 1

    drive(app, script)


def test_switching_conversations_while_a_reply_streams():
    gate = threading.Semaphore(0)
    engine = fake_with_history()
    engine.gate = gate
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "streaming in chat-2")
        gate.release()
        await until(pilot, lambda: app.chat.reply is not None and app.chat.reply.pieces == 1, "a piece")
        streaming_chat = app.chat
        await pilot.press("ctrl+n")
        await until(pilot, lambda: app.current == "chat-3", "the new conversation open")
        assert app.chat is not streaming_chat and app.chat.replies == []
        # the new conversation can talk while the other still streams
        await type_line(pilot, "hello from chat-3")
        for _ in range(40):
            gate.release()
        await until(pilot, lambda: not app.turns, "both replies finished")
        assert streaming_chat.replies[-1].text == engine.reply
        assert app.chat.replies[-1].text == engine.reply
        assert len(streaming_chat.replies) == 2 and len(app.chat.replies) == 1
        # and back: the list opens chat-2 with its messages (once the refreshes the two
        # endings queued have run: a rebuild between Enter's press and its handling could
        # take the row away under it)
        await app.refresh_list()
        await pilot.pause()
        names = app.query_one(ConversationList).names
        app.query_one(ConversationList).index = names.index("chat-2")
        app.query_one(ConversationList).focus()  # deferred (call_later): Enter must find it done
        await until(pilot, lambda: app.query_one(ConversationList).has_focus, "the list focused")
        await pilot.press("enter")
        await until(pilot, lambda: app.current == "chat-2", "chat-2 open again")
        assert app.chat is streaming_chat

    drive(app, script)


def test_a_list_refresh_keeps_the_highlight_the_user_moved():
    """A reply ending refreshes the list, in place or re-sorted; the row the user was moving
    to stays highlighted (it used to jump back to the open conversation, so Enter reopened
    that: ``test_switching_conversations_while_a_reply_streams`` failed so once in CI)."""
    app = make_app(fake_with_history())

    async def script(pilot: Any) -> None:
        clist = app.query_one(ConversationList)
        other = next(i for i, name in enumerate(clist.names) if name != app.current)
        clist.index = other
        await app.refresh_list()  # what a finished reply does
        assert clist.index == other
        picked = clist.names[other]
        await clist.show(list(reversed(clist.rows)), app.current, set())  # a reply ending re-sorted it
        assert clist.names[clist.index] == picked
        await app.action_new_conversation()  # the open conversation changes: highlight follows
        assert clist.names[clist.index] == app.current

    drive(app, script)


def test_scrolling_up_while_streaming_is_not_undone_by_new_pieces():
    gate = threading.Semaphore(0)
    engine = FakeEngine(gate=gate, reply=" ".join(f"word{i}" for i in range(400)))
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        chat = None
        await type_line(pilot, "Tell me everything")
        chat = app.chat
        try:
            for _ in range(300):
                gate.release()
            # Counted in event-loop pauses: a loaded machine renders 300 pieces slowly.
            await until(pilot, lambda: chat.reply is not None and chat.reply.pieces >= 300, "300 pieces", steps=20000)
            await until(pilot, lambda: chat.max_scroll_y > 0 and chat.scroll_y == chat.max_scroll_y, "following",
                        steps=20000)
            chat.scroll_home(animate=False)
            await until(pilot, lambda: chat.scroll_y == 0, "scrolled up")
            for _ in range(100):
                gate.release()
            await until(pilot, lambda: chat.reply is None, "finished", steps=20000)
            await pilot.pause()
            assert chat.scroll_y == 0  # the reader stays where they scrolled to
        finally:
            for _ in range(500):  # a failed wait must not leave the reply's worker gated: the app could not close
                gate.release()

    drive(app, script)


def test_multiline_input_ctrl_j_adds_a_line_enter_sends():
    engine = FakeEngine()
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await pilot.press("l", "i", "n", "e", "1", "ctrl+j", "l", "i", "n", "e", "2")
        assert app.query_one(PromptInput).text == "line1\nline2"
        await pilot.press("enter")
        await until(pilot, lambda: engine.calls, "the turn sent")
        assert engine.calls[0][1] == "line1\nline2"
        await until(pilot, lambda: app.query_one(PromptInput).text == "", "input cleared")

    drive(app, script)


# -- slash commands ----------------------------------------------------------------------
def test_slash_settings_change_the_next_turn_and_bad_values_are_refused():
    engine = FakeEngine()
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        for line in ["/temp 0", "/top_k 40", "/top_p 0.9", "/min_p 0.05", "/max_tokens 3", "/repeat_penalty 1.1"]:
            await type_line(pilot, line)
        assert app.overrides == {"temperature": 0.0, "top_k": 40, "top_p": 0.9, "min_p": 0.05,
                                 "max_tokens": 3, "repetition_penalty": 1.1}
        assert "temperature = 0.0" in notes(app) and "top_k = 40" in notes(app)
        panel = app.panel.text()
        assert "temp 0.0" in panel and "top_k 40" in panel and "max 3" in panel and "rep 1.1" in panel
        good = dict(app.overrides)
        for bad in ["/temp -1", "/top_p 2", "/top_k -3", "/min_p 1", "/max_tokens 0", "/repeat_penalty 0",
                    "/temp warm", "/top_k 1.5", "/nonsense 3"]:
            await type_line(pilot, bad)
        assert app.overrides == good  # nothing changed
        errors = error_notes(app)
        assert len(errors) == 9
        assert "invalid /temp -1.0: must be >= 0 (0 = greedy)" in errors  # names its command once
        assert any("invalid /top_p 2.0" in e for e in errors) and "/temp: 'warm' is not a number" in errors
        assert any("unknown command /nonsense" in e for e in errors)
        await type_line(pilot, "Hi")
        await until(pilot, lambda: app.chat.replies and app.chat.reply is None, "reply")
        assert engine.calls[-1][2] == good
        assert app.chat.replies[-1].text == "The capital of" and app.chat.replies[-1].finish_reason == "length"

    drive(app, script)


def test_slash_system_reset_memory_model_help():
    engine = fake_with_history()
    app = make_app(engine, model_lister=lambda: [])

    async def script(pilot: Any) -> None:
        await type_line(pilot, "/system")
        assert notes(app)[-1] == "system prompt: You are a helpful assistant."
        await type_line(pilot, "/system Answer in French.")
        assert engine.conversation("chat-2").system == "Answer in French."
        await type_line(pilot, "/remember The cat is called Mo.")
        assert notes(app)[-1] == "remembered #2: The cat is called Mo."
        await type_line(pilot, "/memory")
        assert "#1  My sister's name is Ilse." in notes(app)[-1] and "#2  The cat is called Mo." in notes(app)[-1]
        await type_line(pilot, "/memory cat")
        assert "Mo." in notes(app)[-1] and "Ilse" not in notes(app)[-1]
        await type_line(pilot, "/forget 2")
        assert notes(app)[-1] == "forgot #2" and len(engine.memory) == 1
        await type_line(pilot, "/forget 99")
        assert error_notes(app)[-1] == "/forget: no memory entry #99"
        await type_line(pilot, "/forget #0")  # "#N" as /memory shows ids; ids start at 1
        assert error_notes(app)[-1] == "/forget: memory ids start at 1, got '#0'"
        assert app.query_one(PromptInput).text == ""  # a refused setting or id is not put back
        long = "/remember " + "x" * 2100  # refused: the text the user wrote comes back to mend
        await type_line(pilot, long)
        assert "at most 2000" in error_notes(app)[-1] and app.query_one(PromptInput).text == long
        app.query_one(PromptInput).clear()
        await type_line(pilot, "/remember")  # refused, with nothing written to mend: not put back
        assert app.query_one(PromptInput).text == ""
        await pilot.press("f6")  # no reply with thinking: said, not silently nothing
        assert "no reply here has any" in app.notified[-1][0]
        await type_line(pilot, "/model")  # the picker, with the open model's facts on top
        assert isinstance(app.screen, ModelPicker)
        facts = str(app.screen.query_one("#picker-facts").render())
        assert "open now: fake-135m · float32 · 540.0 MB · context 8192 · cpu" in facts
        await pilot.press("escape")
        assert len(app.chat.replies) == 1
        await type_line(pilot, "/reset")
        assert app.chat.replies == [] and engine.conversation("chat-2").messages == []
        await type_line(pilot, "/help")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)

    drive(app, script)


def test_model_command_loads_another_model_and_a_bad_one_keeps_the_old():
    loaded = []

    def loader(model: Any) -> FakeEngine:
        if model == "nope":
            raise ModelNotFoundError(f"no model called {model!r}")
        loaded.append(model)
        return FakeEngine(model_name=f"fake-{model}")

    first = FakeEngine()
    app = record_notifications(ChatApp(first, loader=loader, memory_probe=lambda: 1))

    async def script(pilot: Any) -> None:
        await type_line(pilot, "/model nope")
        await until(pilot, lambda: any("no model called 'nope'" in m for m, _ in notifications(app)), "error shown")
        assert app.engine is first and app.chat is not None
        await type_line(pilot, "/model other")
        await until(pilot, lambda: app.engine is not first, "the new model")
        await until(pilot, lambda: app.chat is not None and app.engine.model_name == "fake-other", "ready")
        assert loaded == ["other"] and not first.closed  # a model passed in is its caller's to close

    drive(app, script)


def test_opens_the_requested_conversation_and_refuses_a_bad_name():
    engine = fake_with_history()
    app = make_app(engine, conversation="chat-1")

    async def script(pilot: Any) -> None:
        assert app.current == "chat-1"

    drive(app, script)
    app = make_app(engine, conversation="../escape")

    async def script2(pilot: Any) -> None:
        assert app.current == "chat-3"  # refused, a new one instead
        assert any("invalid conversation name" in m for m, _ in notifications(app))

    drive(app, script2)


# -- errors ---------------------------------------------------------------------------------
def test_engine_errors_are_notifications_not_tracebacks():
    engine = FakeEngine(fail_with=StoreError("disk full: cannot store the turn"))
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Hello")
        await until(pilot, lambda: app.chat.replies and app.chat.reply is None, "failed reply")
        assert app.chat.replies[-1].finish_reason == "error"
        assert ("disk full: cannot store the turn", "error") in notifications(app)
        assert app.is_running

    drive(app, script)


def test_logged_warnings_from_the_engine_become_notifications():
    import logging
    import warnings

    app = make_app(FakeEngine())

    async def script(pilot: Any) -> None:
        logging.getLogger("mlotspark.conversations.conversation").warning("snapshot of %r refused", "chat-1")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("conversation 'chat-1': snapshot not used", UserWarning)
        await until(pilot, lambda: len(notifications(app)) >= 2, "two notifications")
        assert ("snapshot of 'chat-1' refused", "warning") in notifications(app)
        assert ("conversation 'chat-1': snapshot not used", "warning") in notifications(app)

    drive(app, script)
    assert app.log_handler not in logging.getLogger("mlotspark").handlers  # removed on exit


def test_a_model_that_cannot_load_is_shown_not_raised():
    def loader(model: Any) -> Any:
        raise ModelNotFoundError("no model at './missing.gguf'")

    app = record_notifications(ChatApp(model="./missing.gguf", loader=loader))

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: app.sub_title == "no model", "the failure shown")
        assert "no model at './missing.gguf'" in str(app.query_one("#loading-text").render())
        await type_line(pilot, "Hello")
        assert ("The model is still loading.", "warning") in notifications(app)
        await type_line(pilot, "/temp 0")
        assert any("still loading" in m for m, _ in notifications(app))

    drive(app, script)


def test_a_first_time_conversion_shows_under_the_loading_line():
    from mlotspark import steps

    release = threading.Event()

    def loader(model: Any) -> Any:
        with steps.step("converting big.gguf (once)", total=80_000_000, unit="B") as s:
            s.advance(20_000_000)
            release.wait(30)
        return FakeEngine()

    app = record_notifications(ChatApp(model="./big.gguf", loader=loader, memory_probe=lambda: 1, poll_s=0.02))

    async def script(pilot: Any) -> None:
        text = lambda: str(app.query_one("#loading-text").render())  # noqa: E731
        await until(pilot, lambda: "converting big.gguf (once) · 20/80 MB (25%)" in text(), "the conversion")
        release.set()
        await until(pilot, lambda: app.chat is not None, "the model loaded")

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            try:
                await script(pilot)
            finally:
                release.set()

    asyncio.run(main())


def test_figures_that_cannot_be_read_show_a_dash():
    class Unreadable:
        def stats(self) -> dict:
            raise StoreError("the store is unreadable")

    class Broken(FakeEngine):
        @property
        def persistence(self) -> Any:
            return Unreadable()

        def status(self) -> dict:
            raise MlotsparkError("the engine thread is gone")

    app = ChatApp(Broken(), memory_probe=lambda: None)

    async def script(pilot: Any) -> None:
        await pilot.pause(0.05)
        text = app.panel.text()
        assert f"thermal  {DASH}" in text and f"episodic {DASH}" in text and f"memory   {DASH}" in text

    drive(app, script)


def test_cli_chat_rejects_a_bad_option_before_loading(capsys):
    from mlotspark.cli.entry import main

    assert main(["chat", "--temp", "-2"]) == 2
    assert "invalid --temp -2.0" in capsys.readouterr().err
    # a bad conversation name too (it had shown a passing toast, then opened an empty chat-N)
    for bad in ("../escape", "a/b", "x" * 300):
        assert main(["chat", "-c", bad]) == 2
        assert "invalid conversation name" in capsys.readouterr().err


def test_a_streaming_reply_writes_its_pieces_in_batches_and_all_of_them():
    """Pieces arriving faster than STREAM_EVERY_S are written together (by a timer, or at
    the end); none is lost, and the reply shows them before it finishes."""
    from textual.app import App
    from textual.widgets import Markdown

    from tui.widgets.chat import STREAM_EVERY_S, Reply

    class One(App[None]):
        def compose(self):
            yield Reply(streaming=True)

    async def body() -> None:
        app = One()
        async with app.run_test(size=SIZE) as pilot:
            reply = app.query_one(Reply)
            writes: list[str] = []
            real = reply._stream.write

            async def counted(fragment: str) -> None:
                writes.append(fragment)
                await real(fragment)

            reply._stream.write = counted
            for piece in ["Hello", ", ", "wor", "ld", "!"]:
                await reply.append(piece)
            await asyncio.sleep(STREAM_EVERY_S * 3)
            await pilot.pause()
            assert "".join(writes) == "Hello, world!" and len(writes) < 5  # batched, nothing lost
            assert "Hello, world!" in app.query_one(Markdown).source
            await reply.append(" Bye.")
            await reply.finish("stop")
            assert "".join(writes) == "Hello, world! Bye."
            assert app.query_one(Markdown).source == "Hello, world! Bye."

    asyncio.run(body())


def test_remember_names_a_duplicate_memory_lists_entries_and_forget_removes_one(tmp_path):
    from mlotspark.memory.semantic import HashingEmbedder, SemanticStore

    engine = fake_with_history()
    engine.memory = SemanticStore(tmp_path / "m.db", HashingEmbedder())  # the real store: its ids
    app = make_app(engine, model_lister=lambda: [])

    async def script(pilot: Any) -> None:
        await type_line(pilot, "/remember I live in Utrecht.")
        assert notes(app)[-1] == "remembered #1: I live in Utrecht."
        await type_line(pilot, "/remember I moved to Porto last month.")
        assert notes(app)[-1] == "remembered #2: I moved to Porto last month."
        await type_line(pilot, "/memory")
        assert "#1  I live in Utrecht." in notes(app)[-1] and "#2  I moved to Porto last month." in notes(app)[-1]
        await type_line(pilot, "/remember i live in utrecht")  # said again: the same entry
        assert notes(app)[-1] == "already remembered as #1: I live in Utrecht."
        await type_line(pilot, "/forget 1")
        assert notes(app)[-1].startswith("forgot #1")

    try:
        drive(app, script)
    finally:
        engine.memory.close()


def test_a_retrieved_entry_forgotten_in_the_same_turn_says_so():
    import types

    from tui.backend import memory_texts

    store = types.SimpleNamespace(get=lambda i: types.SimpleNamespace(text="I live in Porto.") if i == 1 else None)
    assert memory_texts(types.SimpleNamespace(memory=store), [1, 2]) == ["#1 I live in Porto.", "#2 (forgotten)"]
    assert memory_texts(types.SimpleNamespace(), [3]) == ["#3"]  # no store to read: the bare id


