"""``SlashCommands``: what ``/temp``, ``/system``, ``/memory`` ... do in the app.

A mixin of ``ChatApp``: parsing lives in ``commands.py``; here each command acts on
the engine's public API and answers with a note in the chat. A bad value gets an
error note (and nothing changes); it never ends the app.
"""

from __future__ import annotations

from typing import Any

from mlotspark import MlotsparkError, OptionError

from tui import backend
from tui.commands import Command, CommandError, parse, slash_name
from tui.picker import ModelPicker
from tui.tools import load_tools, split_reply, stored_format


MEMORY_LIST = 20  # entries /memory shows


def _replaced(entry: Any, store: Any) -> str:
    """`` (superseded by #N)`` for an entry a newer one replaced, else ""; one whose successor was
    forgotten since says so, as ``memory list`` does (it had named an id /forget no longer knew)."""
    newer = getattr(entry, "superseded_by", None)
    if not newer:
        return ""
    return f"  (superseded by #{newer})" if store.get(newer) is not None else "  (superseded by an entry forgotten since)"


def _one_line(text: str) -> str:
    return " ⏎ ".join(text.splitlines())  # an entry told over lines: one row, as `memory list` shows it


class SlashCommands:
    """Slash command handlers, mixed into ``ChatApp``."""

    async def say(self, text: str, error: bool = False) -> None:
        """Answer in the open chat (or as a notification before one is open)."""
        if self.chat is not None:
            await self.chat.add_note(text, error=error)
        if error or self.chat is None:
            self.notify(text, severity="error" if error else "information")

    async def run_command(self, text: str) -> bool:
        """Parse and run one slash command line; False when it was refused (the message says why)."""
        try:
            cmd = parse(text)
        except CommandError as e:
            await self.say(str(e), error=True)
            return False
        if cmd.name == "help":
            self.action_help()
            return True
        if self.engine is None:
            await self.say(f"/{cmd.name}: the model is still loading", error=True)
            return False
        handler = getattr(self, f"command_{cmd.name}", None) if cmd.option is None else self.command_setting
        try:
            await handler(cmd)
        except OptionError as e:  # named as the user types them here (/temp, not temperature)
            message = e.render(slash_name)  # "invalid /top_p 5.0: ..." names the command already
            await self.say(message if f"/{cmd.name}" in message else f"/{cmd.name}: {message}", error=True)
        except MlotsparkError as e:
            await self.say(f"/{cmd.name}: {e}", error=True)
        except Exception as e:  # noqa: BLE001  a command must never end the app
            await self.say(f"/{cmd.name} failed: {type(e).__name__}: {e}", error=True)
        else:
            return True
        return False

    # -- settings ---------------------------------------------------------------------
    async def command_setting(self, cmd: Command) -> None:
        assert cmd.option is not None
        trial = {**self.overrides, cmd.option: cmd.value}
        self.engine.defaults.merged(**trial)  # raises OptionError naming the bad value
        self.overrides = trial
        self.refresh_settings()
        await self.say(f"{cmd.option} = {cmd.value}")

    # -- this conversation ------------------------------------------------------------
    async def command_system(self, cmd: Command) -> None:
        conv = self.engine.conversation(self.current)
        if not cmd.argument:
            await self.say(f"system prompt: {conv.system or '(the model’s default)'}")
            return
        if self.busy("change the system prompt"):
            return
        conv.system = cmd.argument
        await self.say(f"system prompt set: {cmd.argument}")

    async def command_reset(self, cmd: Command) -> None:
        if self.busy("reset the conversation"):
            return
        self.engine.conversation(self.current).reset()
        if self.chat is not None:
            await self.chat.clear()
        self.figures.pop(self.current, None)
        self.tiers_stale = True
        await self.refresh_list()
        await self.say("conversation cleared")

    async def command_new(self, cmd: Command) -> None:
        await self.action_new_conversation()

    async def command_rename(self, cmd: Command) -> None:
        await self.rename(cmd.argument)

    async def command_delete(self, cmd: Command) -> None:
        self.action_delete()

    async def command_undo(self, cmd: Command) -> None:
        await self.action_undo_delete()

    # -- semantic memory --------------------------------------------------------------
    async def command_remember(self, cmd: Command) -> None:
        store = self.engine.memory
        told = store.tell(cmd.argument)
        self.tiers_stale = True
        if told.new:
            lines = [f"remembered #{told.id}: {cmd.argument.strip()}"]
        else:  # a duplicate: the entry it matched
            known = store.get(told.id)
            lines = [f"already remembered as #{told.id}: {known.text if known else cmd.argument.strip()}"
                     + ("  [current again]" if told.current_again else _replaced(known, store))]
        lines += [f"  supersedes #{old.id}: {old.text}" for old in filter(None, map(store.get, told.superseded))]
        await self.say("\n".join(lines))

    async def command_forget(self, cmd: Command) -> None:
        older = self.engine.memory.superseded_by(cmd.value)  # forgetting an update undoes it
        if self.engine.memory.forget(cmd.value):
            self.tiers_stale = True
            back = [f"  #{o.id} is current again: {o.text}" for o in older]
            await self.say("\n".join([f"forgot #{cmd.value}", *back]))
        else:
            await self.say(f"/forget: no memory entry #{cmd.value}", error=True)

    async def command_memory(self, cmd: Command) -> None:
        if cmd.argument.strip().lower() in ("on", "off"):  # this conversation's switch, kept with it
            on = cmd.argument.strip().lower() == "on"
            self.engine.conversation(self.current).memory = on
            await self.say("memory on for this conversation" if on else
                           "memory off for this conversation: nothing is recalled into it or learned from it")
            return
        store = self.engine.memory
        if cmd.argument:
            # The top hits with their scores, no floor (as `mlotspark memory search`).
            hits = store.search(cmd.argument, k=10, threshold=0.0)
            lines = [f"#{h.entry.id}  {h.score:.2f}  {_one_line(h.entry.text)}" for h in hits]
            head = f"memory matching {cmd.argument!r}:"
        else:
            entries = store.list(limit=MEMORY_LIST, current_only=True)
            lines = [f"#{e.id}  {_one_line(e.text)}{_replaced(e, store)}" for e in entries]
            head = f"memory ({len(store)} entr{'y' if len(store) == 1 else 'ies'}):"
        await self.say("\n".join([head, *lines]) if lines else f"{head} (nothing)")

    # -- the model --------------------------------------------------------------------
    async def command_model(self, cmd: Command) -> None:
        if not cmd.argument:
            self.action_models()
            return
        await self.switch_model(cmd.argument)

    def action_models(self) -> None:
        """F3 / ``/model``: the model picker; the chosen model replaces the open one."""
        if isinstance(self.screen, ModelPicker):  # F3 again closes it
            self.screen.dismiss(None)
            return
        if self.engine is None:
            return
        facts = backend.model_facts(self.engine)
        keys = (("model", "{}"), ("weights", "{}"), ("weights_mb", "{} MB"), ("context_length", "context {}"),
                ("device", "{}"))
        line = "open now: " + " · ".join(f.format(facts[k]) for k, f in keys if facts.get(k) is not None)
        current = (backend.model_name(self.engine), str(facts.get("model_path") or ""))
        self.push_screen(ModelPicker(self.model_lister, current, line), self.picked)

    async def picked(self, name: str | None) -> None:
        if name:
            await self.switch_model(name)

    async def switch_model(self, name: str) -> None:
        """Load ``name`` off the UI thread with its progress shown; the old engine is closed
        once the new one is ready, and kept if loading fails (``app.on_engine_failed``)."""
        if self.turns or self.loading_since is not None:
            await self.say("/model: wait for the replies in progress (Escape stops them) or the model loading",
                           error=True)
            return
        if self.engine is not None and name == backend.model_name(self.engine):
            await self.say(f"{name} is open already")
            return
        self.model = name
        self.start_loading(name)

    # -- tools ------------------------------------------------------------------------
    def turn_options(self) -> dict:
        """This session's options for a turn: the settings, and the tools where the model takes them."""
        options = dict(self.overrides)
        if self.tools is not None and self.tool_fmt is not None:
            options.update(self.tools.options())
        return options

    def split_format(self) -> Any:
        """The tool format replies are split by: a format with an opener (``<tool_call>``)
        always, so no markup ever shows; one whose whole reply is the call only with tools."""
        fmt = self.tool_fmt
        if fmt is None or (not fmt.opener and self.tools is None):
            return None
        return fmt

    def split_stored(self, text: str) -> tuple[str, list]:
        """A stored reply as shown: its text, and its tool calls as blocks."""
        try:
            names = self.tools.names if self.tools is not None else None
            return split_reply(stored_format(self.split_format(), text), text, names)
        except Exception:  # noqa: BLE001  a reply that cannot be split is shown as written
            return text, []

    def tools_notice(self) -> str:
        """One line: whether the open model gets the tools (its template may have no tool support)."""
        name = backend.model_name(self.engine) if self.engine is not None else "the model"
        if self.tools is not None and self.tool_fmt is not None:
            return f"tools: {', '.join(self.tools.names)} given to {name}; its calls are shown, not run"
        return (f"tools: {name} has no tool support in its chat template, so the tools are not sent to it "
                "(F3 opens another model)")

    async def command_tools(self, cmd: Command) -> None:
        arg = cmd.argument
        if not arg:
            if self.tools is None:
                await self.say("no tools (give some with /tools FILE: an OpenAI tools JSON file)")
                return
            await self.say(f"tools from {self.tools.source}: {', '.join(self.tools.names)} "
                           f"(tool_choice {self.tools.choice}); calls are shown, not run")
            if self.tool_fmt is None:
                await self.say(self.tools_notice(), error=True)
            return
        if arg.lower() == "off":
            self.tools = None
            await self.say("tools off")
            return
        spec = load_tools(arg)
        self.engine.defaults.merged(**self.overrides, **spec.options())  # raises OptionError naming the bad part
        self.tools = spec
        await self.say(f"tools: {', '.join(spec.names)} from {spec.source}; calls are shown, not run")
        if self.tool_fmt is None:
            await self.say(self.tools_notice(), error=True)


__all__ = ["SlashCommands"]
