"""The model picker (F3, ``/model``): the models a user can open, and which one is open.

The rows come from ``backend.list_models`` (``mlotspark.available_models``: every
catalogue alias, pulled or not, and what ``mlotspark list`` shows), read in a worker
thread since it scans the disk. Enter returns the chosen row's name; the app loads it
(``ChatApp.switch_model``), off the UI thread, and keeps the old model if that fails.
"""

from __future__ import annotations

from typing import Callable

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tui.backend import ModelRow

HINT = "Enter opens it (conversations stay) · Escape closes · /model PATH opens a .gguf file or a directory"


def row_text(row: ModelRow, width: int, current: bool) -> Text:
    """One line of the picker: on disk or not, name, size, where it is, marks."""
    out = Text("● " if row.pulled else "○ ", style="green" if row.pulled else "dim")
    out.append(f"{row.name:<{width}}", style="bold" if current else "")
    out.append(f"  {'on disk' if row.pulled else 'to pull':<7}", style="" if row.pulled else "dim")
    out.append(f"  {row.size / 1e6:8.1f} MB  ")
    out.append(row.where, style="dim")
    marks = [m for m, on in (("default", row.default), ("open now", current)) if on]
    if marks:
        out.append(f"  ({', '.join(marks)})", style="italic")
    if row.capabilities:
        out.append(f"  [{row.capabilities}]", style="dim")
    return out


class ModelPicker(ModalScreen[str | None]):
    """Pick a model to open; returns its name (None: closed without a choice).

    Args:
        lister: the rows (``backend.list_models``; tests pass their own).
        current: the open model's name and path (to mark its row).
        facts: one line about the open model (weights, size, context, device).
    """

    BINDINGS = [Binding("escape", "close", "Close"), Binding("f3", "close", "Close", show=False)]

    def __init__(self, lister: Callable[[], list[ModelRow]], current: tuple[str, str] = ("", ""),
                 facts: str = "") -> None:
        super().__init__()
        self.lister = lister
        self.current = current
        self.facts = facts
        self.rows: list[ModelRow] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box"):
            yield Static("Open a model", id="picker-title")
            yield Static(Text(self.facts or "", style="dim"), id="picker-facts")
            yield OptionList(Option("Reading the models on disk …", disabled=True), id="picker-list")
            yield Static(HINT, id="picker-hint")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()
        self.read_rows()

    @work(thread=True, exit_on_error=False)
    def read_rows(self) -> None:
        """[worker thread] Read the models on disk (the Hugging Face cache too)."""
        try:
            rows = self.lister()
        except Exception as e:  # noqa: BLE001  a broken folder must not end the app
            self.app.call_from_thread(self.show_error, f"{type(e).__name__}: {e}")
            return
        self.app.call_from_thread(self.show_rows, rows)

    def is_current(self, row: ModelRow) -> bool:
        name, path = self.current
        return row.name == name or (bool(path) and row.path == path)

    def show_rows(self, rows: list[ModelRow]) -> None:
        if not self.is_mounted:  # closed before the disk was read
            return
        self.rows = rows
        options = self.query_one(OptionList)
        options.clear_options()
        if not rows:
            options.add_option(Option("No models found: `mlotspark pull` fetches one", disabled=True))
            return
        width = max(len(r.name) for r in rows)
        options.add_options([Option(row_text(r, width, self.is_current(r)), id=str(i)) for i, r in enumerate(rows)])
        current = next((i for i, r in enumerate(rows) if self.is_current(r)), 0)
        options.highlighted = current

    def show_error(self, error: str) -> None:
        if not self.is_mounted:
            return
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_option(Option(f"Could not read the models: {error}", disabled=True))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.dismiss(self.rows[int(event.option.id)].name)

    def action_close(self) -> None:
        self.dismiss(None)


__all__ = ["HINT", "ModelPicker", "row_text"]
