"""``ConversationActions``: opening, listing, creating, renaming and deleting conversations.

A mixin of ``ChatApp``. Each open conversation keeps its own ``ChatLog`` in the
content switcher, so a reply streaming in one keeps going while another is shown.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from textual.widgets import ContentSwitcher

from tui import backend
from tui.screens import Confirm, TextPrompt
from tui.widgets import ChatLog, ConversationList, PromptInput
from tui.widgets.conversations import ConversationItem


UNDO_S = 8.0  # seconds a deleted conversation can be brought back (F9, /undo)


@dataclass
class Deleted:
    """A conversation deleted in this session, kept on disk until its undo time ends."""

    row: backend.ConversationRow
    timer: Any = None  # the Textual timer that deletes its files


class ConversationActions:
    """Conversation handling, mixed into ``ChatApp``.

    F2 and F8 act on what the user sees: the conversation highlighted in the list
    when the list has focus, else the open one; the dialogs name it by its title.
    A delete hides the conversation at once and removes its files after ``undo_s``
    seconds (or when the app quits), so F9 / ``/undo`` can bring it back until then.
    """

    undo_s: float = UNDO_S

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
                await chat.load(backend.messages(conv), split=self.split_stored)
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

    def visible_rows(self) -> list[backend.ConversationRow]:
        """Stored conversations, newest first, without those deleted in this session."""
        return [r for r in backend.list_conversations(self.engine) if r.name not in self.trash]

    async def refresh_list(self) -> None:
        if self.engine is None:
            return
        with self.guard("Conversations"):
            rows = self.visible_rows()
            await self.query_one(ConversationList).show(rows, self.current, set(self.turns))
            title = next((r.label for r in rows if r.name == self.current), self.current or "")
            self.sub_title = f"{backend.model_name(self.engine)} · {title}"

    async def on_list_view_selected(self, event: ConversationList.Selected) -> None:
        if isinstance(event.item, ConversationItem):
            if event.item.row.name != self.current:
                await self.open(event.item.row.name)
            self.query_one(PromptInput).focus()  # opened to type in it

    def target(self) -> backend.ConversationRow | None:
        """The conversation F2 / F8 act on: the highlighted one while the list has
        focus (what the user is looking at), else the open one."""
        clist = self.query_one(ConversationList)
        item = clist.highlighted_child
        if clist.has_focus and isinstance(item, ConversationItem):
            return item.row
        if self.current is None:
            return None
        rows = {r.name: r for r in clist.rows}
        return rows.get(self.current) or backend.ConversationRow(self.current, "")

    async def action_new_conversation(self) -> None:
        if self.engine is None:
            return
        with self.guard("New conversation"):
            name = backend.next_name(r.name for r in backend.list_conversations(self.engine))
            backend.create_conversation(self.engine, name)
            await self.open(name)
            self.query_one(PromptInput).focus()

    def busy(self, what: str, name: str | None = None) -> bool:
        """True (and says so) if conversation ``name`` (default: the open one) is streaming."""
        if (name or self.current) in self.turns:
            self.notify(f"Cannot {what} while its reply streams: Escape stops it.", severity="warning")
            return True
        return False

    def action_rename(self) -> None:
        row = self.target()
        if self.engine is None or row is None or self.busy("rename the conversation", row.name):
            return
        self.push_screen(TextPrompt(f"Rename “{row.label}”", row.label),
                         functools.partial(self.rename_conversation, row.name))

    async def rename(self, title: str | None) -> None:
        """Rename the open conversation (``/rename``)."""
        if self.current is not None:
            await self.rename_conversation(self.current, title)

    async def rename_conversation(self, name: str, title: str | None) -> None:
        if not title or self.engine is None or self.busy("rename the conversation", name):
            return
        with self.guard("Rename"):
            self.engine.conversation(name).title = title
            await self.refresh_list()

    def action_delete(self) -> None:
        row = self.target()
        if self.engine is None or row is None or self.busy("delete the conversation", row.name):
            return
        turns = "1 turn" if row.turns == 1 else f"{row.turns} turns"
        self.push_screen(Confirm(f"Delete “{row.label}” ({turns})? F9 brings it back for {self.undo_s:.0f} s."),
                         functools.partial(self.delete_conversation, row))

    async def delete_conversation(self, row: backend.ConversationRow, yes: bool | None) -> None:
        """Hide ``row`` now; its files go after ``undo_s`` seconds unless F9 brings it back."""
        if not yes or self.engine is None or self.busy("delete the conversation", row.name):
            return
        name = row.name
        with self.guard("Delete"):
            self.trash[name] = Deleted(row, self.set_timer(self.undo_s, functools.partial(self.purge, name)))
            chat = self.logs.pop(name, None)
            self.figures.pop(name, None)
            if chat is not None:
                await chat.remove()
            if name == self.current:
                self.current = None
                rows = self.visible_rows()
                if rows:
                    await self.open(rows[0].name)
                else:
                    await self.action_new_conversation()
            await self.refresh_list()
            self.notify(f"Deleted “{row.label}”: F9 (or /undo) brings it back for {self.undo_s:.0f} s",
                        timeout=self.undo_s)

    def purge(self, name: str | None = None) -> None:
        """Remove the files of deleted conversations (``name``, or all of them: at quit)."""
        for n in [name] if name is not None else list(self.trash):
            gone = self.trash.pop(n, None)
            if gone is None or self.engine is None:
                continue
            if gone.timer is not None:
                gone.timer.stop()
            with self.guard("Delete"):
                self.engine.conversation(n).delete()

    async def action_undo_delete(self) -> None:
        """F9: bring back the conversation deleted last (while its undo time lasts)."""
        if not self.trash:
            self.notify("Nothing to undo: no conversation was deleted in the last few seconds.")
            return
        name = list(self.trash)[-1]
        gone = self.trash.pop(name)
        if gone.timer is not None:
            gone.timer.stop()
        await self.open(name)
        self.notify(f"Restored “{gone.row.label}”")


__all__ = ["ConversationActions", "Deleted", "UNDO_S"]
