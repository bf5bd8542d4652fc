"""The chat's model picker (F3, ``/model``), tool calls shown and never run (``--tools``,
``/tools``), and the memory signal in the side panel, with the scripted fake engine."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from test_tui import drive, error_notes, make_app, notes, notifications, record_notifications, type_line
from test_tui_fakes import FakeEngine, until
from tool_models import QWEN_TOOL_TEMPLATE, TIME, WEATHER

from mlotspark.cli.entry import main
from mlotspark.errors import ModelNotFoundError
from tui import ChatApp
from tui.backend import MachineFigures, ModelRow
from tui.picker import ModelPicker
from tui.widgets import ToolCallBlock
from tui.widgets.stats import machine_text

ROWS = [
    ModelRow("fake-135m", "catalogue", 98_000_000, True, "/m/fake.gguf", default=True),
    ModelRow("other", "catalogue", 491_000_000, False, "/m/other.gguf"),
    ModelRow("broken", "used before", 1_000, True, "/x/broken.gguf"),
]
CALL_REPLY = ('Let me look that up. <tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris", "celsius": true}}\n</tool_call>')


def loader_of(opened: list) -> Any:
    def loader(model: Any) -> FakeEngine:
        if model == "broken":
            raise ModelNotFoundError(f"no model called {model!r}")
        engine = FakeEngine(model_name=model or "fake-135m")
        opened.append(engine)
        return engine
    return loader


# -- the model picker ----------------------------------------------------------------------
def test_f3_lists_the_models_and_switching_closes_the_old_engine():
    opened: list = []
    app = record_notifications(ChatApp(loader=loader_of(opened), model_lister=lambda: ROWS,
                                       memory_probe=lambda: 1))

    async def script(pilot: Any) -> None:
        first = app.engine
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.rows, "the rows")
        picker = app.screen
        lines = [str(picker.query_one("#picker-list").get_option_at_index(i).prompt) for i in range(3)]
        assert "● fake-135m" in lines[0] and "on disk" in lines[0] and "98.0 MB" in lines[0]
        assert "(default, open now)" in lines[0]
        assert "○ other" in lines[1] and "to pull" in lines[1] and "491.0 MB" in lines[1]
        assert "open now: fake-135m" in str(picker.query_one("#picker-facts").render())
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.engine is not first and app.chat is not None, "the new model open")
        assert app.engine.model_name == "other" and app.sub_title.startswith("other")
        await until(pilot, lambda: first.closed, "the old engine closed")

    drive(app, script)


def test_a_model_that_fails_to_load_keeps_the_old_one_and_says_why_in_one_line():
    opened: list = []
    app = record_notifications(ChatApp(loader=loader_of(opened), model_lister=lambda: ROWS,
                                       memory_probe=lambda: 1))

    async def script(pilot: Any) -> None:
        first = app.engine
        await type_line(pilot, "/model")
        await until(pilot, lambda: isinstance(app.screen, ModelPicker) and app.screen.rows, "the picker")
        await pilot.press("down", "down", "enter")
        await until(pilot, lambda: any("no model called 'broken'" in m for m, _ in notifications(app)), "the error")
        await until(pilot, lambda: app.loading_since is None and app.chat is not None, "the chat back")
        message = next(m for m, _ in notifications(app) if "broken" in m)
        assert "\n" not in message and app.engine is first and not first.closed
        await type_line(pilot, "Still there?")
        await until(pilot, lambda: first.calls, "a turn on the old model")
        # Escape closes the picker without a change; /model NAME of the open model loads nothing
        await pilot.press("f3")
        await until(pilot, lambda: isinstance(app.screen, ModelPicker), "the picker")
        await pilot.press("escape")
        assert not isinstance(app.screen, ModelPicker) and app.engine is first
        await type_line(pilot, "/model fake-135m")
        assert notes(app)[-1] == "fake-135m is open already" and len(opened) == 1

    drive(app, script)


# -- tools ---------------------------------------------------------------------------------
def tool_engine(reply: str = CALL_REPLY, **kw: Any) -> FakeEngine:
    return FakeEngine(reply=reply, tokenizer=SimpleNamespace(chat_template=QWEN_TOOL_TEMPLATE), **kw)


def write_tools(tmp_path: Any, doc: Any) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_tool_call_shows_as_a_block_never_as_markup_and_is_not_run(tmp_path):
    gate = threading.Semaphore(0)
    engine = tool_engine(gate=gate)
    app = make_app(engine)
    tools = write_tools(tmp_path, [WEATHER, TIME])

    async def script(pilot: Any) -> None:
        await type_line(pilot, f"/tools {tools}")
        assert notes(app)[-1] == f"tools: get_weather, get_time from {tools}; calls are shown, not run"
        await type_line(pilot, "Weather in Paris?")
        seen = []
        for _ in range(len(CALL_REPLY.split(" "))):
            gate.release()
            await pilot.pause(0.02)
            if app.chat.reply is not None:
                seen.append(app.chat.reply.text)
        await until(pilot, lambda: app.chat.reply is None, "the reply ended")
        reply = app.chat.replies[-1]
        assert all("<tool" not in t and "get_weather" not in t for t in seen)  # never shown while streaming
        assert reply.text.strip() == "Let me look that up." and "<tool_call>" not in reply.text
        block = reply.query_one(ToolCallBlock)
        assert block.call.name == "get_weather" and block.call.arguments == {"city": "Paris", "celsius": True}
        shown = block.text
        assert "get_weather" in shown and '"city": "Paris"' in shown and "not run" in shown
        options = engine.calls[-1][2]
        assert [t["function"]["name"] for t in options["tools"]] == ["get_weather", "get_time"]
        assert options["tool_choice"] == "auto"
        # the stored reply (in the model's own format) shows the same block after a restart
        assert "<tool_call>" in engine.conversation(app.current).messages[-1]["content"]
        await type_line(pilot, "/tools off")
        await type_line(pilot, "And now?")
        for _ in range(20):
            gate.release()
        await until(pilot, lambda: len(engine.calls) == 2 and app.chat.reply is None, "a turn without tools")
        assert "tools" not in engine.calls[-1][2]

    drive(app, script)

    again = make_app(engine)

    async def reopened(pilot: Any) -> None:
        first = again.chat.replies[0]
        assert first.text.strip() == "Let me look that up." and first.query_one(ToolCallBlock).call.name == "get_weather"

    drive(again, reopened)

    # opened under a model without tool support, the stored call still shows as a block
    engine.tokenizer = None
    plain = make_app(engine)

    async def no_support(pilot: Any) -> None:
        first = plain.chat.replies[0]
        assert "<tool_call>" not in first.text and first.query_one(ToolCallBlock).call.name == "get_weather"

    drive(plain, no_support)


def test_tools_from_the_command_line_and_a_model_without_tool_support(tmp_path):
    from tui.tools import load_tools

    spec = load_tools(write_tools(tmp_path, {"tools": [WEATHER], "tool_choice": "required"}))
    engine = FakeEngine()  # no chat template: no tool support
    app = make_app(engine, tools=spec)

    async def script(pilot: Any) -> None:
        notice = [n for n in error_notes(app) if n.startswith("tools:")]
        assert len(notice) == 1 and "fake-135m has no tool support in its chat template" in notice[0]
        await type_line(pilot, "Hello")
        await until(pilot, lambda: engine.calls and app.chat.reply is None, "the turn")
        assert "tools" not in engine.calls[-1][2]  # not sent to a model that cannot take them
        await type_line(pilot, "/tools")
        assert "get_weather" in notes(app)[-2] and "tool_choice required" in notes(app)[-2]

    drive(app, script)

    supported = tool_engine()
    app2 = make_app(supported, tools=spec)

    async def with_support(pilot: Any) -> None:
        assert not [n for n in error_notes(app2) if n.startswith("tools:")]
        await type_line(pilot, "Weather?")
        await until(pilot, lambda: supported.calls and app2.chat.reply is None, "the turn")
        assert supported.calls[-1][2]["tool_choice"] == "required"

    drive(app2, with_support)


def test_bad_tools_are_refused_naming_them(tmp_path):
    app = make_app(tool_engine())
    missing = str(tmp_path / "nope.json")
    not_json = tmp_path / "bad.json"
    not_json.write_text("{")
    bad_tool = write_tools(tmp_path, [{"type": "function", "function": {"name": ""}}])

    async def script(pilot: Any) -> None:
        await type_line(pilot, f"/tools {missing}")
        assert "cannot read tools file" in error_notes(app)[-1] and "nope.json" in error_notes(app)[-1]
        await type_line(pilot, f"/tools {not_json}")
        assert "is not JSON" in error_notes(app)[-1]
        await type_line(pilot, f"/tools {bad_tool}")
        assert "tools[0].function.name" in error_notes(app)[-1]
        assert app.tools is None

    drive(app, script)


@pytest.mark.parametrize("doc, needle", [
    (None, "cannot read tools file"),
    ([], "holds no tools"),
    ([{"type": "function", "function": {"name": "x", "parameters": 3}}], "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "x"}}],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "invalid tool_choice: names no given tool"),
])
def test_chat_tools_flag_refuses_a_bad_file_in_one_line(tmp_path, capsys, doc, needle):
    path = tmp_path / "tools.json"
    if doc is not None:
        path.write_text(json.dumps(doc))
    code = main(["chat", "--tools", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0]


# -- the memory signal -------------------------------------------------------------------------
def test_the_machine_panel_says_the_memory_signal_its_reading_and_kv_against_the_budget():
    linux = machine_text(MachineFigures(memory_signal="psutil available memory", pressure=0.41,
                                        available_bytes=14_200_000_000, kv_bytes=1_200_000,
                                        kv_budget=7_100_000_000), rss=1, peak_mb=None).plain
    assert "signal   psutil available memory" in linux
    assert "pressure 41% used · 14.2 GB free" in linux and "KV       1.2 MB of 7.1 GB budget" in linux
    mac = machine_text(MachineFigures(memory_signal="kernel pressure level", pressure_level=1,
                                      kv_bytes=0, kv_budget=10_300_000_000), rss=1, peak_mb=None).plain
    assert "signal   kernel pressure level" in mac and "pressure warn" in mac
    assert "KV       0.0 MB of 10.3 GB budget" in mac
    assert "signal   —" in machine_text(None, None, None).plain


def test_the_panel_follows_the_engine_memory_figures():
    engine = FakeEngine()
    app = make_app(engine, poll_s=0.05)

    async def script(pilot: Any) -> None:
        await until(pilot, lambda: "41% used" in app.panel.text(), "the first reading")
        assert "psutil available memory" in app.panel.text() and "of 7.1 GB budget" in app.panel.text()
        engine.reading = {"memory_pressure_level": 2}
        engine.memory_status = {"signal": "kernel pressure level (kern.memorystatus_vm_pressure_level)",
                                "source": "Metal recommended working set", "kv_budget_bytes": 10_300_000_000}
        engine.kv_bytes = 52_000_000
        await until(pilot, lambda: "pressure critical" in app.panel.text(), "the new reading")
        assert "kernel pressure level" in app.panel.text() and "52.0 MB of 10.3 GB budget" in app.panel.text()

    drive(app, script)


# -- a real (tiny random) model through the app ------------------------------------------------
def test_a_real_tool_model_calls_through_the_chat_and_the_panel_reads_the_engine(tmp_path):
    """A tiny random model with Qwen2.5's tool template, loaded by the app as ``chat -m``
    does: with ``tool_choice`` required the grammar leaves it only valid calls, which the
    conversation stores in the model's format and the chat shows as blocks."""
    import asyncio

    from tool_models import write_tool_model

    from tui.tools import ToolSpec

    path = write_tool_model(tmp_path / "tool.gguf")
    app = ChatApp(model=str(path), tools=ToolSpec([WEATHER], "required", "test"), options={"max_tokens": 256},
                  memory_probe=lambda: 1, poll_s=0.2)

    async def run() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.chat is not None or app.sub_title == "no model", "loaded", steps=20000)
            assert app.chat is not None and app.tool_fmt is not None
            await type_line(pilot, "Weather in Oslo?")
            await until(pilot, lambda: app.chat.replies and app.chat.reply is None, "the reply", steps=20000)
            reply = app.chat.replies[-1]
            calls = [b.call for b in reply.query(ToolCallBlock)]
            assert calls and calls[0].name == "get_weather" and calls[0].arguments["city"] in ("Paris", "Rome", "Oslo")
            assert "<tool_call>" not in reply.text
            await until(pilot, lambda: "psutil available memory" in app.panel.text(), "the memory signal",
                        steps=20000)
            assert "of " in app.panel.text() and "GB budget" in app.panel.text()

    asyncio.run(run())



