"""Modal screens: help (F1), a one-line text prompt (rename), a yes/no question (delete)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from tui.commands import help_rows

KEYS = [
    ("Enter", "send the message"),
    ("Ctrl+J, Alt+Enter", "new line (Shift+Enter too, where the terminal sends it)"),
    ("Escape", "stop the reply; the partial reply is kept and marked"),
    ("Ctrl+N", "new conversation"),
    ("F3", "pick a model (/model)"),
    ("F2", "rename the conversation (the highlighted one when the list has focus)"),
    ("F8", "delete the conversation (the highlighted one when the list has focus)"),
    ("F9", "bring back the conversation deleted last (for a few seconds)"),
    ("F4", "side panel, under 110 columns"),
    ("F6", "open or fold the reply's thinking (a reasoning model's)"),
    ("Tab, Shift+Tab", "move between the list, the chat and the input"),
    ("Enter (list)", "open the highlighted conversation"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
]
NOTE = ("Settings last for this session. A reply keeps streaming while you scroll, switch "
        "conversations or start another one. Escape, F1 or q closes this help.")


def _table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, title_style="bold", title_justify="left", box=None, show_header=False,
                  padding=(0, 1), expand=True)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1)
    for left, right in rows:
        table.add_row(left, right)
    return table


class HelpScreen(ModalScreen[None]):
    """Keys and slash commands."""

    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("f1", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):  # scrolls (arrows, PageUp/PageDown) when the terminal is short
            yield Static("mlotspark chat — keys and commands", id="help-title")
            with Horizontal(id="help-columns"):
                yield Static(_table("Keys", KEYS), id="help-keys")
                yield Static(_table("Commands", [(u, v) for u, v in help_rows()]), id="help-commands")
            yield Static(NOTE, id="help-note")

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(result)


class TextPrompt(ModalScreen[str | None]):
    """Ask for one line of text; Enter returns it, Escape returns None.

    Args:
        title: the question.
        value: the text to start from.
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(self.title_text), classes="dialog-title")  # a title may hold [markup]
            yield Input(self.value, id="prompt-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """A yes/no question; y / Enter on Yes confirms, n / Escape declines."""

    BINDINGS = [
        Binding("escape", "answer(False)", "No"),
        Binding("n", "answer(False)", "No", show=False),
        Binding("y", "answer(True)", "Yes", show=False),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(self.question), classes="dialog-title")  # a title may hold [markup]
            with Horizontal(classes="buttons"):
                yield Button("Yes", id="yes", variant="error")
                yield Button("No", id="no", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ToolApproval(ModalScreen[str | None]):
    """May this MCP tool run? ``once`` (o), ``always`` for this tool in this conversation (a),
    ``never`` in this conversation (n); Escape dismisses it: this call does not run, and
    nothing is kept (None)."""

    BINDINGS = [
        Binding("escape", "dismiss_unanswered", "Not now"),
        Binding("n", "answer('never')", "Never", show=False),
        Binding("o", "answer('once')", "Once", show=False),
        Binding("a", "answer('always')", "Always", show=False),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(self.question), classes="dialog-title")  # arguments may hold [markup]
            with Horizontal(classes="buttons"):
                yield Button("Once (o)", id="once", variant="primary")
                yield Button("Always (a)", id="always", variant="warning")
                yield Button("Never (n)", id="never", variant="error")

    def on_mount(self) -> None:
        self.query_one("#once", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(str(event.button.id))

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)

    def action_dismiss_unanswered(self) -> None:
        self.dismiss(None)


__all__ = ["Confirm", "HelpScreen", "KEYS", "TextPrompt", "ToolApproval"]
