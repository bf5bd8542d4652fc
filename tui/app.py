"""``ChatApp``: the ``mlotspark chat`` terminal UI.

Layout: the conversation list (left), the chat of the open conversation and the
input (middle), the side panel of live figures (right). The model loads in a
worker thread while the screen shows its progress; each reply streams in its own
worker thread, which posts the pieces back as messages (``messages.py``), so keys,
scrolling and switching conversations keep working while a reply streams. Every
error from the engine becomes a notification; none ends the app.

Conversation list actions (open, new, rename, delete) are in ``conversations.py``,
slash commands in ``slash.py``, the side panel's polling in ``panel_figures.py``, tool calls
shown and MCP tools run in ``mcp_turns.py``; all are mixins of ``ChatApp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Callable, Iterator

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import ContentSwitcher, Footer, Header, ProgressBar, Static

from mlotspark import MlotsparkError, ReasoningPiece

from tui import backend
from tui.conversations import ConversationActions
from tui.logs import NotifyHandler, PlainNotices
from tui.mcp_turns import McpTurns
from tui.messages import (
    EngineFailed, EngineLoaded, EngineWarning, ReplyFailed, ReplyFinished, ReplyPiece, ReplyThinking, ReplyToolCall, Turn,
)
from tui.panel_figures import PanelFigures
from tui.screens import HelpScreen
from tui.slash import SlashCommands
from tui.tools import ReplySplitter, ToolSpec, tool_support
from tui.widgets import ChatLog, ConversationList, PromptInput, StatsPanel

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often the side panel reads the scheduler
QUIT_WAIT_S = 30.0  # how long quitting waits for stopped turns to be stored (a 2,048-token prefill chunk)


TEXT_COMMANDS = ("/remember", "/system")  # their argument is text the user wrote, kept when refused


class ChatApp(PlainNotices, ConversationActions, SlashCommands, PanelFigures, McpTurns, App[None]):
    """Chat with a model; see the module docstring.

    Args:
        engine: a loaded engine to use (the caller closes it); None = load ``model``.
        model: the model to load when ``engine`` is None (None = the default model).
        conversation: conversation to open (created if new); None = the newest one.
        options: sampling settings to start the session with (``temperature`` ...).
        loader: loads the engine (``backend.load_engine``; tests swap it).
        memory_probe: bytes of memory in use (default: this process's RSS).
        poll_s: seconds between reads of the scheduler for the side panel.
        tools: tools to give the model (``--tools FILE``); its calls are shown, never run.
        mcp: a started ``McpHub`` (``--mcp FILE``): calls of its tools are run once the user
            says so, and their results fed back (``mcp_turns.py``; ``tools`` holds them too).
        model_lister: the models the picker offers (``backend.list_models``; tests swap it).
    """

    CSS_PATH = "chat.tcss"
    TITLE = "mlotspark"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("escape", "cancel_reply", "Stop reply"),
        # Early in the footer: an 80-column terminal cuts off its end, and F4 is the key that width needs.
        Binding("f4", "toggle_stats", "Panel"),
        Binding("ctrl+n", "new_conversation", "New chat", priority=True),
        Binding("f1", "help", "Help", priority=True),
        Binding("f3", "models", "Model", priority=True),
        Binding("f2", "rename", "Rename"),
        Binding("f8", "delete", "Delete"),
        Binding("f9", "undo_delete", "Undo delete", show=False),
        Binding("f6", "toggle_thinking", "Thinking", show=False, priority=True),
    ]
    # The list (28 cells) and the side panel (38) leave the chat 12 cells in an 80-column
    # terminal: under 110 columns the side panel is shown only on F4 (in the list's place), under
    # 70 the list is hidden too (chat.tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-tiny"), (70, "-narrow"), (110, "-wide")]

    def __init__(
        self,
        engine: Any = None,
        *,
        model: str | None = None,
        conversation: str | None = None,
        options: dict | None = None,
        loader: Callable[[str | None], Any] = backend.load_engine,
        memory_probe: Callable[[], int | None] = backend.process_memory,
        poll_s: float = POLL_S,
        tools: ToolSpec | None = None,
        model_lister: Callable[[], list[backend.ModelRow]] = backend.list_models,
        mcp: Any = None,
    ) -> None:
        super().__init__()
        self.engine = engine
        self.owns_engine = engine is None
        self.model = model
        self.requested = conversation
        self.overrides: dict[str, Any] = dict(options or {})
        self.loader = loader
        self.memory_probe = memory_probe
        self.poll_s = poll_s
        self.tools = tools
        self.mcp = mcp
        self.tool_fmt: Any = None  # the open model's tool-call format (None: no tool support)
        self.model_lister = model_lister
        self.current: str | None = None
        self.logs: dict[str, ChatLog] = {}
        self.turns: dict[str, Turn] = {}
        self.figures: dict[str, backend.TurnFigures] = {}
        self.tiers_stale = True  # tier figures to read at the next poll
        self.collecting = False  # a figures worker is running
        self.loading_since: float | None = None
        self.trash: dict[str, Any] = {}  # deleted this session, files kept for undo (conversations.py)
        self._log_ids = 0
        self.log_handler = NotifyHandler(self)

    # ----------------------------------------------------------------- layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            with Vertical(id="sidebar"):
                yield Static("Conversations", classes="panel-title")
                yield ConversationList(id="conversations")
            with Vertical(id="center"):
                with ContentSwitcher(id="logs", initial="loading"):
                    with Vertical(id="loading"):
                        yield Static("Loading the model …", id="loading-text")
                        yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="loading-bar")
                yield PromptInput(id="prompt", show_line_numbers=False, soft_wrap=True)
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.log_handler.install()
        self.query_one(PromptInput).focus()
        self.set_interval(self.poll_s, self.poll)
        if self.engine is not None:
            self.call_later(self.engine_ready, self.engine)
        else:
            self.start_loading(self.model)

    def action_toggle_stats(self) -> None:
        """F4: the side panel in a terminal too narrow to show it beside the chat (in the list's
        place), or back to the list; a wide one shows both and ignores it."""
        self.screen.toggle_class("-show-stats")

    @property
    def chat(self) -> ChatLog | None:
        """The chat of the open conversation."""
        return self.logs.get(self.current) if self.current else None

    @property
    def panel(self) -> StatsPanel:
        return self.query_one(StatsPanel)

    @property
    def shutting_down(self) -> bool:
        """True once the app is ending: worker messages still arrive, widgets may be gone."""
        if getattr(self, "_exit", False) or not self.is_running:
            return True
        try:
            return not self.query(StatsPanel)
        except Exception:  # noqa: BLE001  no screen left
            return True

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Turn an error from the engine into a notification (never a traceback)."""
        try:
            yield
        except MlotsparkError as e:
            self.notify(str(e), title=what, severity="error")
        except Exception as e:  # noqa: BLE001  the app must not die on an engine bug
            log.exception("%s failed", what)
            self.notify(f"{type(e).__name__}: {e}", title=what, severity="error")

    # ---------------------------------------------------------------- loading
    def start_loading(self, model: str | None) -> None:
        """Load ``model`` in a worker; the loading panel shows how long it has taken."""
        self.loading_since = time.monotonic()
        name = model or "the default model"
        self.query_one("#loading-text", Static).update(f"Loading {name} …")
        self.query_one("#logs", ContentSwitcher).current = "loading"
        self.sub_title = f"loading {name}"
        self.load_engine(model)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_engine(self, model: str | None) -> None:
        started = time.monotonic()
        try:
            engine = self.loader(model)
        except MlotsparkError as e:
            self.post_message(EngineFailed(str(e)))
        except Exception as e:  # noqa: BLE001
            log.exception("loading %s failed", model)
            self.post_message(EngineFailed(f"{type(e).__name__}: {e}"))
        else:
            self.post_message(EngineLoaded(engine, time.monotonic() - started))

    async def on_engine_loaded(self, message: EngineLoaded) -> None:
        if self.shutting_down:  # loaded as the app quit: nobody else will close it
            with contextlib.suppress(Exception):
                message.engine.close()
            return
        old, self.loading_since = (self.engine if self.owns_engine else None), None
        self.owns_engine = True
        await self.engine_ready(message.engine)
        self.notify(f"{backend.model_name(message.engine)} loaded in {message.seconds:.1f} s")
        if old is not None and old is not message.engine:
            self.run_worker(old.close, thread=True, group="close", exit_on_error=False)

    async def on_engine_failed(self, message: EngineFailed) -> None:
        if self.shutting_down:
            return
        self.loading_since = None
        self.notify(message.error, title="Could not load the model", severity="error", timeout=30)
        if self.engine is not None:  # a /model that failed: keep the model we had
            await self.open(self.current or "")
            return
        self.query_one("#loading-text", Static).update(f"Could not load the model: {message.error}")
        self.query_one("#loading-bar").display = False
        self.sub_title = "no model"

    async def engine_ready(self, engine: Any) -> None:
        self.engine = engine
        with self.guard("Settings"):
            engine.defaults.merged(**self.overrides)
        self.tool_fmt = None
        with self.guard("Tools"):
            self.tool_fmt = tool_support(engine)
        self.refresh_settings()
        self.sub_title = backend.model_name(engine)
        self.tiers_stale = True
        with self.guard("Conversations"):
            names = [r.name for r in backend.list_conversations(engine)]
            name = self.current or self.requested or (names[0] if names else None)
            if name is not None and name not in names:
                with self.guard(f"Conversation {name!r}"):
                    backend.create_conversation(engine, name)
                    names.append(name)
            if name is None or name not in names:  # none yet, or the name was refused
                name = backend.next_name(names)
                backend.create_conversation(engine, name)
            await self.open(name)
        if self.tools is not None:
            mcp = self.mcp is not None and self.tool_fmt is not None
            await self.say(self.mcp_notice() if mcp else self.tools_notice(), error=self.tool_fmt is None)
        self.poll()

    def refresh_settings(self) -> None:
        if self.engine is None:
            return
        try:
            opts = backend.default_options(self.engine)
            opts.update(self.overrides)
        except MlotsparkError:
            opts = dict(self.overrides)
        self.panel.settings = opts
        sources = backend.sampling_sources(self.engine)
        sources.update(dict.fromkeys(self.overrides, "this session"))
        self.panel.sources = sources
        self.panel.refresh_figures()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    # ------------------------------------------------------------------ turns
    async def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.text
        if text.startswith("/") and len(text) > 1 and text[1].isalpha():
            event.input.clear()
            refused = not await self.run_command(text)
            word, *written = text.split(maxsplit=1)
            if refused and written and word.lower() in TEXT_COMMANDS and not event.input.text:
                event.input.insert(text)  # composed text comes back to mend (a 6,000-character /remember had gone)
            return
        if self.engine is None or self.chat is None or self.loading_since is not None:
            self.notify("The model is still loading.", severity="warning")
            return
        if self.busy("send a message"):
            return
        event.input.clear()
        await self.send(text)

    async def send(self, text: str) -> None:
        """Start a turn in the open conversation: the reply streams from a worker thread."""
        chat, name = self.chat, self.current
        assert chat is not None and name is not None
        await chat.add_user(text)
        await chat.start_reply()
        turn = self.turns[name] = Turn(name, started=time.monotonic())
        panel = self.panel
        panel.streaming, panel.live_tps, panel.live_ttft = True, None, None
        panel.refresh_figures()
        options, fmt = self.turn_options(), self.split_format()
        self.run_worker(
            lambda: self.stream_turn(self.engine, turn, text, options, fmt),
            thread=True, group="turns", name=f"turn {name}", exit_on_error=False,
        )
        await self.refresh_list()

    def stream_turn(self, engine: Any, turn: Turn, text: str, options: dict, fmt: Any = None) -> None:
        """[worker thread] Run one turn, posting its pieces, its tool calls and its end to the app.

        ``fmt``: the model's tool-call format; calls in the reply are split from its text
        (``tools.ReplySplitter``) and posted as calls, never as markup. A reasoning model's
        thinking (``ReasoningPiece``) is posted apart, for its folded block.
        """
        name, stats = turn.conversation, None
        names = [t["function"]["name"] for t in options.get("tools") or ()]
        runnable = {t.name for t in self.mcp.tools} if self.mcp is not None else set()
        message, role, ran = text, "user", 0
        try:
            conv = engine.conversation(name)
            turn.conv = conv
            while True:  # with MCP tools: a turn per round of tool results fed back
                splitter, calls = ReplySplitter(fmt, names), []
                stream = conv.stream(message, **({"role": role} if role != "user" else {}), **options)
                for item in stream:
                    if not isinstance(item, (str, ReasoningPiece)):
                        stats = item
                        continue
                    if turn.first_piece is None:
                        turn.first_piece = time.monotonic()
                    turn.pieces += 1  # thinking is decoded all the same: the live tok/s counts it
                    turn.reading_tools = False
                    if isinstance(item, ReasoningPiece):  # shown folded, apart from the reply
                        self.post_message(ReplyThinking(name, item.text))
                    else:
                        calls += self.post_pieces(name, *splitter.feed(item), runnable & set(names), conv)
                    # Escape may come before the request exists: ask again until it ends.
                    if turn.cancel_requested and not backend.cancel_turn(conv):
                        stream.close()  # no cancel in this API: stop reading, the turn ends
                        break
                calls += self.post_pieces(name, *splitter.close(), runnable & set(names), conv)
                calls = [c for c in calls if c.name in runnable and c.name in names]
                if not calls or turn.cancel_requested:  # past the bound no tools are given: the loop ends
                    break
                message, ran, options = self.run_tools(turn, calls, ran, options)
                if message is None:  # stopped while asking: the results are kept, no reply reads them
                    break
                role, names = "tool", [t["function"]["name"] for t in options.get("tools") or ()]
        except MlotsparkError as e:
            self.post_message(ReplyFailed(name, str(e)))
            return
        except Exception as e:  # noqa: BLE001
            log.exception("turn in %r failed", name)
            self.post_message(ReplyFailed(name, f"{type(e).__name__}: {e}"))
            return
        self.post_message(ReplyFinished(name, stats))

    def post_pieces(self, name: str, text: str, calls: list, runs: set = frozenset(), conv: Any = None) -> list:
        """Post a reply's text and calls (``runs``: the MCP tools given this round; ``conv``: the
        conversation, whose standing answers about them the call blocks say); returns the calls."""
        if text:
            self.post_message(ReplyPiece(name, text))
        standing = conv.tool_approvals if calls and runs and conv is not None else {}
        for call in calls:
            self.post_message(ReplyToolCall(name, call, call.name in runs, standing.get(call.name)))
        return list(calls)

    async def on_reply_thinking(self, message: ReplyThinking) -> None:
        if self.shutting_down:
            return
        chat = self.logs.get(message.conversation)
        if chat is not None and chat.reply is not None:
            await chat.reply.add_thinking(message.text)
        self.show_ttft(message.conversation)

    def action_toggle_thinking(self) -> None:
        """Open or fold the thinking of the open conversation's latest reply that has one."""
        chat = self.chat
        block = next((r.thinking for r in reversed(chat.replies) if r.thinking is not None), None) if chat else None
        if block is not None:
            block.collapsed = not block.collapsed
        else:
            self.notify("F6 opens a reply's thinking: no reply here has any (a reasoning model's replies do).")

    async def on_reply_piece(self, message: ReplyPiece) -> None:
        if self.shutting_down:
            return
        chat = self.logs.get(message.conversation)
        if chat is not None and chat.reply is not None:
            await chat.reply.append(message.text)
        self.show_ttft(message.conversation)

    def show_ttft(self, name: str) -> None:
        """The live TTFT once the open conversation's reply has its first piece (text or call)."""
        turn = self.turns.get(name)
        if name == self.current and turn and turn.first_piece and self.panel.live_ttft is None:
            self.panel.live_ttft = turn.first_piece - turn.started
            self.panel.refresh_figures()

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        if self.shutting_down:
            return
        name, stats = message.conversation, message.stats
        turn = self.turns.pop(name, None)
        reason = getattr(stats, "finish_reason", None) or ("cancelled" if turn and turn.cancel_requested else "stop")
        chat = self.logs.get(name)
        if chat is not None and chat.reply is not None:
            await chat.reply.finish(reason)
            chat.reply = None
        if stats is not None and self.engine is not None:
            self.figures[name] = figures = backend.turn_figures(self.engine, stats)
            if figures.decode_tps:
                self.panel.add_sample(figures.decode_tps)
        if name == self.current:
            panel = self.panel
            panel.turn = self.figures.get(name, backend.TurnFigures())
            panel.streaming = False
            panel.refresh_figures()
        self.tiers_stale = True
        self.poll()  # the turn's tier figures now, not at the next tick
        await self.refresh_list()

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        if self.shutting_down:
            return
        self.turns.pop(message.conversation, None)
        chat = self.logs.get(message.conversation)
        if chat is not None and chat.reply is not None:
            await chat.reply.finish(None, error=message.error)
            chat.reply = None
        if message.conversation == self.current:
            self.panel.streaming = False
            self.panel.refresh_figures()
        self.notify(message.error, title="The reply failed", severity="error")
        await self.refresh_list()

    def action_cancel_reply(self) -> None:
        """Escape: stop the open conversation's reply (what came so far is kept)."""
        turn = self.turns.get(self.current or "")
        if turn is None:
            return
        turn.cancel_requested = True
        if turn.conv is not None:
            with self.guard("Stop"):
                backend.cancel_turn(turn.conv)

    def on_engine_warning(self, message: EngineWarning) -> None:
        if self.shutting_down:
            return
        self.notify(message.text, severity="error" if message.error else "warning", timeout=10)

    # -------------------------------------------------------------- quitting
    def on_unmount(self) -> None:
        self.log_handler.uninstall()

    async def action_quit(self) -> None:
        self.purge()  # deletions the user confirmed: their undo time ends with the app
        for turn in list(self.turns.values()):
            turn.cancel_requested = True
            if turn.conv is not None:
                with contextlib.suppress(Exception):
                    backend.cancel_turn(turn.conv)
        # A stopped turn stores the user's message (a pasted document, say) and the cut reply
        # as Escape does; exiting at once closed the engine first and lost them. The engine
        # stops a prefill at its next chunk: wait that long, not forever.
        running = [w for w in self.workers if w.group == "turns" and w.is_running]
        if running:
            self.notify("Stopping the reply to keep the conversation…", timeout=QUIT_WAIT_S)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*(w.wait() for w in running)), QUIT_WAIT_S)
        self.exit()

    def close_engine(self) -> None:
        """Close the engine if this app loaded it (the caller closes one it passed in)."""
        if self.owns_engine and self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.close()
            self.engine = None


__all__ = ["ChatApp", "Turn"]
