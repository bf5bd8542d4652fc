"""Forced tool calls through serve and the real SDKs (an accuracy evaluation; the conformance suite checks one call a cell).

Forced tool calls on a real model through ``mlotspark serve`` and the real SDKs: how many
parse and validate against their tool's schema.

Ten requests, each with its own tools, asked with ``tool_choice`` ``required`` and with the
tool named, through the ``openai`` SDK (``required`` / ``{"type": "function", ...}``) and the
``anthropic`` SDK (``{"type": "any"}`` / ``{"type": "tool", ...}``): 20 calls per SDK. A reply
counts when it holds at least one call, every call names a given tool (the named one when
named) and its arguments validate (``jsonschema``). Greedy, 128 tokens at most.

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/forced_tool_calls.py --model qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import jsonschema


def tool(name: str, description: str, **props: dict) -> dict:
    required = [k for k in props if not props[k].pop("optional", False)]
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required}}}


S, I, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}
CASES = [
    ("What's the weather like in Paris right now?",
     [tool("get_weather", "Current weather in a city.", city=dict(S), unit={"type": "string", "enum": ["celsius", "fahrenheit"], "optional": True}),
      tool("get_time", "Current time in a time zone.", zone=dict(S))]),
    ("What time is it in Tokyo?", [tool("get_time", "Current time in a time zone.", zone=dict(S)),
                                   tool("get_weather", "Current weather in a city.", city=dict(S))]),
    ("Convert 100 US dollars to euros.", [tool("convert_currency", "Convert money.", amount=dict(N), source=dict(S), target=dict(S))]),
    ("Send an email to bob@example.com saying the build is green.",
     [tool("send_email", "Send an email.", to=dict(S), subject=dict(S), body=dict(S))]),
    ("Add 'buy milk' to my todo list.", [tool("add_todo", "Add a todo item.", text=dict(S), priority={"type": "integer", "minimum": 1, "maximum": 5, "optional": True})]),
    ("Find flights from Oslo to Rome on 2026-12-20.",
     [tool("search_flights", "Search flights.", origin=dict(S), destination=dict(S), date={"type": "string", "format": "date"})]),
    ("Set a timer for 15 minutes.", [tool("set_timer", "Start a timer.", minutes=dict(I))]),
    ("Translate 'good morning' into Spanish.", [tool("translate", "Translate text.", text=dict(S), language=dict(S))]),
    ("Read the file README.md.", [tool("read_file", "Read a file.", path=dict(S)), tool("list_dir", "List a folder.", path=dict(S))]),
    ("What is 37 times 41?", [tool("calculate", "Evaluate an arithmetic expression.", expression=dict(S))]),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def valid(name: str, args: object, tools: list[dict], named: str | None) -> bool:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if name not in schemas or (named and name != named):
        return False
    try:
        jsonschema.validate(json.loads(args) if isinstance(args, str) else args, schemas[name])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    args = ap.parse_args()
    import anthropic
    import openai

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    home = tempfile.mkdtemp(prefix="forced-tools-")
    server = subprocess.Popen([sys.executable, "-m", "mlotspark", "serve", "-m", args.model, "--port", str(port)],
                              env={**__import__("os").environ, "MLOTSPARK_HOME": home}, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        oa = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=600, max_retries=0)
        an = anthropic.Anthropic(base_url=url, api_key="x", timeout=600, max_retries=0)
        tally = {"openai": [0, 0], "anthropic": [0, 0]}
        for question, tools in CASES:
            msgs = [{"role": "user", "content": question}]
            first = tools[0]["function"]["name"]
            for named in (None, first):
                choice = {"type": "function", "function": {"name": named}} if named else "required"
                r = oa.chat.completions.create(model=model, messages=msgs, tools=tools, tool_choice=choice,
                                               temperature=0, max_tokens=128)
                calls = r.choices[0].message.tool_calls or []
                ok = bool(calls) and all(valid(c.function.name, c.function.arguments, tools, named) for c in calls)
                tally["openai"][0] += ok
                tally["openai"][1] += 1
                print(f"openai    {'named' if named else 'required':8} {ok!s:5} {[(c.function.name, c.function.arguments) for c in calls]}",
                      file=sys.stderr, flush=True)
                atools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                           "input_schema": t["function"]["parameters"]} for t in tools]
                achoice = {"type": "tool", "name": named} if named else {"type": "any"}
                m = an.messages.create(model=model, max_tokens=128, messages=msgs, tools=atools, tool_choice=achoice,
                                       extra_body={"temperature": 0})
                uses = [b for b in m.content if b.type == "tool_use"]
                ok = bool(uses) and all(valid(u.name, u.input, tools, named) for u in uses)
                tally["anthropic"][0] += ok
                tally["anthropic"][1] += 1
                print(f"anthropic {'named' if named else 'any':8} {ok!s:5} {[(u.name, u.input) for u in uses]}",
                      file=sys.stderr, flush=True)
        for sdk, (good, total) in tally.items():
            print(f"{sdk}: {good}/{total} forced calls parse and validate ({args.model})")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
