"""``mlotspark serve``: the engine behind an OpenAI-compatible HTTP API (uvicorn).

Binds to 127.0.0.1 unless told otherwise; another address needs ``--api-key``, as
anyone who can reach it could otherwise use the model. SIGINT/SIGTERM end the
streams in flight with an error event, save the prompt cache and close the engine.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from mlotspark.cli.batch import add_scheduler_args, scheduler_kwargs
from mlotspark.cli.common import (WEIGHT_CHOICES, WEIGHTS_HELP, add_cascade_args, add_memory_args, cascade_kwargs,
                                  cascade_shape, memory_kwargs)
from mlotspark.models.hub.aliases import ACCELERATED_DEFAULT, DEFAULT_MODEL
from mlotspark.errors import OptionError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
LOOPBACK_NAMES = ("localhost", "ip6-localhost")
# server.models.DEFAULT_KEEP_ALIVE_S, not imported: the server's modules load only when serving.
DEFAULT_KEEP_ALIVE_S = 300.0


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, port: int, api_key: str | None) -> None:
    """Refuse a port out of range, or a non-loopback host without an API key.

    Raises:
        OptionError: one line saying why.
    """
    if not 0 < port < 65536:
        raise OptionError(f"invalid --port {port}: use 1-65535")
    if not is_loopback(host) and not api_key:
        raise OptionError(
            f"refusing to listen on {host} without --api-key: anyone who can reach it could use the model "
            f"(use --host {DEFAULT_HOST}, or set --api-key / MLOTSPARK_API_KEY)"
        )


def run(args: argparse.Namespace) -> int:
    api_key = args.api_key or os.environ.get("MLOTSPARK_API_KEY") or None
    check_bind(args.host, args.port, api_key)
    if args.max_queue < 0:
        raise OptionError(f"invalid --max-queue {args.max_queue}: use an integer >= 0")
    if args.prompt_cache_mb < 0:
        raise OptionError(f"invalid --prompt-cache-mb {args.prompt_cache_mb}: use a number >= 0")
    from mlotspark.units import parse_bytes

    store_budget = parse_bytes(args.store_budget, "--store-budget", allow_zero=True)  # a bad size fails before the model loads
    if args.max_models < 1:
        raise OptionError(f"invalid --max-models {args.max_models}: use an integer >= 1")
    if args.keep_alive < 0 and args.keep_alive != -1:
        raise OptionError(f"invalid --keep-alive {args.keep_alive}: use seconds >= 0, or -1 (never unload)")
    folders = tuple(Path(d).expanduser() for d in args.allow_load or ())
    for d in folders:
        if not d.is_dir():
            raise OptionError(f"invalid --allow-load {str(d)!r}: not a directory")
    kwargs = scheduler_kwargs(args)  # a bad value fails before the model loads
    cascade = cascade_kwargs(args)  # so does a bad or conflicting cascade flag
    servers = None
    if args.mcp:
        from mlotspark.tools import load_mcp_config

        servers = load_mcp_config(args.mcp)  # and a bad MCP servers file
    sock = bind_port(args.host, args.port)  # and a busy port, before seconds of loading
    load = engine_loader(args, kwargs, cascade)
    import uvicorn

    from mlotspark.engine import Engine
    from mlotspark.models.hub.catalogue import default_model
    from mlotspark.server import ModelPool, PromptCache, ServerState, create_app
    from mlotspark.server.response_store import ResponseStore

    # One memory budget and one thermal governor for every model served (server/governance.py).
    governance = shared_governance(kwargs)

    def make_cache(engine: Engine) -> PromptCache | None:
        return None if args.prompt_cache_mb == 0 else PromptCache(engine, budget_mb=args.prompt_cache_mb)

    specs = args.model or [default_model()]
    first = governance.share(specs[0])
    engine = load(specs[0], first)
    pool = ModelPool(load, make_cache, keep_alive_s=args.keep_alive, max_models=args.max_models,
                     allow_load=folders, allow_pull=args.allow_pull, governance=governance)
    pool.add(engine.model_name, specs[0], engine, share=first)
    fit = governance.fits(engine.model_name, pool.default.weights_bytes, without=(first,))
    if not fit.ok:  # the first model alone leaves too little for KV
        engine.close()
        raise OptionError(f"cannot serve: {fit.line}")
    for spec in specs[1:]:  # loaded on first use
        pool.add(spec, spec)
    hub = None
    if servers is not None:
        from mlotspark.cli.common import start_hub

        hub = start_hub(servers)  # closed by the lifespan's exit (ServerState.close)
    state = ServerState(engine, api_key=api_key, max_queue=args.max_queue, prompt_cache=make_cache(engine),
                        aliases=(specs[0],), pool=pool, response_store=ResponseStore(budget_bytes=store_budget),
                        mcp=hub)
    app = create_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=10, access_log=args.log_level in ("info", "debug"))
    server = _Server(config, state)
    where = f"http://{'[' + args.host + ']' if ':' in args.host else args.host}:{args.port}/v1"
    print(f"mlotspark: serving {state.model_id} on {where}"
          f"{' (API key required)' if api_key else ''}; {cascade_summary(cascade)}; Ctrl+C stops",
          file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    return 0 if server.started else 1


def bind_port(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound now (uvicorn listens on it once the model is
    loaded), so a port in use is one line before any loading.

    Raises:
        OptionError: the address cannot be bound, naming it and why.
    """
    where = f"{'[' + host + ']' if ':' in host else host}:{port}"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise OptionError(f"invalid --host {host!r}: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a restart may reuse it
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "in use (another server there? pick one with --port)" if e.errno == errno.EADDRINUSE else e.strerror
        raise OptionError(f"cannot listen on {where}: {why}") from None
    sock.set_inheritable(True)
    return sock


def engine_loader(args: argparse.Namespace, kwargs: dict[str, Any] | None = None,
                  cascade: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``load(spec, governor=None) -> Engine`` for every model the server loads, with the
    flags: weights, the memory cascade (``cascade``, else ``cascade_kwargs(args)``) and the
    scheduler's ``kwargs`` (else ``scheduler_kwargs(args)``).

    Raises:
        OptionError: a bad or conflicting cascade flag (before any model loads).
    """
    cascade = cascade_kwargs(args) if cascade is None else cascade
    kwargs = scheduler_kwargs(args) if kwargs is None else kwargs

    def load(spec: str, governor: Any = None) -> Any:
        from mlotspark.engine import Engine

        from mlotspark.cli.progress import announce_pull, step_lines

        announce_pull(spec)
        with step_lines():  # piped (a service's log): a fetch or a conversion still says so
            return Engine.load(spec, weights=args.weights, progress=sys.stderr.isatty(), governor=governor,
                               **cascade, **kwargs, **memory_kwargs(args))

    return load


def cascade_summary(kw: dict[str, Any]) -> str:
    """The memory cascade the server runs (``cascade_kwargs``), in words for its start-up line."""
    shape = cascade_shape(kw)
    fields = ", ".join(f"{k} {v}" for k, v in shape.items())
    if kw["cascade"] is None:
        return "memory cascade off (prompts past the context are refused)"
    if kw["cascade"] == "auto":
        return "memory cascade past the context" + (f" ({fields})" if fields else "")
    return "memory cascade for every request" + (f" ({fields})" if fields else "")


def shared_governance(kwargs: dict[str, Any]) -> Any:
    """The server's :class:`SharedGovernor`: one ThermalGovernor (mode, max batch) and the machine's
    memory budget (``--memory-limit``, else Metal's working set, else the memory available now)."""
    from mlotspark.server.governance import SharedGovernor, machine_budget
    from mlotspark.platform.memory import apply_memory_limit
    from mlotspark.thermal.governor import ThermalGovernor

    limit = kwargs.get("memory_limit")
    if limit is not None:
        apply_memory_limit(limit)  # MLX's allocator too, as one engine's own governor would
    # No limit on the governor itself: each engine's share of the budget gates its admissions.
    governor = ThermalGovernor(mode=kwargs.get("mode", "auto"), max_batch=kwargs.get("max_batch", 8))
    return SharedGovernor(governor, machine_budget(limit))


class _Server:
    """uvicorn's server, told first when a signal asks it to stop (streams end at once)."""

    def __new__(cls, config: Any, state: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                state.begin_shutdown()
                super().handle_exit(sig, frame)

        return Server(config)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve", help="serve models over OpenAI's, Anthropic's and Ollama's HTTP APIs",
        description="Serve models over OpenAI's (/v1/chat/completions, /v1/completions, /v1/embeddings, "
                    "/v1/models), Anthropic's (/v1/messages) and Ollama's (/api/*) HTTP APIs, "
                    "with /health and /metrics.",
    )
    p.add_argument("--model", "-m", action="append", default=None, metavar="MODEL",
                   help="alias, .gguf file or mlx-lm directory to serve; repeat for several (the first is the "
                        f"default, loaded at start; the others on first use) (default: {DEFAULT_MODEL} on the "
                        f"CPU, {ACCELERATED_DEFAULT} on a GPU)")
    p.add_argument("--weights", default="auto", choices=WEIGHT_CHOICES, help=WEIGHTS_HELP)
    p.add_argument("--allow-load", action="append", default=None, metavar="DIR",
                   help="a folder whose .gguf files and model directories a request may name (loaded on demand); "
                        "repeatable; no other path is ever opened")
    p.add_argument("--mcp", default=None, metavar="FILE",
                   help="MCP servers ({\"mcpServers\": {NAME: {\"command\", \"args\", \"env\"}}}) whose tools a "
                        "Responses request may run server-side with {\"type\": \"mcp\", \"server_label\": NAME}; "
                        "named in /health")
    p.add_argument("--allow-pull", action="store_true",
                   help="pull catalogue aliases a request names that are not on disk yet")
    p.add_argument("--keep-alive", type=float, default=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
                   help=f"unload a model idle this long, the default one excepted; -1 = never "
                        f"(default {DEFAULT_KEEP_ALIVE_S:g})")
    p.add_argument("--max-models", type=int, default=3,
                   help="most models resident at once; the least recently used is unloaded first (default 3)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}; another needs --api-key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", default=None,
                   help="require the key ('Authorization: Bearer KEY' or 'x-api-key: KEY') on every path but "
                        "/, /health and /metrics (default: $MLOTSPARK_API_KEY, else none)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a batch slot; more get HTTP 503 (default 64)")
    p.add_argument("--prompt-cache-mb", type=float, default=1024.0,
                   help="MB (10^6 bytes) for the KV of recent histories, matched by token prefix; 0 = off "
                        "(default 1024)")
    p.add_argument("--store-budget", default="4GB", metavar="SIZE",
                   help="disk for the KV snapshots of stored /v1/responses chains (bytes, or 500MB, 4GB ...; GB = GiB); "
                        "past it the oldest chains' snapshots go first; 0 = none (default 4GB)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level (default warning; info and debug also log each request)")
    add_scheduler_args(p)
    add_cascade_args(p)
    add_memory_args(p)
    p.set_defaults(func=run)


__all__ = ["check_bind", "engine_loader", "is_loopback", "register", "run"]
