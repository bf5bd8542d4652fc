"""The conversation list on the left: stored conversations, newest first."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Label, ListItem, ListView

from tui.backend import ConversationRow


def _label(row: ConversationRow, streaming: bool) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append("● " if streaming else "  ", style="bold green" if streaming else "")
    text.append(row.label)
    turns = "1 turn" if row.turns == 1 else f"{row.turns} turns"
    named = f" · {row.name}" if row.title and row.title != row.name else ""  # the name -c opens it by
    text.append(f"\n  {turns}{named}", style="dim")
    return text


class ConversationItem(ListItem):
    """One conversation in the list."""

    def __init__(self, row: ConversationRow, streaming: bool = False) -> None:
        super().__init__(Label(_label(row, streaming)))
        self.row = row
        self.streaming = streaming

    def set(self, row: ConversationRow, streaming: bool) -> None:
        """Show ``row`` (same conversation, new title, turns or streaming mark)."""
        if (row, streaming) != (self.row, self.streaming):
            self.row, self.streaming = row, streaming
            self.query_one(Label).update(_label(row, streaming))


class ConversationList(ListView):
    """Conversations (Enter or a click opens one); ``●`` marks one whose reply is streaming."""

    _shown_current: str | None = None  # the open conversation at the last ``show``

    async def show(self, rows: list[ConversationRow], current: str | None, streaming: set[str]) -> None:
        """Show ``rows`` and highlight ``current``; items are updated in place when the
        conversations are the same, so the list does not flicker while replies stream.
        While the open conversation stays the same, the highlight stays on the conversation
        the user moved it to, in place or re-sorted (a reply ending while they pick one must
        not pull it back to the open one)."""
        items = list(self.query(ConversationItem))
        same = [i.row.name for i in items] == [r.name for r in rows]
        # The conversation the user has highlighted, to keep when the list is rebuilt in another
        # order (a reply ending re-sorts it; the highlight must not jump back to the open one).
        child = self.highlighted_child
        highlighted = child.row.name if isinstance(child, ConversationItem) else None
        if same:
            for item, row in zip(items, rows):
                item.set(row, row.name in streaming)
        else:
            with self.app.batch_update():
                await self.clear()
                await self.extend([ConversationItem(r, r.name in streaming) for r in rows])
        names = self.names
        if current == self._shown_current and highlighted in names:
            if not same:
                self.index = names.index(highlighted)
        elif current in names:
            self.index = names.index(current)
        self._shown_current = current

    @property
    def names(self) -> list[str]:
        return [item.row.name for item in self.query(ConversationItem)]

    @property
    def rows(self) -> list[ConversationRow]:
        return [item.row for item in self.query(ConversationItem)]


__all__ = ["ConversationItem", "ConversationList"]
