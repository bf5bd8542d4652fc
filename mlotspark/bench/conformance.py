"""The conformance matrix: every feature the docs promise, tried on one model's real weights
through ``serve`` and the real client SDKs (``openai``, ``anthropic``, ``ollama``), a few
tokens per cell.

Each cell ends in one of three ways:

- ``ok``: the feature did what the docs say (a reply that is not empty, a call that parses
  and validates against its tool's schema, JSON that validates ...);
- ``refused``: the server said no before the first token, with an error naming why (tools
  on a model whose template has none) — a feature this model does not have;
- ``fail``: anything else, said in a line (an empty reply, a call lost as text, an
  answer without the remembered fact).

What a model measured ``ok`` is what it reports as capabilities (``models/hub/capabilities.py``):
``mlotspark check MODEL`` runs the matrix on any model, ``mlotspark bench --suite
conformance`` on the catalogue's chat models and writes their table.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Callable

CELLS = ("chat", "stream", "stop", "json_schema", "tools_required", "tools_named", "tools_auto", "tools_streamed",
         "tools_result", "logprobs", "anthropic_tools", "ollama_tools", "embeddings", "conversation", "cascade", "memory_writer",
         "responses", "responses_stream", "responses_json", "responses_tools", "responses_chain", "count_tokens")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string"},
                                      "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "description": "The current time in a time zone.",
                 "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@dataclass(frozen=True)
class Cell:
    """One cell's outcome: ``status`` ``ok`` | ``refused`` | ``fail``, and a line saying what
    happened (the error's message for a refusal)."""

    status: str
    detail: str = ""

    @property
    def mark(self) -> str:
        return {"ok": "✓", "refused": "—", "fail": "✗"}[self.status]


class Failed(Exception):
    """A cell's check did not hold (its message says how)."""


def _check(ok: bool, why: str) -> None:
    if not ok:
        raise Failed(why)


def _schema_ok(name: str, args: Any) -> bool:
    import jsonschema

    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}.get(name)
    if schema is None:
        return False
    try:
        jsonschema.validate(json.loads(args) if isinstance(args, str) else dict(args), schema)
    except (jsonschema.ValidationError, ValueError, TypeError):
        return False
    return True


def _brief(text: Any, n: int = 60) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= n else s[: n - 1] + "…"


