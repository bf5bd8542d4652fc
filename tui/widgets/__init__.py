"""Widgets of the chat app: the chat, the conversation list, the side panel."""

from tui.widgets.chat import (ChatLog, NoteLine, PromptInput, Reply, ThinkingBlock, ToolCallBlock, ToolResultBlock,
                              UserMessage)
from tui.widgets.conversations import ConversationItem, ConversationList
from tui.widgets.stats import StatsPanel

__all__ = [
    "ChatLog", "ConversationItem", "ConversationList", "NoteLine", "PromptInput", "Reply",
    "StatsPanel", "ThinkingBlock", "ToolCallBlock", "ToolResultBlock", "UserMessage",
]
