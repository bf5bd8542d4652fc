"""Mlotspark's logged warnings, shown in the app, and the app's notifications as plain text.

While a Textual app runs, stderr is captured, so a warning mlotspark logs (a
snapshot refused, the memory store unusable) would be lost; this handler posts
each one to the app, which shows it as a notification.
"""

from __future__ import annotations

import logging

from textual.app import App

from tui.messages import EngineWarning


class NotifyHandler(logging.Handler):
    """Posts mlotspark's warnings (and Python warnings) to ``app`` as ``EngineWarning``."""

    LOGGERS = ("mlotspark", "py.warnings")

    def __init__(self, app: App) -> None:
        super().__init__(logging.WARNING)
        self.app = app

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001
            return
        if record.name == "py.warnings":  # "path:line: SomeWarning: text\n  source line"
            text = text.split("Warning: ", 1)[-1].splitlines()[0]
        self.app.post_message(EngineWarning(text, record.levelno >= logging.ERROR))

    def install(self) -> None:
        logging.captureWarnings(True)
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)

    def uninstall(self) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)
        logging.captureWarnings(False)


class PlainNotices:
    """A ``ChatApp`` part: notifications are plain text. They carry what the user typed (a
    title, a bad value, a path) and model output; read as Textual markup, a ``[/INST]`` in
    them ended the app with a ``MarkupError``."""

    def notify(self, message: str, *, markup: bool = False, **kw: object) -> None:
        super().notify(message, markup=markup, **kw)  # type: ignore[misc]


__all__ = ["NotifyHandler", "PlainNotices"]
