"""An MCP server written with the ``mcp`` SDK, for tests/test_mcp.py: echo, a tool that
crashes the server mid-call, one that never answers, one that answers with a long text,
and one that writes garbage to the protocol stream. Two of these started under two names
offer the same tool names (the clash to prefix). ``--http PORT`` serves streamable HTTP on
127.0.0.1:PORT/mcp instead of stdio."""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("mlotspark-test")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


@server.tool()
def crash() -> str:
    """End the server's process in the middle of the call."""
    sys.stderr.write("test server: crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never answer."""
    await asyncio.Event().wait()
    return "never"


@server.tool()
def long(chars: int) -> str:
    """Answer with ``chars`` characters."""
    return "x" * chars


@server.tool()
def garbage() -> str:
    """Write a line that is not JSON-RPC onto the protocol stream, then answer."""
    sys.stdout.write("this is not JSON\n")
    sys.stdout.flush()
    return "answered after garbage"


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


if __name__ == "__main__":
    if "--http" in sys.argv:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run("stdio")
