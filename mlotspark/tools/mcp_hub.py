"""``McpHub``: the configured MCP servers, started and spoken to with the ``mcp`` SDK.

One background thread runs one asyncio loop for every server: the SDK is async, its
transports are async context managers that must open and close in one task, and callers
(the engine's worker threads, the TUI's workers, Starlette handlers) are threads. Each
server lives in one task on that loop (``_hold``): it opens the transport and the
``ClientSession``, lists the tools, then waits for ``close``; leaving that task closes
the session and ends the child process (the SDK terminates its process tree).

Every wait is bounded (``start_timeout_s``, ``call_timeout_s``): a server that hangs,
crashes or answers garbage is a one-line error in the turn (``ToolOutcome.error``),
never a hung turn and never an exception out of ``call``. Results are cut to
``max_result_chars`` before they reach a model's context, and the outcome says so.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import json
import logging
import re
import tempfile
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.tools.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

__all__ = ["McpHub", "McpTool", "ToolOutcome", "tool_text"]

START_TIMEOUT_S = 30.0  # a server's start, handshake and tool list (uvx may fetch a package first)
CALL_TIMEOUT_S = 60.0  # one tool call
CLOSE_TIMEOUT_S = 5.0  # closing sessions and ending children, before the loop is stopped anyway
MAX_RESULT_CHARS = 8_000  # ~2k tokens of a tool's result in the model's context
_FUNCTION_NAME = re.compile(r"[^A-Za-z0-9_-]")  # OpenAI function names: [A-Za-z0-9_-]{1,64}


@dataclass(frozen=True)
class McpTool:
    """A tool as the model sees it.

    Attributes:
        name: the function name given to the model: the server's own name, or
            ``SERVER__NAME`` when two servers offer the same name.
        server: the server that runs it; ``tool``: its name there.
        description: the server's description; ``parameters``: its input JSON schema.
    """

    name: str
    server: str
    tool: str
    description: str = ""
    parameters: dict = field(default_factory=dict)

    def openai(self) -> dict:
        """The tool as an OpenAI function (what ``tools=`` takes)."""
        params = self.parameters if isinstance(self.parameters, dict) and self.parameters else {
            "type": "object", "properties": {}}
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": params}}


@dataclass
class ToolOutcome:
    """One tool run.

    Attributes:
        name: the function name the model called; ``server``/``tool``: where it ran.
        arguments: what it was called with.
        output: the result's text (cut to the hub's cap; ``cut`` says so), or "" on error.
        error: one line when the call failed (unknown tool, timeout, crash, error result).
        cut: the output was cut; ``full_chars`` is how long it was.
    """

    name: str
    server: str
    tool: str
    arguments: dict
    output: str = ""
    error: str | None = None
    cut: bool = False
    full_chars: int = 0

    @property
    def text(self) -> str:
        """What the model is shown: the output, or ``error: ...``."""
        return f"error: {self.error}" if self.error is not None else self.output


_GROUP = getattr(builtins, "BaseExceptionGroup", None)  # Python 3.11+; anyio raises groups


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _describe(e: BaseException) -> str:
    """A failure as one line, the innermost error of an exception group."""
    while _GROUP is not None and isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
        return "timed out"
    return _one_line(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def tool_text(result: Any) -> tuple[str, bool]:
    """A ``CallToolResult`` as text and whether it is an error result; any other shape
    (garbage) raises ValueError."""
    content = getattr(result, "content", None)
    if not isinstance(content, list):
        raise ValueError(f"not a tool result: {type(result).__name__}")
    parts = []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(str(block.text))
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {getattr(block, 'mime_type', '')}, {len(getattr(block, 'data', '') or '')} "
                         "base64 characters not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {getattr(block, 'uri', '')}]")
        elif kind == "resource":
            res = getattr(block, "resource", None)
            parts.append(str(getattr(res, "text", None) or f"[resource {getattr(res, 'uri', '')}]"))
        else:
            parts.append(f"[{kind} content not shown]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts), bool(getattr(result, "is_error", False))


def _connection_closed(e: BaseException | None) -> bool:
    from mcp_types import CONNECTION_CLOSED

    return e is not None and getattr(getattr(e, "error", None), "code", None) == CONNECTION_CLOSED


class _Server:
    """One server's live state, written on the hub's loop."""

    def __init__(self, config: McpServerConfig):
        self.config = config
        self.session: Any = None
        self.tools: list[Any] = []
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task | None = None
        self.error: str | None = None  # why it is not running (failed to start, exited)
        self.stderr: Any = None  # its stderr, kept for the last line of a crash

    def last_stderr(self) -> str:
        if self.stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self.stderr.flush()
            self.stderr.seek(0)
            lines = [ln for ln in self.stderr.read().splitlines() if ln.strip()]
            return _one_line(lines[-1], 160) if lines else ""
        return ""


class McpHub:
    """The configured MCP servers and their tools.

    Args:
        servers: from ``load_mcp_config`` (name → ``McpServerConfig``).
        start_timeout_s: how long a server may take to start and list its tools.
        call_timeout_s: how long one call may take (tests pass a short one).
        max_result_chars: the cap on a result's text before the model sees it.

    ``start()`` (or ``with McpHub(...) as hub``) starts every server; one that fails is
    left out and named in ``errors`` (the others run). ``close()`` ends them all; it also
    runs at interpreter exit.
    """

    def __init__(self, servers: dict[str, McpServerConfig], *, start_timeout_s: float = START_TIMEOUT_S,
                 call_timeout_s: float = CALL_TIMEOUT_S, max_result_chars: int = MAX_RESULT_CHARS):
        if max_result_chars < 1:
            raise OptionError(f"invalid max_result_chars {max_result_chars!r}: use a positive number")
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.max_result_chars = max_result_chars
        self._servers = {name: _Server(cfg) for name, cfg in servers.items()}
        self._tools: dict[str, McpTool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- life -------------------------------------------------------------------------
    def __enter__(self) -> "McpHub":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "McpHub":
        """Start every server and list the tools (bounded by ``start_timeout_s`` each, in parallel)."""
        with self._lock:
            if self._loop is not None:
                return self
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="mcp-hub", daemon=True)
            self._thread.start()
            self._loop = loop
        atexit.register(self.close)
        started = asyncio.run_coroutine_threadsafe(self._start_all(), loop)
        try:
            started.result(self.start_timeout_s + CLOSE_TIMEOUT_S)
        except FutureTimeout:
            started.cancel()
        self._tools = self._name_tools()
        return self

    async def _start_all(self) -> None:
        await asyncio.gather(*(self._start_one(s) for s in self._servers.values()))

    async def _start_one(self, server: _Server) -> None:
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        server.stop = asyncio.Event()
        server.task = asyncio.create_task(self._hold(server, ready), name=f"mcp {server.config.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_timeout_s)
        except Exception as e:  # noqa: BLE001  a server that cannot start is named, not fatal
            server.error = server.error or f"did not start: {_describe(e)}" + (
                f" ({server.last_stderr()})" if server.last_stderr() else "")
            server.task.cancel()
            with contextlib.suppress(BaseException):
                await server.task

    async def _hold(self, server: _Server, ready: asyncio.Future) -> None:
        """The server's whole life in one task: open, list the tools, wait for ``close``."""
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        cfg = server.config
        try:
            async with contextlib.AsyncExitStack() as stack:
                if cfg.url:
                    streams = await stack.enter_async_context(streamable_http_client(cfg.url))
                else:
                    server.stderr = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
                    params = StdioServerParameters(command=cfg.command, args=list(cfg.args), env=cfg.env or None,
                                                   cwd=cfg.cwd)
                    streams = await stack.enter_async_context(stdio_client(params, errlog=server.stderr))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                tools, cursor = [], None
                while True:  # the list may come in pages
                    listed = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
                    tools += list(listed.tools)
                    cursor = getattr(listed, "next_cursor", None)
                    if not cursor:
                        break
                server.session, server.tools = session, tools
                ready.set_result(True)
                assert server.stop is not None
                await server.stop.wait()
        except BaseException as e:  # noqa: BLE001  the task's end is the server's end, whatever ended it
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(_describe(e)))
            elif not (server.stop and server.stop.is_set()):
                server.error = f"exited: {_describe(e)}"
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            server.session = None
            opened = ready.done() and not ready.cancelled() and ready.exception() is None
            if server.error is None and opened and not (server.stop and server.stop.is_set()):
                server.error = "exited"

    def close(self) -> None:
        """End every server (their child processes too) and the loop thread. Idempotent."""
        with self._lock:
            loop, thread, self._loop = self._loop, self._thread, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

        async def stop_all() -> None:
            tasks = [s.task for s in self._servers.values() if s.task is not None and not s.task.done()]
            for s in self._servers.values():
                if s.stop is not None:
                    s.stop.set()
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
                for t in pending:
                    t.cancel()
                if pending:
                    await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop_all(), loop).result(3 * CLOSE_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(CLOSE_TIMEOUT_S)
        if thread is None or not thread.is_alive():
            loop.close()

    # -- tools ------------------------------------------------------------------------
    def _name_tools(self) -> dict[str, McpTool]:
        """Every running server's tools; a name two servers share gets each server's prefix."""
        listed = [(s.config.name, t) for s in self._servers.values() if s.session is not None for t in s.tools]
        counts: dict[str, int] = {}
        for _, t in listed:
            counts[t.name] = counts.get(t.name, 0) + 1
        out: dict[str, McpTool] = {}
        for server, t in listed:
            base = _FUNCTION_NAME.sub("_", t.name)
            name = f"{_FUNCTION_NAME.sub('_', server)}__{base}" if counts[t.name] > 1 else base
            name = name[:64]
            if name in out:  # still taken (names equal once sanitised): keep the first, say so
                log.warning("MCP tool %r of %r left out: its name %r is taken", t.name, server, name)
                continue
            out[name] = McpTool(name, server, t.name, t.description or "", dict(getattr(t, "input_schema", {}) or {}))
        return out

    @property
    def tools(self) -> list[McpTool]:
        """The tools of the servers that started, as the model sees them."""
        return list(self._tools.values())

    def openai_tools(self, server: str | None = None) -> list[dict]:
        """The tools as OpenAI functions (``tools=``), all or one server's."""
        return [t.openai() for t in self._tools.values() if server is None or t.server == server]

    @property
    def servers(self) -> list[str]:
        """The configured servers' names, in the config's order."""
        return list(self._servers)

    @property
    def errors(self) -> dict[str, str]:
        """Servers not running now, each with why (one line)."""
        return {n: s.error for n, s in self._servers.items() if s.error}

    def describe(self) -> list[dict]:
        """Each server: name, transport, running or not (and why), its tools (``/health``)."""
        return [{"name": n, "transport": s.config.transport, "running": s.session is not None,
                 **({"error": s.error} if s.error else {}),
                 "tools": [t.name for t in self._tools.values() if t.server == n]}
                for n, s in self._servers.items()]

    def call(self, name: str, arguments: dict | None = None, *, timeout_s: float | None = None) -> ToolOutcome:
        """Run tool ``name`` (the name the model sees) and wait for it, at most ``timeout_s``
        (default the hub's ``call_timeout_s``). Never raises for the tool's sake: a failure
        is ``ToolOutcome.error``."""
        args = dict(arguments or {})
        tool = self._tools.get(name)
        if tool is None:
            return ToolOutcome(name, "", name, args, error=f"no tool {name!r}; the tools are "
                               f"{', '.join(self._tools) or 'none'}")
        outcome = ToolOutcome(name, tool.server, tool.tool, args)
        server, loop = self._servers[tool.server], self._loop
        if loop is None:
            outcome.error = "the MCP servers are closed"
            return outcome
        wait = self.call_timeout_s if timeout_s is None else timeout_s
        fut = asyncio.run_coroutine_threadsafe(self._call(server, tool.tool, args, wait), loop)
        try:
            text, is_error = fut.result(wait + CLOSE_TIMEOUT_S)
        except FutureTimeout:
            fut.cancel()
            outcome.error = f"{tool.server}: {tool.tool} timed out after {wait:g} s"
            return outcome
        except Exception as e:  # noqa: BLE001  crash, garbage, protocol error: one line
            why = server.error or _describe(e)
            if why == "timed out":
                why = f"timed out after {wait:g} s"
            tail = server.last_stderr()
            outcome.error = f"{tool.server}: {tool.tool} failed: {why}" + (f" ({tail})" if tail and
                                                                            tail not in why else "")
            return outcome
        outcome.full_chars = len(text)
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + (f"\n[result cut at {self.max_result_chars:,} of "
                                                    f"{outcome.full_chars:,} characters]")
            outcome.cut = True
        if is_error:
            outcome.error = f"{tool.server}: {tool.tool} returned an error: {_one_line(text)}"
        else:
            outcome.output = text
        return outcome

    async def _call(self, server: _Server, tool: str, args: dict, wait: float) -> tuple[str, bool]:
        if server.session is None or server.task is None or server.task.done():
            raise RuntimeError(server.error or "not running")
        call = asyncio.ensure_future(server.session.call_tool(tool, args))
        # A server that dies mid-call may leave the request unanswered: its task's end ends the wait.
        done, _ = await asyncio.wait({call, server.task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            if _connection_closed(call.exception()):  # it died: say so from now on, end what is left of it
                tail = server.last_stderr()
                server.error = "exited: connection closed" + (f" ({tail})" if tail else "")
                server.session = None
                if server.stop is not None:
                    server.stop.set()
            return tool_text(call.result())
        call.cancel()
        with contextlib.suppress(BaseException):
            await call
        if server.task in done:
            raise RuntimeError(server.error or "the server exited")
        raise TimeoutError()
