"""``run_turn``: a turn in which the model may call MCP tools, and the answers to "may it?".

The loop: generate with the hub's tools → the reply's ``tool_calls`` → ask ``approve``
for each (once / always for this tool / never, remembered in the ``Approval`` the caller
keeps per conversation, and kept with a stored conversation through its ``tool_approvals``) → run the allowed ones on the hub → append the assistant turn and
one ``tool`` message per call → generate again, until a reply makes no call. At most
``max_calls`` calls are answered in one turn (run or declined); past that they are
answered "not run" and the model answers once more without tools, so a model that keeps calling still ends its turn.

The engine is duck-typed (anything with ``generate(messages, **options)`` returning a
``GenerationResult``): the CLI, the server and a Python program share this one loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from mlotspark.errors import OptionError
from mlotspark.results import GenerationResult, ToolCall
from mlotspark.tools.mcp_hub import McpHub, ToolOutcome

__all__ = ["ANSWERS", "Approval", "MAX_CALLS", "TurnEvent", "TurnResult", "run_turn"]

MAX_CALLS = 8  # tool runs per turn; a small model that loops on a tool stops here
ANSWERS = ("once", "always", "never")


class Approval:
    """Which tools may run, as the user answered; keep one per conversation.

    Args:
        ask: asked for a call no earlier answer covers; returns ``once`` (run this call),
            ``always`` (run this one and every later call of the tool) or ``never`` (run
            no call of the tool), or None when it went unanswered (the question dismissed,
            the turn stopped): that call does not run and nothing is kept. ``ask=None``
            runs every call without asking (a program's choice).
        remembered: standing answers given before (tool name -> ``always`` | ``never``),
            e.g. a conversation's ``tool_approvals``.
        remember: called with ``(tool name, answer)`` for each new ``always`` / ``never``,
            to keep it (e.g. a conversation's ``remember_tool``).
    """

    def __init__(self, ask: Callable[[ToolCall], str] | None = None, *,
                 remembered: Mapping[str, str] | None = None, remember: Callable[[str, str], None] | None = None):
        self.ask = ask
        self.always: set[str] = {n for n, a in (remembered or {}).items() if a == "always"}
        self.never: set[str] = {n for n, a in (remembered or {}).items() if a == "never"}
        self.remember = remember

    def allows(self, call: ToolCall) -> bool:
        """Whether ``call`` may run, asking when no answer given earlier covers it."""
        if call.name in self.never:
            return False
        if self.ask is None or call.name in self.always:
            return True
        answer = self.ask(call)
        if answer is None:  # unanswered: not this call, and no standing answer
            return False
        if answer not in ANSWERS:
            raise OptionError(f"invalid approval {answer!r}: answer one of {', '.join(ANSWERS)}")
        if answer == "always":
            self.always.add(call.name)
        elif answer == "never":
            self.never.add(call.name)
        if answer != "once" and self.remember is not None:
            self.remember(call.name, answer)
        return answer != "never"


@dataclass
class TurnEvent:
    """What a turn did, in order, for a UI that shows it as it happens.

    Attributes:
        kind: ``reply`` (a generation finished: ``result``), ``call`` (a tool is about to
            run), ``result`` (it ran: ``outcome``), ``declined`` (the user said never),
            ``bound`` (``max_calls`` reached: the call was not run).
    """

    kind: str
    call: ToolCall | None = None
    outcome: ToolOutcome | None = None
    result: GenerationResult | None = None


@dataclass
class TurnResult:
    """A finished turn.

    Attributes:
        result: the last generation (its ``text`` is the answer).
        messages: the messages the turn added (assistant turns with ``tool_calls``, the
            ``tool`` results, the final assistant reply), to append to a history.
        outcomes: every tool run (and refusal), in order.
        bounded: True when ``max_calls`` stopped the loop.
        generations: every generation of the turn, in order (their stats sum to its usage).
    """

    result: GenerationResult
    messages: list[dict] = field(default_factory=list)
    outcomes: list[ToolOutcome] = field(default_factory=list)
    bounded: bool = False
    pending: bool = False  # the reply called a ``client_tools`` tool (in ``result.tool_calls``)
    generations: list[GenerationResult] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.result.text


def _assistant(result: GenerationResult) -> dict:
    return {"role": "assistant", "content": result.text,
            "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in result.tool_calls]}


def run_turn(engine: Any, messages: list[dict], hub: McpHub, *, approve: Approval | None = None,
             max_calls: int = MAX_CALLS, on_event: Callable[[TurnEvent], None] | None = None,
             only: Iterable[str] | None = None, client_tools: list[dict] | None = None,
             **options: Any) -> TurnResult:
    """Answer ``messages`` letting the model call the hub's tools.

    Args:
        engine: an ``Engine`` (or anything with its ``generate``).
        messages: the conversation so far (``{"role", "content"}`` dicts), not changed.
        hub: a started ``McpHub``.
        approve: who says yes (an ``Approval``); None runs every call without asking.
        max_calls: tool calls answered in this turn, run or declined (default 8).
        on_event: called with each ``TurnEvent`` as it happens (a UI's progress).
        only: the hub's tool names the model is given (default all).
        client_tools: OpenAI function tools the caller runs itself: a reply calling one
            ends the turn with the call in ``result.tool_calls`` (``TurnResult.pending``).
        **options: generation options for every step (``max_tokens``, ``temperature``,
            ``tool_choice``: a forced choice holds for the first step only, then ``auto``).

    Returns:
        ``TurnResult``: the final reply, the messages added, the tool outcomes.

    Raises:
        OptionError: a bad option or ``max_calls``; engine errors as ``generate`` raises them.
    """
    if not isinstance(max_calls, int) or isinstance(max_calls, bool) or max_calls < 0:
        raise OptionError(f"invalid max_calls {max_calls!r}: use a whole number >= 0")
    allowed = None if only is None else set(only)
    tools = [t.openai() for t in hub.tools if allowed is None or t.name in allowed]
    hub_names = {t["function"]["name"] for t in tools}
    tools += list(client_tools or ())
    approval = approve or Approval()
    emit = on_event or (lambda event: None)
    history, added, outcomes, generations = list(messages), [], [], []
    ran, bounded = 0, False
    step = dict(options)
    while True:
        result = engine.generate(history + added, **({"tools": tools, **step} if tools and not bounded else
                                                     {k: v for k, v in step.items() if k != "tool_choice"}))
        emit(TurnEvent("reply", result=result))
        generations.append(result)
        if not result.tool_calls or bounded:
            added.append({"role": "assistant", "content": result.text})
            return TurnResult(result, added, outcomes, bounded, generations=generations)
        if any(c.name not in hub_names for c in result.tool_calls):  # the caller's tools: its turn to run them
            added.append(_assistant(result))
            return TurnResult(result, added, outcomes, bounded, pending=True, generations=generations)
        added.append(_assistant(result))
        for call in result.tool_calls:
            if ran >= max_calls:
                bounded = True
                outcome = ToolOutcome(call.name, "", call.name, call.arguments,
                                      error=f"not run: this turn already made {max_calls} tool calls")
                emit(TurnEvent("bound", call, outcome))
            elif not approval.allows(call):  # counts too: a model that calls a refused tool again still ends
                ran += 1
                outcome = ToolOutcome(call.name, "", call.name, call.arguments,
                                      error=f"the user declined to run {call.name}")
                emit(TurnEvent("declined", call, outcome))
            else:
                emit(TurnEvent("call", call))
                outcome = hub.call(call.name, call.arguments)
                ran += 1
                emit(TurnEvent("result", call, outcome))
            outcomes.append(outcome)
            added.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": outcome.text})
        # The budget spent: the next reply is the answer, given without tools (a reply whose
        # calls would only be refused is a generation wasted).
        bounded = ran >= max_calls
        # A forced choice (required, a named tool) is for the first step: forcing it again never ends.
        if step.get("tool_choice") not in (None, "auto", "none"):
            step["tool_choice"] = "auto"
