"""The MCP servers file: ``{"mcpServers": {name: {"command", "args", "env"} | {"url"}}}``.

The shape Claude Desktop, LM Studio and llama.cpp's ``--mcp-servers-config`` share, so one
file serves them all. A server is a local program spoken to over stdio (``command``), or a
streamable-HTTP endpoint (``url``) on this machine only: a remote URL would send the
model's tool arguments off the machine, which a local engine does not do unasked.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mlotspark.errors import OptionError

__all__ = ["McpServerConfig", "load_mcp_config", "parse_mcp_config"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,48}$")
_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class McpServerConfig:
    """One configured server.

    Attributes:
        name: the key in ``mcpServers`` (also the prefix of its tools when names clash).
        command: the program to start (stdio); empty for a ``url`` server.
        args: its arguments.
        env: variables set for it, over a minimal inherited environment (the SDK's).
        url: a streamable-HTTP endpoint on loopback; empty for a stdio server.
        cwd: the directory the program starts in (None: ours).
    """

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    cwd: str | None = None

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server(where: str, name: str, spec: Any) -> McpServerConfig:
    at = f"{where}: mcpServers.{name}"
    if not _NAME.match(name):
        raise OptionError(f"{where}: server name {name!r} must be 1-48 letters, digits, '_', '-' or '.'")
    if not isinstance(spec, dict):
        raise OptionError(f"{at} must be an object with \"command\" (stdio) or \"url\" (streamable HTTP)")
    if spec.get("disabled") is True:  # Claude Desktop / LM Studio's switch: kept in the file, not started
        return McpServerConfig(name=name, command="")
    command, url = spec.get("command"), spec.get("url")
    if url is not None:
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
            raise OptionError(f"{at}.url {url!r} is not an http(s) URL")
        host = urlsplit(url).hostname or ""
        if not _loopback(host):
            raise OptionError(f"{at}.url {url!r}: only servers on this machine (localhost, 127.0.0.1, ::1) "
                              "are spoken to; run a remote server behind a local one")
        return McpServerConfig(name=name, url=url)
    if not isinstance(command, str) or not command.strip():
        raise OptionError(f"{at} has no \"command\" (a program to start) or \"url\"")
    args = spec.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise OptionError(f"{at}.args must be a list of strings, not {json.dumps(args)[:60]}")
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise OptionError(f"{at}.env must be an object of string values")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise OptionError(f"{at}.cwd must be a string")
    return McpServerConfig(name=name, command=command, args=tuple(args), env=dict(env), cwd=cwd)


def parse_mcp_config(doc: Any, where: str = "MCP config") -> dict[str, McpServerConfig]:
    """The servers of a parsed config (``where`` names it in errors); disabled ones left out.

    Raises:
        OptionError: the shape is wrong, naming the bad key.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("mcpServers"), dict):
        raise OptionError(f"{where} has no \"mcpServers\" object: give "
                          '{"mcpServers": {"NAME": {"command": ..., "args": [...], "env": {...}}}}')
    servers = {name: _server(where, str(name), spec) for name, spec in doc["mcpServers"].items()}
    servers = {n: s for n, s in servers.items() if s.command or s.url}
    if not servers:
        raise OptionError(f"{where}: mcpServers names no server to start")
    return servers


def load_mcp_config(path: str | Path) -> dict[str, McpServerConfig]:
    """Read an MCP servers file (see the module docstring).

    Raises:
        OptionError: the file cannot be read, is not JSON or has a bad key (named).
    """
    p = Path(path).expanduser()
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise OptionError(f"cannot read MCP config {str(path)!r}: {e.strerror or e}") from None
    except ValueError as e:
        raise OptionError(f"MCP config {str(path)!r} is not JSON: {e}") from None
    return parse_mcp_config(doc, f"MCP config {str(path)!r}")
