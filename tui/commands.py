"""Slash commands: parsing and checking what the user typed, before anything runs.

``parse("/temp 0.2")`` gives a ``Command``; the app (``app.py``) carries it out. Values
of sampling settings are converted here and validated by the engine
(``engine.defaults.merged(**overrides)``), so the TUI accepts exactly what the API accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


class CommandError(ValueError):
    """What the user typed is not a command we can run; the message says why."""


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not an integer") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a number") from None


# command -> (option name, converter, what it means)
SETTINGS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "temp": ("temperature", _number, "sampling temperature, 0 = greedy"),
    "top_k": ("top_k", _integer, "keep the k most likely tokens, 0 = off"),
    "top_p": ("top_p", _number, "nucleus sampling, in (0, 1]"),
    "min_p": ("min_p", _number, "drop tokens below min_p x the top one, in [0, 1)"),
    "max_tokens": ("max_tokens", _integer, "most tokens in a reply"),
    "repeat_penalty": ("repetition_penalty", _number, "> 0, 1 = off"),
}

# command -> (argument, what it does); the order /help lists them in.
ACTIONS: dict[str, tuple[str, str]] = {
    "system": ("[TEXT]", "show or set this conversation's system prompt"),
    "reset": ("", "clear this conversation's messages"),
    "remember": ("TEXT", "add TEXT to the semantic memory"),
    "forget": ("ID", "delete memory entry ID"),
    "memory": ("[QUERY|on|off]", "list memory entries, search them, or switch memory on/off for this chat"),
    "model": ("[MODEL]", "pick a model (F3), or open MODEL"),
    "tools": ("[FILE|off]", "tools from an OpenAI JSON file (calls shown, not run)"),
    "new": ("", "start a new conversation (Ctrl+N)"),
    "rename": ("TITLE", "rename this conversation (F2)"),
    "delete": ("", "delete this conversation (F8)"),
    "undo": ("", "bring back the conversation deleted last (F9, for a few seconds)"),
    "help": ("", "keys and commands (F1)"),
}

# Commands whose argument is mandatory.
NEEDS_ARGUMENT = {"remember", "forget", "rename", *SETTINGS}


@dataclass(frozen=True)
class Command:
    """A parsed slash command.

    Attributes:
        name: the command without its slash (``temp``, ``system`` ...).
        argument: the rest of the line, stripped ("" when none).
        option: for a setting, the generation option it changes (``temperature``).
        value: for a setting, the converted value (not yet validated by the engine).
    """

    name: str
    argument: str = ""
    option: str | None = None
    value: Any = None


def is_command(text: str) -> bool:
    """True if ``text`` is meant as a command (starts with one slash and a letter)."""
    return text.startswith("/") and len(text) > 1 and text[1].isalpha()


def parse(text: str) -> Command:
    """Parse one slash command line.

    Args:
        text: what the user typed, e.g. ``"/temp 0.2"`` or ``"/system Be brief."``.

    Returns:
        The ``Command``.

    Raises:
        CommandError: an unknown command, a missing argument or a value that is not
            a number where one is needed.
    """
    head, _, rest = text.strip().partition(" ")
    name = head[1:].lower().replace("-", "_")
    argument = rest.strip()
    if name == "temperature":
        name = "temp"
    if name not in SETTINGS and name not in ACTIONS:
        raise CommandError(f"unknown command /{name} (type /help for the list)")
    if name in NEEDS_ARGUMENT and not argument:
        what = SETTINGS[name][2] if name in SETTINGS else ACTIONS[name][1]
        raise CommandError(f"/{name} needs a value: {what}")
    if name in SETTINGS:
        option, convert, _ = SETTINGS[name]
        if " " in argument:
            raise CommandError(f"/{name} takes one value, got {argument!r}")
        return Command(name, argument, option, _value(name, convert, argument))
    if name == "forget":  # "#3" as /memory shows ids, or 3; ids start at 1
        value = _value(name, _integer, argument.removeprefix("#"))
        if value < 1:
            raise CommandError(f"/forget: memory ids start at 1, got {argument!r}")
        return Command(name, argument, value=value)
    return Command(name, argument)


def _value(name: str, convert: Callable[[str], Any], argument: str) -> Any:
    try:
        return convert(argument)
    except CommandError as e:  # "/temp: 'hot' is not a number": every message names its command
        raise CommandError(f"/{name}: {e}") from None


def slash_name(option: str) -> str:
    """How the TUI names a generation option in messages: its command (``/temp``), else the option."""
    return next((f"/{cmd}" for cmd, (name, _, _) in SETTINGS.items() if name == option), option)


def help_rows() -> list[tuple[str, str]]:
    """(usage, what it does) for every command, for the help screen."""
    rows = [(f"/{name} VALUE", meaning) for name, (_, _, meaning) in SETTINGS.items()]
    rows += [(f"/{name} {arg}".rstrip(), what) for name, (arg, what) in ACTIONS.items()]
    return rows


__all__ = ["ACTIONS", "Command", "CommandError", "SETTINGS", "help_rows", "slash_name", "is_command", "parse"]