def test_a_call_cut_short_by_max_tokens_is_dropped_and_said_so(tmp_path):
    engine = tool_engine()
    app = make_app(engine, options={"max_tokens": 8})
    tools = write_tools(tmp_path, [WEATHER])

    async def script(pilot: Any) -> None:
        await type_line(pilot, f"/tools {tools}")
        await type_line(pilot, "Weather?")
        await until(pilot, lambda: engine.calls and app.chat.reply is None, "the reply")
        reply = app.chat.replies[-1]
        assert "<tool_call>" not in reply.text and "cut short by max_tokens" in reply.text
        assert not reply.query(ToolCallBlock) and reply.finish_reason == "length"

    drive(app, script)


@pytest.mark.parametrize("reply, shown, calls", [
    # Qwen2.5-Coder under auto writes a bare JSON call, no <tool_call> tags
    ('{"name": "get_weather", "arguments": {"city": "Paris", "celsius": true}}', "", ["get_weather"]),
    ('  {"name": "nope", "arguments": {}}', '{"name": "nope", "arguments": {}}', []),  # not a given tool: text
    ("Sunny. <tool_call>\n" '{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>', "Sunny.", ["get_time"]),
    ("Just words.", "Just words.", []),
])
def test_the_splitter_turns_bare_and_tagged_calls_into_calls(reply, shown, calls):
    from tui.tools import ReplySplitter, tool_support

    fmt = tool_support(SimpleNamespace(tokenizer=SimpleNamespace(chat_template=QWEN_TOOL_TEMPLATE)))
    splitter = ReplySplitter(fmt, ["get_weather", "get_time"])
    text, got = "", []
    for i in range(0, len(reply), 3):  # cut anywhere
        t, c = splitter.feed(reply[i:i + 3])
        text, got = text + t, got + c
    t, c = splitter.close()
    text, got = text + t, got + c
    assert text.strip() == shown and [c.name for c in got] == calls and "<tool_call>" not in text
