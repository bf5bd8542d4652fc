"""``chat --mcp``: a call of an MCP tool is asked about (once / always / never, per
conversation), run on a real hub (tests/mcp_test_server.py), shown as a result block, fed
back as a tool turn whose reply goes on under it; a model that keeps calling ends at the bound."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_tui import drive, make_app, notes, type_line
from test_tui_fakes import FakeEngine, until
from tool_models import QWEN_TOOL_TEMPLATE

from mlotspark.tools import McpHub
from mlotspark.tools.mcp_config import parse_mcp_config
from tui.mcp_turns import MAX_CALLS
from tui.screens import ToolApproval
from tui.tools import ToolSpec
from tui.widgets import ToolCallBlock, ToolResultBlock
from tui.widgets.chat import StoredResult

SERVER = {"command": sys.executable, "args": [str(Path(__file__).with_name("mcp_test_server.py"))]}


def call_reply(text: str) -> str:
    return f'<tool_call>\n{{"name": "echo", "arguments": {{"text": "{text}"}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def hub():
    h = McpHub(parse_mcp_config({"mcpServers": {"mine": SERVER}}), call_timeout_s=5).start()
    yield h
    h.close()


def mcp_app(hub: Any, replies: list[str], reply: str = "Done.") -> tuple[Any, FakeEngine]:
    engine = FakeEngine(reply=reply, replies=list(replies),
                        tokenizer=SimpleNamespace(chat_template=QWEN_TOOL_TEMPLATE))
    return make_app(engine, tools=ToolSpec(hub.openai_tools(), "auto", "mcp.json"), mcp=hub), engine


def test_a_call_is_asked_run_shown_and_fed_back(hub):
    app, engine = mcp_app(hub, [call_reply("hi"), "The tool said hi.", call_reply("again"), "Twice."])

    async def script(pilot: Any) -> None:
        assert notes(app)[-1].startswith("MCP tools (") and "echo" in notes(app)[-1]
        await type_line(pilot, "Echo hi")
        await until(pilot, lambda: isinstance(app.screen, ToolApproval), "the question")
        assert "Run tool echo on MCP server mine?" in app.screen.question and '"text": "hi"' in app.screen.question
        box = app.screen.query_one(".dialog").region  # centred over the chat, as the other dialogs are
        assert abs(box.x + box.width / 2 - app.size.width / 2) <= 1 and box.y > 0
        await pilot.press("a")  # always, for this conversation
        await until(pilot, lambda: len(engine.calls) == 2 and app.chat.reply is None, "the turn ended")
        reply = app.chat.query("Reply").last()
        (block,) = reply.query(ToolResultBlock)
        assert block.outcome.output == "echo: hi" and "tool result echo" in block.text
        assert "asked before it runs" in reply.query_one(ToolCallBlock).text
        assert engine.roles == ["user", "tool"] and engine.calls[1][1] == "echo: hi"  # the result, fed back
        assert "The tool said hi." in reply.text and "<tool_call>" not in reply.text
        await type_line(pilot, "Once more")  # "always": no question this time
        await until(pilot, lambda: len(engine.calls) == 4 and app.chat.reply is None, "the second turn")
        assert not isinstance(app.screen, ToolApproval) and engine.calls[3][1] == "echo: again"

    drive(app, script)
    assert engine.conversation(app.current).tool_approvals == {"echo": "always"}  # kept with the conversation
    # opened again (as after a restart): each reply shows its call, the result and the text after it
    engine.replies += [call_reply("third"), "Thrice."]
    again = make_app(engine, conversation=app.current, tools=ToolSpec(hub.openai_tools(), "auto", "mcp.json"),
                     mcp=hub)

    async def reopened(pilot: Any) -> None:
        first, second = again.chat.replies
        shown = [type(w).__name__ for w in first.children if w.display and not w.has_class("mark")]
        assert shown == ["ToolCallBlock", "ToolResultBlock", "Markdown"]  # the call, its result, the text after
        assert first.query_one(ToolCallBlock).call.arguments == {"text": "hi"}
        assert "its result below" in first.query_one(ToolCallBlock).text
        (block,) = first.query(ToolResultBlock)
        assert block.outcome.error is None and block.text == "↳ tool result echo\necho: hi"
        assert "The tool said hi." in first.text and "<tool_call>" not in first.text
        assert second.query_one(ToolResultBlock).text.endswith("echo: again") and "Twice." in second.text
        shown = [type(w).__name__ for w in again.chat.children if type(w).__name__ in ("UserMessage", "Reply")]
        assert shown == ["UserMessage", "Reply", "UserMessage", "Reply"]  # the tool turns are inside the replies
        await type_line(pilot, "And a third time")  # "always" was kept: no question after reopening
        await until(pilot, lambda: len(engine.calls) == 6 and again.chat.reply is None, "the third turn")
        assert engine.calls[5][1] == "echo: third"
        assert "always allowed in this conversation" in again.chat.replies[-1].query_one(ToolCallBlock).text

    drive(again, reopened)


def test_parallel_calls_go_back_as_a_tool_message_each_and_show_so_when_reopened(hub):
    app, engine = mcp_app(hub, [call_reply("one") + "\n" + call_reply("two"), "Both ran."])

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Echo twice")
        await until(pilot, lambda: isinstance(app.screen, ToolApproval), "the question")
        await pilot.press("a")
        await until(pilot, lambda: len(engine.calls) == 2 and app.chat.reply is None, "the turn ended")
        stored = engine.conversation(app.current).messages
        assert [m["role"] for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
        assert [m["content"] for m in stored[2:4]] == ["echo: one", "echo: two"]  # as run_turn sends them

    drive(app, script)
    again = make_app(engine, conversation=app.current, tools=ToolSpec(hub.openai_tools(), "auto", "mcp.json"))

    async def reopened(pilot: Any) -> None:
        (reply,) = again.chat.replies
        assert [b.text for b in reply.query(ToolResultBlock)] == ["↳ tool result echo\necho: one",
                                                                   "↳ tool result echo\necho: two"]
        assert "Both ran." in reply.text

    drive(again, reopened)


def test_never_is_remembered_and_a_looping_model_ends(hub):
    app, engine = mcp_app(hub, [], reply=call_reply("loop"))  # every reply calls again

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Loop")
        await until(pilot, lambda: isinstance(app.screen, ToolApproval), "the question")
        await pilot.press("n")
        await until(pilot, lambda: app.chat.reply is None, "the turn ended", steps=6000)
        results = app.chat.query("Reply").last().query(ToolResultBlock)
        assert [b.outcome.error for b in results] == ["the user declined to run echo"] * MAX_CALLS
        stored = StoredResult.of(list(app.chat.replies[-1].calls[:1]), engine.calls[1][1])
        assert stored.error == "the user declined to run echo"  # as it is shown again after a restart
        # asked once; past the bound the results are read without tools, and the turn ends
        assert engine.roles == ["user"] + ["tool"] * MAX_CALLS and "tools" not in engine.calls[-1][2]
        assert all("tools" in c[2] for c in engine.calls[:-1])
        *asked, last = [b.text for b in app.chat.query("Reply").last().query(ToolCallBlock)]
        assert len(asked) == MAX_CALLS and "asked before it runs" in asked[0]
        assert all("not run, declined for this conversation" in t for t in asked[1:])  # said, not asked again
        assert "shown, not run" in last  # the call of the round given no tools is not an MCP run
        assert any(f"{MAX_CALLS} tool calls answered for this message" in m for m, _ in app.notified)

    drive(app, script)


def test_a_question_dismissed_or_a_turn_stopped_while_asking_keeps_no_answer(hub):
    """Escape runs not this call and keeps nothing; stopping the turn (or quitting) while the
    question is open keeps nothing either, and no reply reads the result."""
    app, engine = mcp_app(hub, [call_reply("one"), "Fine.", call_reply("two") + "\n" + call_reply("three")])

    async def script(pilot: Any) -> None:
        await type_line(pilot, "Echo one")
        await until(pilot, lambda: isinstance(app.screen, ToolApproval), "the question")
        assert "Escape: not this call" in app.screen.question
        await pilot.press("escape")
        await until(pilot, lambda: len(engine.calls) == 2 and app.chat.reply is None, "the turn ended")
        assert engine.calls[1][1] == "error: not run: the user did not answer about echo"
        await type_line(pilot, "Echo two")
        await until(pilot, lambda: isinstance(app.screen, ToolApproval), "asked again: nothing was kept")
        app.action_cancel_reply()  # Escape on the chat: the turn stops with the question open
        await until(pilot, lambda: app.chat.reply is None and not isinstance(app.screen, ToolApproval),
                    "the stopped turn ended")
        assert len(engine.calls) == 3  # no reply generated to read the unanswered call
        stored = engine.conversation(app.current).messages
        assert stored[-2:] == [{"role": "tool", "content": "error: not run: the user did not answer about echo"},
                               {"role": "tool", "content": "error: not run: the reply was stopped"}]  # not asked
        assert engine.conversation(app.current).tool_approvals == {}

    drive(app, script)
