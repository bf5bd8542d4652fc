"""``ConversationActions``: opening, listing, creating, renaming and deleting conversations.

A mixin of ``ChatApp``. Each open conversation keeps its own ``ChatLog`` in the
content switcher, so a reply streaming in one keeps going while another is shown.
"""

from __future__ import annotations

from textual.widgets import ContentSwitcher

from tui import backend
from tui.screens import Confirm, TextPrompt
from tui.widgets import ChatLog, ConversationList, PromptInput
from tui.widgets.conversations import ConversationItem


class ConversationActions:
    """Conversation handling, mixed into ``ChatApp``."""

    async def open(self, name: str) -> None:
        """Show conversation ``name`` (its chat is kept while others are shown)."""
        if self.engine is None or not name:
            return
        with self.guard("Open conversation"):
            chat = self.logs.get(name)
            if chat is None:
                conv = self.engine.conversation(name)
                self._log_ids += 1
                chat = ChatLog(name, id=f"log-{self._log_ids}")
                await self.query_one("#logs", ContentSwitcher).mount(chat)
                self.logs[name] = chat
                await chat.load(backend.messages(conv))
            self.query_one("#logs", ContentSwitcher).current = chat.id
            self.current = name
            turn = self.turns.get(name)
            panel = self.panel
            panel.turn = self.figures.get(name, backend.TurnFigures())
            panel.streaming = turn is not None
            panel.live_tps = panel.live_ttft = None
            panel.refresh_figures()
            self.tiers_stale = True
            await self.refresh_list()

    async def refresh_list(self) -> None:
        if self.engine is None:
            return
        with self.guard("Conversations"):
            rows = backend.list_conversations(self.engine)
            await self.query_one(ConversationList).show(rows, self.current, set(self.turns))
            title = next((r.label for r in rows if r.name == self.current), self.current or "")
            self.sub_title = f"{backend.model_name(self.engine)} · {title}"

    async def on_list_view_selected(self, event: ConversationList.Selected) -> None:
        if isinstance(event.item, ConversationItem) and event.item.row.name != self.current:
            await self.open(event.item.row.name)

    async def action_new_conversation(self) -> None:
        if self.engine is None:
            return
        with self.guard("New conversation"):
            name = backend.next_name(r.name for r in backend.list_conversations(self.engine))
            backend.create_conversation(self.engine, name)
            await self.open(name)
            self.query_one(PromptInput).focus()

    def busy(self, what: str) -> bool:
        """True (and says so) if the open conversation is streaming a reply."""
        if self.current in self.turns:
            self.notify(f"Cannot {what} while its reply streams: Escape stops it.", severity="warning")
            return True
        return False

    def action_rename(self) -> None:
        if self.engine is None or self.current is None or self.busy("rename the conversation"):
            return
        rows = {r.name: r for r in self.query_one(ConversationList).rows}
        row = rows.get(self.current)
        self.push_screen(TextPrompt("Rename the conversation", row.label if row else self.current), self.rename)

    async def rename(self, title: str | None) -> None:
        if not title or self.engine is None or self.current is None or self.busy("rename the conversation"):
            return
        with self.guard("Rename"):
            self.engine.conversation(self.current).title = title
            await self.refresh_list()

    def action_delete(self) -> None:
        if self.engine is None or self.current is None or self.busy("delete the conversation"):
            return
        self.push_screen(Confirm(f"Delete the conversation {self.current!r} and its files?"), self.delete)

    async def delete(self, yes: bool | None) -> None:
        if not yes or self.engine is None or self.current is None or self.busy("delete the conversation"):
            return
        name = self.current
        with self.guard("Delete"):
            self.engine.conversation(name).delete()
            chat = self.logs.pop(name, None)
            self.figures.pop(name, None)
            self.current = None
            if chat is not None:
                await chat.remove()
            rows = backend.list_conversations(self.engine)
            if rows:
                await self.open(rows[0].name)
            else:
                await self.action_new_conversation()
            self.notify(f"Deleted {name!r}")


__all__ = ["ConversationActions"]
