"""Tool calls in the chat: shown as blocks; MCP tools (``chat --mcp FILE``) asked about, run,
shown and fed back.

A reply's calls of the hub's tools are run between the conversation's turns: each call is
asked about first (``ToolApproval``: once / always for this tool / never; the standing
answers are kept with the conversation, ``Conversation.tool_approvals``, so a chat opened
again, after a restart too, does not ask again), run on the hub from the turn's worker thread,
shown as a result block under its call, and the results go back to the model as the next
turn of the conversation, one ``tool`` message per call as ``run_turn`` sends them, whose
reply streams into the same reply. At
most ``MAX_CALLS`` calls are answered per user message (run or declined); the calls past it
are answered "not run" and the model answers once more without tools.

A mixin of ``ChatApp``: it reads ``self.mcp`` (a started ``mlotspark.McpHub``).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from mlotspark import Approval

from tui.messages import EngineWarning, ReplyToolCall, ReplyToolResult
from tui.screens import ToolApproval

MAX_CALLS = 8  # tool calls answered per user message (run_turn's default)
_ASK_POLL_S = 0.2  # how often a waiting worker looks for Escape or quitting


def after_tools(options: dict, bounded: bool) -> dict:
    """The options of the turn that reads tool results: a forced ``tool_choice`` is for the
    first reply only (forcing it again never ends); past the bound, no tools."""
    if bounded:
        return {k: v for k, v in options.items() if k not in ("tools", "tool_choice")}
    if options.get("tool_choice") not in (None, "auto", "none"):
        return {**options, "tool_choice": "auto"}
    return options


class McpTurns:
    """The ``ChatApp`` part that runs MCP tools (see the module docstring)."""

    mcp: Any

    def mcp_notice(self) -> str:
        """What the chat says when it opens: the servers, their tools, the ones that failed."""
        hub = self.mcp
        lines = [f"MCP tools ({len(hub.tools)}): " + (", ".join(t.name for t in hub.tools) or "none") +
                 f". Each run is asked first (once / always / never); at most {MAX_CALLS} per message."]
        lines += [f"MCP server {name} is not running: {why}" for name, why in hub.errors.items()]
        return "\n\n".join(lines)

    def ask_tool(self, turn: Any, call: Any) -> str | None:
        """[worker thread] Ask the user about ``call`` and wait for the answer: ``once``,
        ``always``, ``never``, or None when it goes unanswered (Escape, the turn stopped,
        the app quitting): that call does not run and nothing is kept."""
        tool = next((t for t in self.mcp.tools if t.name == call.name), None)
        where = f" on MCP server {tool.server}" if tool else ""
        question = (f"Run tool {call.name}{where}?\n\n{json.dumps(call.arguments, ensure_ascii=False)[:600]}"
                    "\n\nEscape: not this call (nothing kept)")
        answered = threading.Event()
        answer: list[str | None] = [None]

        def done(value: str | None) -> None:
            answer[0] = value
            answered.set()

        screen = ToolApproval(question)
        self.call_from_thread(lambda: self.push_screen(screen, callback=done))  # type: ignore[attr-defined]
        while not answered.wait(_ASK_POLL_S):
            if self.shutting_down:  # type: ignore[attr-defined]
                return None
            if turn.cancel_requested:  # the question goes with the turn
                self.call_from_thread(lambda: screen.dismiss(None) if screen.is_current else None)  # type: ignore[attr-defined]
                return None
        return answer[0]

    def run_tools(self, turn: Any, calls: list, ran: int, options: dict) -> tuple[str | None, int, dict]:
        """[worker thread] Ask about and run a reply's calls (``ran``: calls answered so far
        this message; ``options``: the turn's). The results are a tool message each: all but
        the last are added to the conversation here, the last starts the turn that reads them
        (when the turn was stopped meanwhile, it is added too, and no turn reads them).

        Returns:
            ``(last result, ran, options)``: the last tool message (None: the turn was
            stopped), the calls answered so far, and the options of the turn that reads the
            results (``after_tools``).
        """
        name, conv = turn.conversation, turn.conv
        approval = Approval(lambda call: self.ask_tool(turn, call), remembered=conv.tool_approvals,
                            remember=conv.remember_tool)
        outcomes, bounded = [], False
        for call in calls:
            if self._stopped(turn):
                outcome = _refused(call, "not run: the reply was stopped")
            elif ran >= MAX_CALLS:
                bounded = True
                outcome = _refused(call, f"not run: this message already made {MAX_CALLS} tool calls")
            elif not approval.allows(call):  # counts too: a model that calls a refused tool again still ends
                ran += 1
                outcome = _refused(call, f"the user declined to run {call.name}" if call.name in approval.never
                                   else f"not run: the user did not answer about {call.name}")
            else:
                outcome = self.mcp.call(call.name, call.arguments)
                ran += 1
            outcomes.append(outcome)
            self.post_message(ReplyToolResult(name, outcome))  # type: ignore[attr-defined]
        turn.reading_tools, turn.progress_seen = True, None  # the results' prefill shows in the reply
        *earlier, last = [o.text or "(no output)" for o in outcomes]
        stopped, spent = self._stopped(turn), bounded or ran >= MAX_CALLS
        for text in earlier + [last] * stopped:
            conv.add("tool", text)
        if spent:
            self.post_message(EngineWarning(f"{MAX_CALLS} tool calls answered for this message, the most there "  # type: ignore[attr-defined]
                                            "are: the model answers without tools now.", False))
        return None if stopped else last, ran, after_tools(options, spent)

    def _stopped(self, turn: Any) -> bool:
        """The reply was stopped, or the app is quitting: no more tool runs for it."""
        return turn.cancel_requested or self.shutting_down  # type: ignore[attr-defined]

    async def on_reply_tool_call(self, message: ReplyToolCall) -> None:
        """A call in a reply: a block, saying whether it is an MCP tool to be asked about."""
        if self.shutting_down:  # type: ignore[attr-defined]
            return
        chat = self.logs.get(message.conversation)  # type: ignore[attr-defined]
        if chat is not None and chat.reply is not None:
            await chat.reply.add_call(message.call, _call_note(message))
        self.show_ttft(message.conversation)  # type: ignore[attr-defined]

    async def on_reply_tool_result(self, message: ReplyToolResult) -> None:
        if self.shutting_down:  # type: ignore[attr-defined]
            return
        chat = self.logs.get(message.conversation)  # type: ignore[attr-defined]
        if chat is not None and chat.reply is not None:
            await chat.reply.add_result(message.outcome)


def _call_note(message: Any) -> str:
    """What a call's block says will happen to it."""
    if not message.runs:
        return "shown, not run"
    return {"always": "MCP tool: runs, always allowed in this conversation",
            "never": "MCP tool: not run, declined for this conversation"}.get(message.standing,
                                                                             "MCP tool: asked before it runs")


class _Refused:
    """A call that did not run, shaped as a ``ToolOutcome`` for the block and the model."""

    def __init__(self, name: str, arguments: dict, error: str):
        self.name, self.arguments, self.error, self.output, self.cut = name, arguments, error, "", False

    @property
    def text(self) -> str:
        return f"error: {self.error}"


def _refused(call: Any, why: str) -> _Refused:
    return _Refused(call.name, call.arguments, why)


__all__ = ["MAX_CALLS", "McpTurns", "after_tools"]
