"""A Responses request's ``mcp`` tools, run on this server: the tools in, the items out.

OpenAI's Responses API names a remote MCP server as a tool (``{"type": "mcp",
"server_label": ..., "allowed_tools": [...]}``) and answers with ``mcp_list_tools`` (the
server's tools) and ``mcp_call`` (one per call: arguments, output or error) output items
before the message. Here the label names a server of ``serve --mcp FILE``; a URL of the
request's own (``server_url``) is refused, since this server starts only configured servers.
Only the Responses API runs tools server-side, and only for a request that names them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.tools.loop import MAX_CALLS, TurnEvent, TurnResult, run_turn
from mlotspark.tools.mcp_hub import McpHub, McpTool

__all__ = ["McpRequest", "mcp_request", "run_mcp_tools"]


@dataclass
class McpRequest:
    """The ``mcp`` tools of one request.

    Attributes:
        tools: the hub's tools the model may call (their model-facing names).
        list_items: one ``mcp_list_tools`` output item per named server.
        other_tools: the request's other tools (functions the client runs), untouched: the
            caller converts them to the engine's shape and passes them as ``client_tools``.
    """

    tools: list[McpTool] = field(default_factory=list)
    list_items: list[dict] = field(default_factory=list)
    other_tools: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.list_items)

    def tool_choice(self, choice: Any) -> Any:
        """A Responses ``tool_choice`` naming an MCP tool (``{"type": "mcp", "server_label",
        "name"}``) as the engine's (the function the model sees); any other choice unchanged.

        Raises:
            OptionError: the named tool is not among this request's MCP tools.
        """
        if not (isinstance(choice, dict) and choice.get("type") == "mcp"):
            return choice
        server, name = choice.get("server_label"), choice.get("name")
        for t in self.tools:
            if t.server == server and (name is None or t.tool == name):
                return {"type": "function", "function": {"name": t.name}} if name else "required"
        raise OptionError(f"tool_choice names {server}.{name}, which is not among the request's MCP tools "
                          f"({', '.join(f'{t.server}.{t.tool}' for t in self.tools) or 'none'})")


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def mcp_request(hub: McpHub | None, tools: Any, where: str = "tools") -> McpRequest:
    """Split a request's ``tools`` into its ``mcp`` tools (checked against the hub) and the rest.

    Raises:
        OptionError: naming ``tools[i]`` and the bad field (no server configured, an
            unknown ``server_label``, a ``server_url``, an ``allowed_tools`` name the server
            lacks, ``require_approval`` other than ``never``).
    """
    out = McpRequest()
    for i, t in enumerate(tools or ()):
        if not (isinstance(t, dict) and t.get("type") == "mcp"):
            out.other_tools.append(t)
            continue
        at = f"{where}[{i}]"
        if hub is None:
            raise OptionError(f"{at}: this server runs no MCP servers (start it with `mlotspark serve --mcp FILE`)")
        label = t.get("server_label")
        if t.get("server_url") or t.get("connector_id"):
            raise OptionError(f"{at}.server_url: this server runs only the MCP servers it was started with "
                              f"({', '.join(hub.servers)}); name one in server_label")
        if label not in hub.servers:
            raise OptionError(f"{at}.server_label {json.dumps(label)[:60]} is not a configured MCP server; "
                              f"configured: {', '.join(hub.servers)}")
        approval = t.get("require_approval", "never")
        if approval != "never":
            raise OptionError(f"{at}.require_approval {json.dumps(approval)[:60]}: this server runs the tools of a "
                              "request that names them without asking; set \"never\"")
        if label in hub.errors:
            raise OptionError(f"{at}.server_label {label!r}: the server is not running ({hub.errors[label]})")
        offered = [x for x in hub.tools if x.server == label]
        allowed = t.get("allowed_tools")
        if isinstance(allowed, dict):
            allowed = allowed.get("tool_names")
        if allowed is not None:
            if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
                raise OptionError(f"{at}.allowed_tools must be a list of tool names")
            missing = sorted(set(allowed) - {x.tool for x in offered})
            if missing:
                raise OptionError(f"{at}.allowed_tools names {', '.join(missing)}, which {label} does not offer; "
                                  f"it offers {', '.join(x.tool for x in offered)}")
            offered = [x for x in offered if x.tool in allowed]
        out.tools += offered
        out.list_items.append({
            "type": "mcp_list_tools", "id": _item_id("mcpl"), "server_label": label,
            "tools": [{"name": x.tool, "description": x.description, "input_schema": x.parameters,
                       "annotations": None} for x in offered],
        })
    return out


def run_mcp_tools(engine: Any, messages: list[dict], hub: McpHub, request: McpRequest, *,
                  client_tools: list[dict] | None = None, max_calls: int = MAX_CALLS,
                  **options: Any) -> tuple[TurnResult, list[dict]]:
    """Answer ``messages`` running the request's MCP tools; the output items before the message.

    Args:
        client_tools: the request's function tools in the engine's shape (``{"type":
            "function", "function": {...}}``); a reply calling one ends the turn (``pending``).
        max_calls: tool calls answered in the turn; **options: generation options.

    Returns:
        ``(turn, items)``: ``turn.result`` is the final generation (its ``text`` the
        message's; with ``turn.pending`` its ``tool_calls`` are the client's function calls
        to send as ``function_call`` items); ``items`` are the ``mcp_list_tools`` items then
        one ``mcp_call`` item per call, in order.
    """
    by_name = {t.name: t for t in request.tools}
    calls: list[dict] = []

    def record(event: TurnEvent) -> None:
        if event.kind not in ("result", "bound") or event.call is None or event.outcome is None:
            return
        tool = by_name.get(event.call.name)
        o = event.outcome
        calls.append({"type": "mcp_call", "id": _item_id("mcp"), "server_label": tool.server if tool else "",
                      "name": tool.tool if tool else event.call.name, "arguments": event.call.arguments_json(),
                      "output": o.output if o.error is None else None, "error": o.error})

    turn = run_turn(engine, messages, hub, max_calls=max_calls, on_event=record, only=list(by_name),
                    client_tools=client_tools, **options)
    return turn, [*request.list_items, *calls]
