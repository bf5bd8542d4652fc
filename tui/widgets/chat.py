"""The chat: messages of one conversation, the reply streaming as Markdown, and the input."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.console import Group
from rich.json import JSON
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static, TextArea
from textual.widgets.markdown import MarkdownStream

# Keys that put a newline into the prompt. Shift+Enter only reaches us on terminals
# with the kitty keyboard protocol; Ctrl+J (a line feed) and Alt+Enter work everywhere.
NEWLINE_KEYS = ("shift+enter", "ctrl+j", "alt+enter")

MARKS = {
    "cancelled": "⏹ cancelled — partial reply",
    "length": "… stopped at max_tokens",
}
#: Seconds between two writes of a streaming reply into its Markdown. Rendering shares the
#: engine's process (and GIL): one write per token re-rendered ~20 times a second and cut
#: decode from ~44 to ~33 tok/s on a 2-core machine; a write every 0.1 s is still smooth.
STREAM_EVERY_S = 0.1
HINT = "Type a message and press Enter · Ctrl+J for a new line · /help or F1 for keys and commands"


class PromptInput(TextArea):
    """Multi-line input: Enter sends, Ctrl+J / Alt+Enter / Shift+Enter start a new line."""

    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        input: "PromptInput"
        text: str

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self, self.text.strip()))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class UserMessage(Static):
    """What the user said (plain text: no markup, no Markdown)."""

    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="user")
        self.text = text


class NoteLine(Static):
    """A line from the app (a command's answer, an error); not part of the conversation."""

    def __init__(self, text: str, error: bool = False) -> None:
        super().__init__(Text(text), classes="note error" if error else "note")
        self.text = text
        self.error = error


RAN_NOTE = "MCP tool: its result below"  # a stored call that a tool result answered


class ToolCallBlock(Static):
    """A tool call the model made: the function's name and its arguments as JSON.
    Shown, not run, unless the tool is an MCP server's (``chat --mcp``): then ``note`` says so
    and a ``ToolResultBlock`` follows."""

    def __init__(self, call: Any, note: str = "shown, not run") -> None:
        head = Text("⚙ tool call ", style="bold")
        head.append(str(call.name), style="bold cyan")
        head.append(f"  ({note})", style="dim")
        body = json.dumps(call.arguments, ensure_ascii=False, indent=2)
        super().__init__(Group(head, JSON(body, indent=2)), classes="tool-call")
        self.call = call
        self.text = f"{head.plain}\n{body}"  # what it shows, as plain text


class ToolResultBlock(Static):
    """What an MCP tool answered (``ToolOutcome``): its text as the model is shown it, or
    its one-line error; a cut result says so in its last line."""

    def __init__(self, outcome: Any) -> None:
        failed = outcome.error is not None
        head = Text("↳ tool result " if not failed else "↳ tool error ", style="bold")
        head.append(str(outcome.name), style="bold red" if failed else "bold green")
        body = outcome.text
        super().__init__(Group(head, Text(body)), classes="tool-call tool-result")
        self.outcome = outcome
        self.text = f"{head.plain}\n{body}"
class ThinkingBlock(Collapsible):
    """A reasoning model's thinking, above its reply: folded under "Thinking…" while it
    streams, "Thought" once the answer began; Enter or a click on the title (or the app's
    F6) opens it. It is shown for the turn only: the history keeps the answer alone."""

    def __init__(self) -> None:
        self.text = ""
        self._shown = Static("", classes="thinking-text")
        super().__init__(self._shown, title="Thinking…", collapsed=True, classes="thinking")

    def append(self, piece: str) -> None:
        self.text += piece
        self._shown.update(Text(self.text, style="dim italic"))

    def done(self) -> None:
        """The thinking ended (the answer began, or the reply did)."""
        words = len(self.text.split())
        self.title = f"Thought ({words} word{'s' if words != 1 else ''})"


@dataclass
class StoredResult:
    """A stored tool result, shaped as a ``ToolOutcome`` for its block: the tool message's
    text, named by the calls it answers."""

    name: str
    text: str
    error: str | None = None

    @classmethod
    def of(cls, calls: list, text: str) -> "StoredResult":
        name = ", ".join(dict.fromkeys(c.name for c in calls)) or "tool"
        failed = text.startswith("error: ") and len(calls) <= 1
        return cls(name, text, text.removeprefix("error: ") if failed else None)


class Reply(Vertical):
    """The assistant's reply; streams in piece by piece as Markdown, with the tool calls it
    made as blocks under its text, and a reasoning model's thinking in a folded block above it.

    Args:
        text: the reply so far (a stored reply is complete), without call markup.
        streaming: True while pieces are still coming.
        calls: tool calls of a stored reply (``ToolCall``).
    """

    def __init__(self, text: str = "", streaming: bool = False, calls: list | None = None) -> None:
        super().__init__(classes="reply streaming" if streaming else "reply")
        self.text = text
        self.calls: list = list(calls or [])
        self.pieces = 0
        self.finish_reason: str | None = None
        self._stream: MarkdownStream | None = None
        self._streaming = streaming
        self.progress = ""  # the prefill line shown before the first piece
        self._pending = ""  # pieces not yet written into the Markdown
        self._last_write = 0.0
        self._flush_timer: Timer | None = None
        self._body: Markdown | None = None  # set in compose
        self._below = False  # a tool result was shown: the next text goes under it, in a body of its own
        self.thinking: ThinkingBlock | None = None  # mounted with the first piece of thinking
        self.call_note = "shown, not run"  # what a stored reply's call blocks say

    def compose(self) -> ComposeResult:
        self._body = body = Markdown(self.text or None, classes="body")
        body.display = bool(self.text.strip()) or not self.calls  # a reply that is only calls: no blank line
        yield body
        yield from (ToolCallBlock(c, self.call_note) for c in self.calls)
        yield Static("", classes="mark")

    async def add_call(self, call: Any, note: str = "shown, not run") -> None:
        """Show a tool call the model made (after the text so far)."""
        await self._flush()
        self._clear_progress()
        self.calls.append(call)
        if not self.text.strip() and self._body is not None:
            self._body.display = False  # only calls so far: no blank line above them
        await self.mount(ToolCallBlock(call, note), before=self.query_one(".mark", Static))
        if isinstance(self.parent, ChatLog):
            self.parent.follow()

    async def add_result(self, outcome: Any) -> None:
        """Show what an MCP tool answered, under its call."""
        await self._flush()
        self._clear_progress()
        await self.mount(ToolResultBlock(outcome), before=self.query_one(".mark", Static))
        self._below = True
        if isinstance(self.parent, ChatLog):
            self.parent.follow()

    async def add_stored(self, text: str, calls: list, note: str) -> None:
        """Show a stored reply that read tool results: its text under them, then its calls
        (``note``: what their blocks say)."""
        if text.strip():
            await self._flush()
            self._below = False
            self.text += text
            await self.mount(Markdown(text, classes="body"), before=self.query_one(".mark", Static))
        for call in calls:
            await self.add_call(call, note)

    async def _body_below(self) -> None:
        """The text after a tool result: a new Markdown under the blocks, streamed from here."""
        self._below = False
        if self._stream is not None:
            await self._stream.stop()
        self._body = body = Markdown(None, classes="body")
        await self.mount(body, before=self.query_one(".mark", Static))
        self._stream = Markdown.get_stream(body) if self._streaming else None
    async def add_thinking(self, piece: str) -> None:
        """Add a piece of the model's thinking (into its folded block, made on the first)."""
        self._clear_progress()
        if self.thinking is None:
            self.thinking = ThinkingBlock()
            await self.mount(self.thinking, before=0)
            if isinstance(self.parent, ChatLog):
                self.parent.follow()
        self.thinking.append(piece)

    def _clear_progress(self) -> None:
        """The prefill line goes once something of the reply arrives (text, thinking, a call, a result)."""
        if self.progress:
            self.progress = ""
            self.remove_class("progress")
            self.query_one(".mark", Static).update("")

    def on_mount(self) -> None:
        if self._streaming:
            self._stream = Markdown.get_stream(self.query_one(Markdown))

    def show_progress(self, text: str) -> None:
        """Show how the prompt's prefill is going, until the first piece arrives."""
        self.progress = text
        self.add_class("progress")  # the mark line shows while the prompt prefills
        self.query_one(".mark", Static).update(Text(text))
        if isinstance(self.parent, ChatLog):  # the line grows the log: follow it once laid out
            self.call_after_refresh(self.parent.follow)

    async def append(self, piece: str) -> None:
        """Add a piece to the reply."""
        self._clear_progress()
        if self.thinking is not None and self.pieces == 0:
            self.thinking.done()
        if self._below and piece.strip():
            await self._flush()
            await self._body_below()
        self.text += piece
        self.pieces += 1
        if piece.strip() and self._body is not None:
            self._body.display = True
        self._pending += piece
        wait = self._last_write + STREAM_EVERY_S - time.monotonic()
        if wait <= 0:
            await self._flush()
        elif self._flush_timer is None:
            self._flush_timer = self.set_timer(wait, self._flush)

    async def _flush(self) -> None:
        """Write the pending pieces into the Markdown (at most every ``STREAM_EVERY_S``)."""
        if self._flush_timer is not None:
            self._flush_timer.stop()
            self._flush_timer = None
        self._last_write = time.monotonic()
        if not self._pending or self._stream is None:
            return
        pending, self._pending = self._pending, ""
        await self._stream.write(pending)
        if isinstance(self.parent, ChatLog):
            self.parent.follow()

    async def finish(self, reason: str | None, error: str | None = None) -> None:
        """The reply ended: flush it and mark it if it did not end by itself.

        Args:
            reason: ``stop``, ``length``, ``cancelled`` (or None when it failed).
            error: why it failed, if it did.
        """
        await self._flush()
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        if self.thinking is not None:
            self.thinking.done()
        self.finish_reason = reason if error is None else "error"
        self.remove_class("streaming")
        mark = f"✖ failed: {error}" if error is not None else MARKS.get(reason or "", "")
        if mark:
            self.add_class(self.finish_reason or "")
        if mark or self.progress:  # a prefill line left by a reply stopped before its first piece
            self.progress = ""
            self.remove_class("progress")
            self.query_one(".mark", Static).update(Text(mark))
            if isinstance(self.parent, ChatLog):  # the mark's line, once laid out, into view (it was drawn below it)
                self.call_after_refresh(self.parent.follow)

    @property
    def marked(self) -> bool:
        return self.finish_reason in ("cancelled", "length", "error")


class ChatLog(VerticalScroll):
    """One conversation's messages. The app keeps one per open conversation, so a reply
    streaming in one conversation keeps going while another is shown.

    Args:
        conversation: the conversation's name.
    """

    def __init__(self, conversation: str, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="chat-log")
        self.conversation = conversation
        self.reply: Reply | None = None  # the reply streaming now
        # Whether new lines scroll into view: off once the reader scrolls up, on again at the
        # bottom. A flag, not "at the bottom now": two writes before a layout pass grow the
        # content past the last scroll, which a position test took for the reader leaving.
        self.following = True

    def compose(self) -> ComposeResult:
        yield Static(HINT, classes="hint")

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value >= self.max_scroll_y - 1:
            self.following = True
        elif new_value < old_value:  # moved up, away from the bottom: the reader's doing
            self.following = False

    def follow(self) -> None:
        """Keep the newest line in view, unless the user has scrolled up to read."""
        if self.following:
            self.scroll_end(animate=False)

    async def load(self, messages: list[dict], split: Callable[[str], tuple[str, list]] | None = None) -> None:
        """Show stored messages (replaces what is shown).

        Args:
            messages: the conversation's user and assistant messages, and tool results.
            split: a reply's text -> (text, tool calls), so stored calls show as blocks.

        A tool result and the reply that read it go under the reply that made the calls,
        as they were shown live: its call blocks, the result blocks, the text that followed.
        """
        await self.clear()
        split = split or (lambda text: (text, []))
        widgets: list[Widget] = []
        later: dict[int, list[dict]] = {}  # a reply's tool results, and the replies that read them
        ends: list[dict] = []  # per widget, its last message (a reply's finish_reason is there)
        for m in messages:
            at = len(widgets) - 1
            if at >= 0 and isinstance(widgets[at], Reply) and (m["role"] == "tool" or m["role"] == "assistant" and at in later):
                if m["role"] == "tool" and at not in later:
                    widgets[at].call_note = RAN_NOTE  # type: ignore[attr-defined]
                later.setdefault(at, []).append(m)
                ends[at] = m
            elif m["role"] in ("user", "assistant"):
                text, calls = split(m["content"]) if m["role"] == "assistant" else (m["content"], [])
                widgets.append(Reply(text, calls=calls) if m["role"] == "assistant" else UserMessage(text))
                ends.append(m)
        if widgets:
            await self.mount_all(widgets)
        for at, follow in later.items():
            reply = widgets[at]
            assert isinstance(reply, Reply)
            calls, k = list(reply.calls), 0
            while k < len(follow):
                if follow[k]["role"] == "tool":  # the results of ``calls``: a message per call, or one for all
                    run = list(itertools.takewhile(lambda m: m["role"] == "tool", follow[k:]))
                    for j, m in enumerate(run):
                        await reply.add_result(StoredResult.of([calls[j]] if len(run) == len(calls) else calls,
                                                               m["content"]))
                    k += len(run)
                    continue
                text, calls = split(follow[k]["content"])
                answered = k + 1 < len(follow) and follow[k + 1]["role"] == "tool"
                await reply.add_stored(text, calls, RAN_NOTE if answered else "shown, not run")
                k += 1
        for widget, m in zip(widgets, ends):  # a stopped or cut reply keeps its mark after a restart
            if isinstance(widget, Reply) and m.get("finish_reason"):
                await widget.finish(m["finish_reason"])
        self.scroll_end(animate=False)

    async def clear(self) -> None:
        await self.query("UserMessage, Reply, NoteLine").remove()
        self.reply = None
        self.following = True

    async def add_user(self, text: str) -> UserMessage:
        widget = UserMessage(text)
        await self.mount(widget)
        self.follow()
        return widget

    async def start_reply(self) -> Reply:
        self.reply = Reply(streaming=True)
        await self.mount(self.reply)
        self.follow()
        return self.reply

    async def add_note(self, text: str, error: bool = False) -> NoteLine:
        """Show a line from the app (a command's answer); it is not stored."""
        note = NoteLine(text, error)
        await self.mount(note)
        self.follow()
        return note

    @property
    def replies(self) -> list[Reply]:
        return list(self.query(Reply))

    @property
    def notes(self) -> list[NoteLine]:
        return list(self.query(NoteLine))


__all__ = ["ChatLog", "HINT", "MARKS", "NEWLINE_KEYS", "NoteLine", "PromptInput", "Reply", "ThinkingBlock", "ToolCallBlock",
           "UserMessage"]
