"""OpenAI's Responses API, the request side: ``POST /v1/responses`` bodies into chat requests.

A Responses body is translated into the chat-completions body the engine already
serves, then checked by ``schemas.parse_chat`` (one translation of messages, tools,
``tool_choice`` and JSON schemas, one set of checks): ``instructions`` becomes the
system message; ``input`` (a string, or items: messages with text parts,
``function_call`` and ``function_call_output``) becomes user, assistant (with
``tool_calls``) and ``tool`` messages; the history of a ``previous_response_id`` chain
comes from the store (``response_store.py``) before them; function tools
(``{"type": "function", "name", "parameters"}``) become chat's nested form;
``text.format`` becomes ``response_format``; ``max_output_tokens`` becomes
``max_completion_tokens``. An error names the Responses field, never the chat one.

``reasoning.effort`` becomes the engine's ``reasoning_effort`` (``xhigh`` as ``high``:
unbounded), a budget of thinking tokens for a reasoning model; other models ignore it. Tool types are a table (:data:`TOOL_TYPES`): a
type the table lacks is refused with a one-line 400 naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from mlotspark.server.schemas import APIError, ParsedRequest, bad, parse_chat, text_parts

EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
PASSED = ("temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty")
# Chat field -> the Responses field it came from (errors name the latter).
RENAMED = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input",
           "reasoning_effort": "reasoning.effort"}


@dataclass
class ResponsesRequest(ParsedRequest):
    """A checked ``POST /v1/responses`` request: the chat request, and what the response echoes.

    Attributes:
        rid: the new response's id.
        added: chat messages this turn adds (its input, without the instructions).
        previous: ``previous_response_id``, or None.
        store: keep the response (``GET``, ``previous_response_id``, its chain's KV snapshot).
        echo: request fields the response object repeats (instructions, tools, text ...).
    """

    rid: str = ""
    added: list[dict] = field(default_factory=list)
    previous: str | None = None
    store: bool = True
    echo: dict = field(default_factory=dict)


# ----------------------------------------------------------------- tools
def _function_tool(tool: dict, at: str) -> dict:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"{at}.name", "a function tool needs a name")
    params = tool.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad(f"{at}.parameters", "expected a JSON schema object")
    fn: dict = {"name": name, "description": tool.get("description") or "",
                "parameters": params or {"type": "object", "properties": {}}}
    return {"type": "function", "function": fn}


#: Responses tool type -> its chat-API tool (``(tool, where) -> dict``); a new type is one entry.
TOOL_TYPES: dict[str, Callable[[dict, str], dict]] = {"function": _function_tool}


def _tools(value: Any) -> list[dict]:
    if not isinstance(value, list):
        raise bad("tools", "expected a list of tools")
    out = []
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        make = TOOL_TYPES.get(kind) if isinstance(kind, str) else None
        if make is None:
            raise bad(f"tools[{i}].type", f"{json.dumps(kind)[:40]} tools are not supported "
                                          f"(this server runs {', '.join(TOOL_TYPES)} tools)")
        out.append(make(tool, f"tools[{i}]"))
    return out


def _tool_choice(value: Any) -> Any:
    if value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad("tool_choice", 'expected "auto", "none", "required" or {"type": "function", "name": ...}')


def _text_format(text: Any) -> dict | None:
    """``text.format`` as chat's ``response_format`` (None for plain text)."""
    if not isinstance(text, dict):
        raise bad("text", 'expected an object such as {"format": {"type": "text"}}')
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad("text.format.schema", "expected a JSON schema object")
        spec = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise bad("text.format.type", f"{json.dumps(kind)[:40]} is not one of text, json_schema, json_object")


# ----------------------------------------------------------------- input items
def _text(content: Any, at: str) -> str:
    return text_parts(content, at, ("input_text", "output_text", "text"))


def _message(item: dict, at: str, out: list[dict]) -> None:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise bad(f"{at}.role", f"{json.dumps(role)[:40]} is not one of user, system, developer, assistant")
    out.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"), f"{at}.content")})


def _function_call(item: dict, at: str, out: list[dict]) -> None:
    name, args, call_id = item.get("name"), item.get("arguments", "{}"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
        raise bad(at, 'a function_call needs "call_id", "name" and "arguments" (a JSON string)')
    try:
        parsed = json.loads(args) if args.strip() else {}
    except ValueError:
        raise bad(f"{at}.arguments", "is not valid JSON") from None
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":  # one assistant turn: its words, then its calls
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _function_call_output(item: dict, at: str, out: list[dict]) -> None:
    call_id = item.get("call_id")
    if not isinstance(call_id, str):
        raise bad(f"{at}.call_id", "expected the call_id of the function_call it answers")
    out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{at}.output")})


def _skip(item: dict, at: str, out: list[dict]) -> None:
    """A reasoning item sent back: the model's earlier thinking is not re-read (templates drop it)."""


INPUT_ITEMS: dict[str, Callable[[dict, str, list], None]] = {
    "message": _message, "function_call": _function_call, "function_call_output": _function_call_output,
    "reasoning": _skip,
}


def input_messages(value: Any) -> list[dict]:
    """``input`` (a string or a list of items) as chat messages.

    Raises:
        APIError: 400 naming the item at fault (``input[2].type``).
    """
    if isinstance(value, str):
        if not value:
            raise bad("input", "expected a non-empty string or a list of items")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad("input", "expected a string or a list of items")
    out: list[dict] = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad(f"input[{i}]", "expected an item object")
        kind = item.get("type", "message")
        handle = INPUT_ITEMS.get(kind) if isinstance(kind, str) else None
        if handle is None:
            raise bad(f"input[{i}].type", f"{json.dumps(kind)[:40]} items are not supported "
                                          f"({', '.join(INPUT_ITEMS)})")
        handle(item, f"input[{i}]", out)
    return out


def _check_outputs(items: Any, earlier: list[dict]) -> None:
    """Each ``function_call_output`` answers a ``function_call`` before it, in ``input`` or in
    the stored chain (``earlier``), as OpenAI checks: an output of no call is a 400."""
    called = {c.get("id") for m in earlier for c in m.get("tool_calls") or ()}
    for i, item in enumerate(items if isinstance(items, list) else ()):
        if item.get("type") == "function_call":
            called.add(item.get("call_id"))
        elif item.get("type") == "function_call_output" and item.get("call_id") not in called:
            raise bad(f"input[{i}].call_id", f"{json.dumps(item.get('call_id'))[:40]} answers no function_call "
                                             "before it (in input, or in the previous response's chain)")


# ----------------------------------------------------------------- the request
def _renamed(e: APIError) -> APIError:
    """A chat-side error, naming the Responses field instead."""
    param = e.param
    if param is None:
        return e
    for chat, ours in RENAMED.items():
        if param == chat or param.startswith(chat + "[") or param.startswith(chat + "."):
            new = ours if chat == "messages" else ours + param[len(chat):]
            e.message, e.param = e.message.replace(f"'{param}'", f"'{new}'"), new
            break
    return e


def parse_responses(body: Any, served: list[str], options: Any, *, rid: str,
                    history: Callable[[str], list[dict]]) -> ResponsesRequest:
    """Check a ``POST /v1/responses`` body into a chat request.

    Args:
        body: the decoded JSON body.
        served: model ids this server answers to.
        options: ``engine.defaults.merged`` (validates the generation options once).
        rid: the new response's id.
        history: ``previous_response_id`` -> the chain's chat messages (raises APIError
            when there is no such stored response).

    Raises:
        APIError: the first bad field (400), or an unknown model (404).
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if body.get("background"):
        raise bad("background", "background responses are not supported by this server")
    if body.get("conversation") is not None:
        raise bad("conversation", "not supported by this server; continue with previous_response_id")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise bad("store", "expected true or false")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions", "expected a string")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise bad("previous_response_id", "expected a response id")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        effort = reasoning.get("effort") if isinstance(reasoning, dict) else "?"
        if effort is not None and effort not in EFFORTS:
            raise bad("reasoning.effort", f"{json.dumps(effort)[:40]} is not one of {', '.join(EFFORTS)}")
    if "input" not in body:
        raise bad("input", "required: a string or a list of items")
    added = input_messages(body["input"])
    earlier = history(previous) if previous is not None else []
    _check_outputs(body["input"], earlier)
    messages = ([{"role": "system", "content": instructions}] if instructions else []) + earlier + added
    if not messages:
        raise bad("input", "expected at least one item")
    chat: dict = {"model": body.get("model"), "messages": messages, "stream": body.get("stream", False)}
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    for name in PASSED:
        if body.get(name) is not None:
            chat[name] = body[name]
    effort = (reasoning or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = "high" if effort == "xhigh" else effort
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("text") is not None:
        rf = _text_format(body["text"])
        if rf is not None:
            chat["response_format"] = rf
    try:
        req = parse_chat(chat, served, options)
    except APIError as e:
        raise _renamed(e) from None
    out = ResponsesRequest(**vars(req), rid=rid, added=added, previous=previous, store=store)
    out.fields.update({"max_tokens": "max_output_tokens", "response_format": "text.format"})  # engine errors later
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    out.echo = {
        "instructions": instructions, "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {}, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "reasoning": {"effort": (reasoning or {}).get("effort"), "summary": None},
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": list(body.get("tools") or []),
        "user": body.get("user"),
    }
    return out


__all__ = ["EFFORTS", "INPUT_ITEMS", "ResponsesRequest", "TOOL_TYPES", "input_messages", "parse_responses"]
