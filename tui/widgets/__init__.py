"""Widgets of the chat app: the chat, the conversation list, the side panel."""

from .chat import ChatLog, NoteLine, PromptInput, Reply, UserMessage
from .conversations import ConversationItem, ConversationList
from .stats import StatsPanel

__all__ = [
    "ChatLog", "ConversationItem", "ConversationList", "NoteLine", "PromptInput", "Reply",
    "StatsPanel", "UserMessage",
]
