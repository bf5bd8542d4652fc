"""``PanelFigures``: the side panel's figures kept current while the app runs.

A mixin of ``ChatApp``: every ``poll_s`` it reads the streaming reply's live tok/s and
a long prompt's prefill progress, and a worker thread reads the scheduler's (and the
tiers') figures, which may wait on the engine; they come back as ``FiguresReady``.
"""

from __future__ import annotations

import time
from typing import Any

from textual import work
from textual.widgets import Static

from tui import backend
from tui.messages import FiguresReady


class PanelFigures:
    """Side-panel polling, mixed into ``ChatApp``."""

    def poll(self) -> None:
        """Every ``poll_s``: live tok/s of the streaming reply; scheduler (and tier) figures."""
        if self.shutting_down:
            return
        loading = self.loading_since
        if loading is not None:
            step = backend.running_step()  # a first-time GGUF conversion says how far it got
            self.query_one("#loading-text", Static).update(
                f"Loading {self.model or 'the default model'} … {time.monotonic() - loading:.0f} s"
                + (f"\n{step}" if step else ""))
        panel = self.panel
        turn = self.turns.get(self.current or "")
        if turn is not None and (turn.first_piece is None or turn.reading_tools):
            if turn.cancel_requested and turn.conv is not None:
                backend.cancel_turn(turn.conv)  # Escape came before the request existed: ask again
            self.show_prefill(turn)
        if turn is not None and turn.first_piece is not None:
            now = time.monotonic()
            since = turn.sampled_at or turn.first_piece
            if now > since:
                panel.add_sample((turn.pieces - turn.sampled_pieces) / (now - since))
            turn.sampled_pieces, turn.sampled_at = turn.pieces, now
            panel.live_tps = turn.pieces / max(now - turn.first_piece, 1e-6)
        panel.rss = self.memory_probe()
        panel.refresh_figures()
        if self.engine is not None and not self.collecting:  # one read at a time; none dropped
            self.collecting = True
            self.collect_figures(self.engine, self.tiers_stale)
            self.tiers_stale = False

    def show_prefill(self, turn: Any) -> None:
        """While a long prompt prefills (``turn``: the app's ``Turn``), its progress in the reply (Escape stops it); before
        that, a slow first-time step the turn waits on."""
        chat = self.logs.get(turn.conversation)
        if chat is None or chat.reply is None:
            return
        event = backend.prefill_progress(turn.conv)
        if event is None or event.finished:
            # Before the prefill: a first-time step (the KV cache probe, the embedding model).
            step = backend.running_step()
            if step is not None and event is None:
                chat.reply.show_progress(f"⏳ {step} · Escape stops the reply")
            return
        now = time.monotonic()
        if turn.progress_seen is None or turn.progress_seen[0] is not event:
            turn.progress_seen = (event, now)  # one event per prefill chunk: count down in between
        chat.reply.show_progress(f"⏳ {event.describe(since_s=now - turn.progress_seen[1])} · Escape stops")

    @work(thread=True, group="figures", exit_on_error=False)
    def collect_figures(self, engine: Any, with_tiers: bool) -> None:
        """[worker thread] Read the scheduler (and the tiers): both may wait on the engine."""
        machine = backend.machine(engine)
        tiers = backend.tiers(engine) if with_tiers else ...
        self.post_message(FiguresReady(machine, tiers))

    def on_figures_ready(self, message: FiguresReady) -> None:
        if self.shutting_down:
            return
        self.collecting = False
        panel = self.panel
        panel.machine = message.machine
        if message.tiers is not ...:
            panel.tiers = message.tiers
        panel.refresh_figures()
