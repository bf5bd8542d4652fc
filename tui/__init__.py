"""The ``mlotspark chat`` terminal UI (Textual). Uses only mlotspark's public API.

``app.py`` the app; ``widgets/`` the chat, the conversation list, the side panel;
``screens.py`` help and dialogs; ``commands.py`` + ``slash.py`` the slash commands;
``backend.py`` every call into the engine; ``messages.py`` what workers post back.
"""

from tui.app import ChatApp

__all__ = ["ChatApp"]