class Matrix:
    """The cells of one model, run against a :class:`~mlotspark.server.local.LocalServer`
    over ``engine`` (greedy, few tokens a cell)."""

    def __init__(self, engine: Any, server: Any):
        self.engine, self.server = engine, server
        self.oa = server.openai()
        self.model = server.model

    # -- OpenAI chat -----------------------------------------------------------------------
    def chat(self) -> str:
        r = self.oa.chat.completions.create(model=self.model, max_tokens=12, temperature=0,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
        text = r.choices[0].message.content or ""
        _check(bool(text.strip()), "an empty reply")
        return _brief(text)

    def stream(self) -> str:
        chunks = list(self.oa.chat.completions.create(
            model=self.model, max_tokens=12, temperature=0, stream=True,
            messages=[{"role": "user", "content": "What is the capital of France?"}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        _check(bool(text.strip()), "an empty streamed reply")
        _check(chunks[-1].choices[0].finish_reason in ("stop", "length"), "no finish_reason at the end")
        return f"{len(chunks)} chunks"

    def stop(self) -> str:
        r = self.oa.completions.create(model=self.model, prompt="1, 2, 3, 4, 5, 6,", max_tokens=16, temperature=0,
                                       stop=[" 9"])
        c = r.choices[0]
        _check(" 9" not in c.text, f"the stop string came back: {_brief(c.text)!r}")
        _check(c.finish_reason == "stop", f"finish_reason {c.finish_reason!r} (the stop string never matched): "
                                          f"{_brief(c.text)!r}")
        return repr(_brief(c.text))

    def json_schema(self) -> str:
        import jsonschema

        r = self.oa.chat.completions.create(
            model=self.model, max_tokens=40, temperature=0,
            messages=[{"role": "user", "content": "Describe Ada Lovelace, aged 36, as JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        text = r.choices[0].message.content or ""
        try:
            jsonschema.validate(json.loads(text), PERSON)
        except (ValueError, jsonschema.ValidationError) as e:
            raise Failed(f"not valid JSON for the schema ({_brief(e, 40)}): {_brief(text)!r}") from None
        return _brief(text)

    # -- tools -----------------------------------------------------------------------------
    def _calls(self, r: Any, how: str) -> str:
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        _check(bool(calls), f"no call ({how}); the reply: {_brief(ch.message.content)!r}")
        _check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason!r}")
        bad = [c.function for c in calls if not _schema_ok(c.function.name, c.function.arguments)]
        _check(not bad, f"a call that does not validate: {bad[0] if bad else ''}")
        return ", ".join(f"{c.function.name}({c.function.arguments})" for c in calls)

    def _tools(self, choice: Any, **kw: Any) -> Any:
        return self.oa.chat.completions.create(model=self.model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                               max_tokens=96, temperature=0, **kw)

    # Forced cells ask for one call (``parallel_tool_calls`` false): a forced small model
    # otherwise goes on calling until a call repeats, a few times the tokens for the same check.
    def tools_required(self) -> str:
        return self._calls(self._tools("required", parallel_tool_calls=False), "required")

    def tools_named(self) -> str:
        out = self._calls(self._tools({"type": "function", "function": {"name": "get_time"}},
                                      parallel_tool_calls=False), "named")
        _check(out.startswith("get_time("), f"another function was called: {out}")
        return out

    def tools_auto(self) -> str:
        return self._calls(self._tools("auto"), "auto")

    def tools_streamed(self) -> str:
        """Calls streamed as ``tool_calls`` deltas, forced (``required``: the model may make
        several), with no markup and no white space between them streamed as text."""
        chunks = list(self.oa.chat.completions.create(model=self.model, messages=ASK, tools=TOOLS, max_tokens=64,
                                                      tool_choice="required", temperature=0, stream=True))
        calls: dict[int, dict] = {}
        text = ""
        for ch in chunks:
            if not ch.choices:
                continue
            text += ch.choices[0].delta.content or ""
            for d in ch.choices[0].delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": "", "arguments": ""})
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
        _check(bool(calls), f"no call streamed; the text: {_brief(text)!r}")
        _check(all(_schema_ok(c["name"], c["arguments"]) for c in calls.values()), "a call that does not validate")
        _check(chunks[-1].choices[0].finish_reason == "tool_calls", "finish_reason is not tool_calls")
        _check(text == "" or bool(text.strip()), f"white space streamed as the reply's text beside its calls: {text!r}")
        return ", ".join(f"{c['name']}({c['arguments']})" for c in calls.values())

    def tools_result(self) -> str:
        history = ASK + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees Celsius, sunny"},
        ]
        r = self.oa.chat.completions.create(model=self.model, messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=32, temperature=0)
        text = r.choices[0].message.content or ""
        _check("18" in text, f"the result was not read: {_brief(text)!r}")
        return _brief(text)

    def logprobs(self) -> str:
        r = self.oa.chat.completions.create(model=self.model, max_tokens=4, temperature=0, logprobs=True,
                                            top_logprobs=2, messages=[{"role": "user", "content": "Say hello."}])
        content = r.choices[0].logprobs.content if r.choices[0].logprobs else []
        _check(len(content) == r.usage.completion_tokens > 0, "a logprob per token was not returned")
        _check(all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content), "malformed logprobs")
        return f"{len(content)} tokens"

    # -- the other APIs --------------------------------------------------------------------
    def anthropic_tools(self) -> str:
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]
        m = self.server.anthropic().messages.create(model=self.model, max_tokens=96, messages=ASK, tools=tools,
                                                    tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                                    extra_body={"temperature": 0})
        uses = [b for b in m.content if b.type == "tool_use"]
        _check(bool(uses) and m.stop_reason == "tool_use", f"no tool_use block: {_brief(m.content)!r}")
        _check(all(_schema_ok(u.name, u.input) for u in uses), "a tool_use that does not validate")
        return ", ".join(f"{u.name}({json.dumps(u.input)})" for u in uses)

    def ollama_tools(self) -> str:
        r = self.server.ollama().chat(model=self.model, messages=ASK, tools=TOOLS,
                                      options={"temperature": 0, "num_predict": 96})
        calls = r.message.tool_calls or []
        _check(bool(calls), f"no tool_calls: {_brief(r.message.content)!r}")
        _check(all(_schema_ok(c.function.name, dict(c.function.arguments)) for c in calls),
               "a call that does not validate")
        return ", ".join(c.function.name for c in calls)

    def count_tokens(self) -> str:
        a = self.server.anthropic()
        counted = a.messages.count_tokens(model=self.model, messages=ASK).input_tokens
        sent = a.messages.create(model=self.model, max_tokens=1, messages=ASK, extra_body={"temperature": 0}).usage
        read = sent.input_tokens + (sent.cache_read_input_tokens or 0)
        _check(counted == read > 0, f"count_tokens said {counted}, the message read {read}")
        return f"{counted} tokens"

    # -- OpenAI's Responses API ----------------------------------------------------------------
    def _respond(self, **kw: Any) -> Any:
        return self.oa.responses.create(model=self.model, temperature=0, store=kw.pop("store", False), **kw)

    def responses(self) -> str:
        r = self._respond(input="What is the capital of France?", max_output_tokens=12)
        _check(bool(r.output_text.strip()), "an empty reply")
        return _brief(r.output_text)

    def responses_stream(self) -> str:
        events = list(self._respond(input="What is the capital of France?", max_output_tokens=12, stream=True))
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        _check(bool(text.strip()), "an empty streamed reply")
        _check(events[-1].type in ("response.completed", "response.incomplete"), f"the stream ended with {events[-1].type}")
        _check(events[-1].response.output_text == text, "the final response differs from the streamed text")
        return f"{len(events)} events"

    def responses_json(self) -> str:
        import jsonschema

        r = self._respond(input="Describe Ada Lovelace, aged 36, as JSON.", max_output_tokens=40,
                          text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
        try:
            jsonschema.validate(json.loads(r.output_text), PERSON)
        except (ValueError, jsonschema.ValidationError) as e:
            raise Failed(f"not valid JSON for the schema ({_brief(e, 40)}): {_brief(r.output_text)!r}") from None
        return _brief(r.output_text)

    def responses_tools(self) -> str:
        """A function call, then its output sent back with ``previous_response_id`` (stored, then
        deleted): the next turn reads the call and its output, the chain's KV reused. Whether the
        model makes sense of a result is ``tools_result``'s question; this one asks few tokens."""
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        r = self._respond(input=ASK[0]["content"], tools=tools, max_output_tokens=96, parallel_tool_calls=False,
                          tool_choice={"type": "function", "name": "get_weather"}, store=True)
        try:
            calls = [o for o in r.output if o.type == "function_call"]
            _check(bool(calls), f"no call: {_brief(r.output_text)!r}")
            _check(all(_schema_ok(c.name, c.arguments) for c in calls), "a call that does not validate")
            after = self._respond(previous_response_id=r.id, tools=tools, max_output_tokens=4,
                                  input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                          "output": "18 degrees Celsius, sunny"}])
        finally:
            self.oa.responses.delete(r.id)
        held = r.usage.input_tokens + r.usage.output_tokens
        _check(after.usage.input_tokens > held, f"the next turn read {after.usage.input_tokens} tokens, "
                                                f"not the {held} of the call's turn and its output")
        cached = after.usage.input_tokens_details.cached_tokens
        _check(cached >= r.usage.input_tokens, f"{cached} tokens came from the stored chain, of "
                                               f"{r.usage.input_tokens} it held")
        return f"{calls[0].name}({calls[0].arguments}), then {after.usage.input_tokens} tokens ({cached} cached)"

    def responses_chain(self) -> str:
        """A fact carried by ``previous_response_id``, the history's KV read from the stored chain."""
        first = self._respond(input="My sister's name is Ilse. Just say OK.", max_output_tokens=8, store=True)
        try:
            r = self._respond(input="What is my sister's name?", previous_response_id=first.id, max_output_tokens=16)
        finally:
            self.oa.responses.delete(first.id)
        _check("Ilse" in r.output_text, f"the fact was not carried: {_brief(r.output_text)!r}")
        cached = r.usage.input_tokens_details.cached_tokens
        _check(cached >= first.usage.input_tokens, f"{cached} tokens came from the stored chain, of "
                                                   f"{first.usage.input_tokens} it held")
        return f"{_brief(r.output_text, 40)} ({cached} tokens cached)"

    def embeddings(self) -> str:
        r = self.oa.embeddings.create(model=self.model, input=["a cat", "a kitten"], encoding_format="float")
        dims = {len(d.embedding) for d in r.data}
        _check(len(r.data) == 2 and len(dims) == 1 and dims != {0}, "not two vectors of one width")
        return f"{dims.pop()} dimensions"

    # -- memory ----------------------------------------------------------------------------
    def conversation(self) -> str:
        name = f"conformance-{uuid.uuid4().hex[:8]}"
        headers = {"x-mlotspark-conversation": name}
        try:
            self.oa.chat.completions.create(
                model=self.model, max_tokens=8, temperature=0, extra_headers=headers,
                messages=[{"role": "user", "content": "My sister's name is Ilse. Just say OK."}])
            r = self.oa.chat.completions.create(
                model=self.model, max_tokens=16, temperature=0, extra_headers=headers,
                messages=[{"role": "user", "content": "What is my sister's name?"}])
        finally:
            self.engine.conversation(name).delete()
        text = r.choices[0].message.content or ""
        _check("Ilse" in text, f"the fact was not carried: {_brief(text)!r}")
        return _brief(text)

    def memory_writer(self) -> str:
        """The model writes memory better than the simple writer on the judge set (``memory_judge``),
        else refused: ``--memory-writer auto`` keeps the simple writer for this model."""
        from mlotspark.bench.memory_judge import judge
        from mlotspark.conversations.persistence import model_writer
        from mlotspark.errors import OptionError
        from mlotspark.memory.semantic import SimpleWriter

        embedder = self.engine.persistence.memory.embedder
        (model, n), (simple, _) = judge(embedder, model_writer(self.engine)), judge(embedder, SimpleWriter())
        if model <= simple:
            raise OptionError(f"the model writer scored {model}/{n} on the judge set, the simple writer {simple}/{n}: "
                              "memory is written by the simple writer")
        return f"model {model}/{n}, simple {simple}/{n}"

    def cascade(self) -> str:
        from mlotspark.bench.ruler import ANSWER_TOKENS, answer, make_case
        from mlotspark.memory.cascade import CascadeConfig

        config = CascadeConfig.for_model(self.engine.loaded.context_length, window=256)
        case = make_case("niah_single", 1024, 0.3, seed=1024, count_tokens=lambda t: len(self.engine.encode(t)))
        r = answer(self.engine, self.engine.encode(case.text), "cascade", config, ANSWER_TOKENS["niah_single"])
        _check(case.score(r.text) == 1.0, f"the needle was not found: {_brief(r.text)!r}")
        return f"{r.stats.prompt_tokens} tokens, window 256"


def run_cell(matrix: Matrix, name: str) -> Cell:
    """One cell: ``ok`` with what came back, ``refused`` with the error's message, or ``fail``."""
    from mlotspark.errors import MlotsparkError

    fn: Callable[[], str] = getattr(matrix, name)
    try:
        return Cell("ok", fn())
    except Failed as e:
        return Cell("fail", str(e))
    except MlotsparkError as e:  # the Python API refused before the first token
        return Cell("refused", _brief(e, 160))
    except Exception as e:  # noqa: BLE001  an SDK's error for an HTTP status
        status = getattr(e, "status_code", None) or getattr(getattr(e, "response", None), "status_code", None)
        if status is not None and 400 <= int(status) < 500:
            return Cell("refused", _brief(_error_message(e), 160))
        return Cell("fail", f"{type(e).__name__}: {_brief(e, 140)}")


def _error_message(e: Exception) -> str:
    """The message of an SDK's error: OpenAI's ``body`` is the error object, Anthropic's
    holds it under ``error``, Ollama's ``error`` is the text."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body["error"] if isinstance(body.get("error"), dict) else body
        if inner.get("message"):
            return str(inner["message"])
    return str(getattr(e, "error", None) or e)


def run_matrix(engine: Any, cells: tuple[str, ...] = CELLS, on_cell: Callable[[str, Cell], None] | None = None
               ) -> dict[str, Cell]:
    """Every cell of ``cells`` on ``engine``, behind a local server of its own.

    Args:
        engine: a loaded ``Engine`` (closed at the end by the server's lifespan).
        cells: which cells (default: all of ``CELLS``).
        on_cell: told each cell's outcome as it ends (progress).
    """
    from mlotspark.server.local import LocalServer

    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        from mlotspark.errors import OptionError

        raise OptionError(f"unknown conformance cell {unknown[0]!r}: choose from {', '.join(CELLS)}")
    server = LocalServer(engine)
    out: dict[str, Cell] = {}
    try:
        matrix = Matrix(engine, server)
        for name in cells:
            out[name] = run_cell(matrix, name)
            if on_cell is not None:
                on_cell(name, out[name])
    finally:
        server.stop()
    return out


def render(results: dict[str, dict[str, Cell]], details: bool = True) -> str:
    """A markdown table: a row per model, a column per cell (✓ ok, — refused, ✗ fail), then
    the lines of every refusal and failure."""
    names = list(results)
    cells = [c for c in CELLS if any(c in r for r in results.values())]
    lines = ["| model | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for name in names:
        row = results[name]
        lines.append(f"| {name} | " + " | ".join(row[c].mark if c in row else " " for c in cells) + " |")
    if details:
        notes = [f"- {name} · {c}: {cell.status}: {cell.detail}" for name in names
                 for c, cell in results[name].items() if cell.status != "ok"]
        if notes:
            lines += ["", *notes]
    return "\n".join(lines)


__all__ = ["CELLS", "Cell", "Matrix", "render", "run_cell", "run_matrix"]
