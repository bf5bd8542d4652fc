"""The chat TUI's conversation list and focus with a scripted fake engine: new, rename,
delete with undo (F2/F8/F9 act on the highlighted conversation, named by its title), focus
moving to the input after opening one and always visible (``App.run_test`` + Pilot). Split
from ``test_tui.py`` (whose helpers it imports) to keep each file short.
"""

from __future__ import annotations

from typing import Any

from test_tui import drive, make_app, type_line
from test_tui_fakes import fake_with_history, until

from tui.screens import Confirm, TextPrompt
from tui.widgets import ConversationList, PromptInput


# -- conversations -------------------------------------------------------------------------
def test_new_rename_delete_conversations():
    engine = fake_with_history()
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        clist = app.query_one(ConversationList)
        assert app.current == "chat-2" and clist.names == ["chat-2", "chat-1"]
        await pilot.press("ctrl+n")
        await until(pilot, lambda: app.current == "chat-3" and "chat-3" in clist.names, "chat-3 listed")
        assert "chat-3" in engine.store  # stored before its first turn
        await pilot.press("f2")
        assert isinstance(app.screen, TextPrompt)
        for ch in "Trip plans":  # the old title is selected: typing replaces it
            await pilot.press("space" if ch == " " else ch)
        await pilot.press("enter")
        await until(pilot, lambda: "Trip plans" in [r.label for r in clist.rows], "renamed")
        await pilot.press("f8")
        assert isinstance(app.screen, Confirm) and "“Trip plans”" in app.screen.question
        await pilot.press("n")
        assert "chat-3" in engine.store
        await pilot.press("f8")
        await pilot.press("y")
        await until(pilot, lambda: "chat-3" not in clist.names, "deleted")
        assert app.current == "chat-2"
        app.purge()  # the undo time is over (or the app quits): the files go
        assert "chat-3" not in engine.store

    drive(app, script)


def test_f8_deletes_the_highlighted_conversation_by_its_title_and_f9_undoes_it():
    engine = fake_with_history()  # chat-2 (open, newest), chat-1 "Rust lifetimes"
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        clist = app.query_one(ConversationList)
        assert app.current == "chat-2"
        clist.focus()  # deferred (call_later): the keys must find it done
        await until(pilot, lambda: clist.has_focus, "the list focused")
        await pilot.press("down")  # highlight chat-1; chat-2 stays open
        await until(pilot, lambda: clist.index == 1, "chat-1 highlighted")
        await pilot.press("f8")
        assert isinstance(app.screen, Confirm)
        assert "“Rust lifetimes”" in app.screen.question and "chat-2" not in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: clist.names == ["chat-2"], "chat-1 hidden")
        assert app.current == "chat-2" and "chat-1" in engine.store  # kept for undo
        await pilot.press("f9")
        await until(pilot, lambda: app.current == "chat-1" and "chat-1" in clist.names, "chat-1 back")
        assert engine.conversation("chat-1").title == "Rust lifetimes" and not app.trash
        # F2 on the highlighted one names it too; once the undo time is over, a delete is for good
        app.undo_s = 0.05
        clist.focus()
        clist.index = 0  # the first row, highlighted while the list has focus
        first = clist.rows[0]
        await pilot.press("f2")
        assert isinstance(app.screen, TextPrompt) and f"“{first.label}”" in app.screen.title_text
        await pilot.press("escape")
        await pilot.press("f8")
        await pilot.press("y")
        await until(pilot, lambda: first.name not in engine.store, "deleted after the undo time")

    drive(app, script)


def test_opening_from_the_list_moves_focus_to_the_input():
    engine = fake_with_history()
    app = make_app(engine)

    async def script(pilot: Any) -> None:
        clist = app.query_one(ConversationList)
        clist.focus()  # deferred (call_later): the keys must find it done
        await until(pilot, lambda: clist.has_focus, "the list focused")
        await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: app.current == "chat-1", "chat-1 opened")
        await until(pilot, lambda: app.query_one(PromptInput).has_focus, "focus on the input")
        await pilot.press("h", "i")
        assert app.query_one(PromptInput).text == "hi"  # typed text lands in the input

    drive(app, script)


def _look(widget: Any) -> tuple:
    """What shows of ``widget`` and its containers: borders, outline, colours, text style
    (not Textual's 5% focus tint, too faint to count as a visible focus)."""
    out = []
    for w in [widget, *widget.ancestors_with_self[1:]]:
        if not hasattr(w, "styles"):
            continue
        st = w.styles
        out.append((str(st.border), str(st.outline), str(st.background), str(st.color), str(st.text_style)))
        out.extend(str(c.styles.color) for c in w.query(".panel-title"))
    return tuple(out)


def test_focus_is_always_visible():
    """Tab through every focusable widget of the main screen and of the dialogs: each
    looks different focused than not (a border, an edge line or reversed text)."""
    engine = fake_with_history()
    app = make_app(engine)

    async def walk(pilot: Any) -> list[str]:
        chain = list(app.screen.focus_chain)
        assert chain
        seen = []
        for _ in chain:
            await pilot.press("tab")
            await pilot.pause()
            w = app.focused
            assert w is not None
            focused = _look(w)
            app.screen.set_focus(None)
            await pilot.pause()
            assert _look(w) != focused, f"{type(w).__name__}#{w.id} shows no focus"
            w.focus()
            await pilot.pause()
            seen.append(type(w).__name__)
        return seen

    async def script(pilot: Any) -> None:
        main = await walk(pilot)
        assert {"ConversationList", "ChatLog", "PromptInput", "StatsPanel"} <= set(main)
        app.push_screen(Confirm("Delete 'x'?"))
        await until(pilot, lambda: isinstance(app.screen, Confirm) and app.screen.focus_chain, "the dialog")
        assert set(await walk(pilot)) == {"Button"}
        app.pop_screen()
        app.push_screen(TextPrompt("Rename", "old"))
        await until(pilot, lambda: isinstance(app.screen, TextPrompt) and app.screen.focus_chain, "the prompt")
        assert "Input" in await walk(pilot)
        app.pop_screen()

    drive(app, script)


def test_titles_and_values_holding_markup_are_shown_as_typed():
    """A title such as "What does [/INST] mean?" in the rename and delete dialogs, and a bad
    value such as ``[/]`` in a notification, are plain text (as Textual markup they ended the
    app with a MarkupError)."""
    engine = fake_with_history()
    app = make_app(engine)
    title = "What does [/INST] mean? [red]x[/red] [/]"

    async def script(pilot: Any) -> None:
        app.engine.conversation(app.current).title = title
        await app.refresh_list()
        await pilot.press("f2")
        assert isinstance(app.screen, TextPrompt)
        await pilot.press("escape")
        await pilot.press("f8")
        assert isinstance(app.screen, Confirm) and title in app.screen.question
        await pilot.pause()
        await pilot.press("n")
        await type_line(pilot, "/temp [/]")
        await until(pilot, lambda: any("'[/]' is not a number" in m for m, _ in app.notified), "the refusal")
        await pilot.pause()
        assert app.is_running

    drive(app, script)
