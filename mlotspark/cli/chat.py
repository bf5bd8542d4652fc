"""``mlotspark chat``: the terminal UI (the ``tui`` package, imported only when run)."""

from __future__ import annotations

import argparse
import functools
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.storage import safe_name
from mlotspark.cli.common import (add_cascade_args, add_memory_args, add_model_args, add_sampling_args, cascade_kwargs,
                                  cascade_shape, memory_kwargs, sampling_options, start_hub)


#: Why the chat does not run across ranks: ``mlx.launch`` pipes every rank's stdin and
#: stdout, so no rank has a terminal for a Textual app; the commands that do run across ranks.
DISTRIBUTED_REFUSAL = (
    "mlotspark chat does not run across ranks: mlx.launch gives no rank a terminal; use "
    "`mlx.launch ... -- mlotspark generate --distributed {mode} -p ...` (or --prompts FILE, batched across "
    "the ranks) or Engine.load(distributed={mode!r}) from Python"
)


def run(args: argparse.Namespace) -> int:
    if args.distributed:
        raise OptionError(DISTRIBUTED_REFUSAL.format(mode=args.distributed))
    options = sampling_options(args)
    if args.conversation is not None:  # a bad name fails here too (it had opened an empty chat-N)
        safe_name(args.conversation, "conversation name")
    cascade = cascade_kwargs(args)  # a bad flag or a conflict fails before the app starts
    shape = cascade_shape(cascade)
    if shape:  # and a span past the model's context, read from its files (the load would say it in a popup)
        from mlotspark.memory.cascade import CascadeConfig
        from mlotspark.models.loader import stated_context

        context = stated_context(args.model)
        if context:
            CascadeConfig.for_model(context, **shape)
    from tui.tools import ToolSpec, load_tools  # the CLI layer may import the UI; mlotspark itself never does

    from mlotspark.tools import load_mcp_config

    tools = load_tools(args.tools) if args.tools else None
    servers = load_mcp_config(args.mcp) if args.mcp else None  # a bad file fails before anything starts
    # A bad value (or a bad tool) fails before the app starts.
    GenerationOptions().merged(**options, **(tools.options() if tools else {}))
    hub = None
    if servers is not None:
        hub = start_hub(servers)
        if hub.tools:
            given = (tools.tools if tools else []) + hub.openai_tools()
            tools = ToolSpec(given, tools.choice if tools else "auto", args.mcp)
    try:
        return _run_app(args, options, cascade, tools, hub)
    finally:
        if hub is not None:
            hub.close()  # the servers' processes end with the chat


def _run_app(args: argparse.Namespace, options: dict, cascade: dict, tools: Any, hub: Any) -> int:
    from tui import ChatApp
    from tui.backend import load_engine

    app = ChatApp(
        model=args.model,
        conversation=args.conversation,
        options=options,
        loader=functools.partial(load_engine, weights=args.weights, **cascade, **memory_kwargs(args)),  # a model /model opens too
        tools=tools,
        mcp=hub,
    )
    try:
        app.run()
    finally:
        app.close_engine()
    return app.return_code or 0  # 1 when the app ended on an error (Textual printed it)


def register(sub: Any) -> None:
    p = sub.add_parser("chat", help="chat in a terminal UI (conversations, live engine stats)",
                       description="Chat with a model in a terminal UI: conversations that survive "
                                   "restarts, replies streaming as Markdown, live engine figures.")
    add_model_args(p)
    p.add_argument("--conversation", "-c", default=None, metavar="NAME",
                   help="open this conversation (created if new; default: the most recent one)")
    add_sampling_args(p)
    p.add_argument("--tools", default=None, metavar="FILE",
                   help="give the model these tools (an OpenAI tools JSON file: a list, or {\"tools\": [...], "
                        "\"tool_choice\": ...}); its calls are shown in the chat, never run")
    p.add_argument("--mcp", default=None, metavar="FILE",
                   help="run MCP servers' tools for the model (a {\"mcpServers\": {NAME: {\"command\", \"args\", "
                        "\"env\"}}} file, as Claude Desktop / LM Studio / llama.cpp read); each run is asked first")
    p.add_argument("--distributed", choices=("pipeline", "tensor"), default=None,
                   help="not supported: mlx.launch gives no rank a terminal; the error names the commands "
                        "that do run across ranks")
    add_cascade_args(p)
    add_memory_args(p)
    p.set_defaults(func=run)
