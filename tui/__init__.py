"""The ``mlotspark chat`` terminal UI (Textual). Uses only mlotspark's public API.

``app.py`` the app; ``widgets/`` the chat, the conversation list, the side panel;
``screens.py`` help and dialogs; ``picker.py`` the model picker (F3); ``commands.py`` +
``slash.py`` the slash commands; ``tools.py`` tools files and tool calls split from replies
(shown, never run); ``mcp_turns.py`` MCP servers' tools (``--mcp``), asked about, run, fed back; ``backend.py`` every call into the engine; ``messages.py`` what
workers post back.
"""

from tui.app import ChatApp

__all__ = ["ChatApp"]
