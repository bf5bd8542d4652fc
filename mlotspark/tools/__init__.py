"""Tools the engine runs for the model: MCP servers (the Model Context Protocol) and the
loop that lets a model call them.

``mcp_config.py`` reads the servers file (the ``{"mcpServers": {...}}`` shape Claude
Desktop, LM Studio and llama.cpp share); ``mcp_hub.py`` starts the servers on one
background event loop with the ``mcp`` SDK, lists their tools and calls them with a
timeout and a size cap; ``loop.py`` is a turn that runs the calls a model makes and feeds
the results back (``run_turn``); ``responses_items.py`` runs a Responses ``mcp`` tool and
answers with ``mcp_list_tools`` / ``mcp_call`` output items.

May import: ``mlotspark.errors``, ``mlotspark.results`` and the ``mcp`` SDK; the engine
only as a duck-typed object passed in (never imported), so the CLI, the server and the
TUI all share one loop.
"""

from mlotspark.tools.loop import Approval, TurnEvent, TurnResult, run_turn
from mlotspark.tools.mcp_config import McpServerConfig, load_mcp_config
from mlotspark.tools.mcp_hub import McpHub, McpTool, ToolOutcome

__all__ = ["Approval", "McpHub", "McpServerConfig", "McpTool", "ToolOutcome", "TurnEvent", "TurnResult",
           "load_mcp_config", "run_turn"]
