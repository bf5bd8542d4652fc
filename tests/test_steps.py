"""Slow first-time steps are never silent: the shared step reporter, the CLI's status
line on a terminal (nothing when piped), and the steps that report through it (the
``--cache-kind auto`` probe, the sentence-embedding model's load, a GGUF conversion)."""

from __future__ import annotations

import io
import os
import threading

import pytest

from mlotspark import steps
from mlotspark.cli import progress
from test_cli_progress import _drain


def test_step_events_in_order_and_active_while_running():
    seen: list[steps.StepProgress] = []
    stop = steps.listen(seen.append)
    try:
        with steps.step("converting x.gguf", total=3_000_000, unit="B") as s:
            assert [e.name for e in steps.active()] == ["converting x.gguf"]
            s.advance(1_000_000)
            s.advance(2_000_000)
        assert steps.active() == []
    finally:
        stop()
    assert [e.done for e in seen] == [0, 1_000_000, 3_000_000, 3_000_000]
    assert [e.finished for e in seen] == [False, False, False, True]
    assert "converting x.gguf · 1/3 MB (33%)" in seen[1].describe()
    with steps.step("nothing listens"):  # no listener left: nothing is called
        pass
    assert len(seen) == 4


def test_a_failing_listener_does_not_fail_the_step():
    stop = steps.listen(lambda e: 1 / 0)
    try:
        with steps.step("still runs") as s:
            s.advance()
    finally:
        stop()


def _tty_status(label: str, work) -> str:
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", encoding="utf-8", closefd=False) as tty:
            with progress.StatusLine(label, stream=tty) as line:
                assert line.enabled
                work()
        return _drain(master)
    finally:
        os.close(master)
        os.close(slave)


def test_status_line_shows_a_running_step_on_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(progress, "TICK_S", 0.01)
    ticked = threading.Event()
    real_draw = progress.StatusLine._draw

    def draw(self):  # tells the step when the ticker has drawn it as advanced
        running = steps.active()
        real_draw(self)
        if self.drawn and running and running[-1].done == 1:
            ticked.set()

    monkeypatch.setattr(progress.StatusLine, "_draw", draw)

    def work():
        with steps.step("choosing the KV cache kind", total=3, unit="kinds") as s:
            s.advance()
            assert ticked.wait(60), "the ticker never redrew the running step"  # only against a hang

    shown = _tty_status("", work)
    assert "mlotspark: choosing the KV cache kind · 1/3 kinds (33%)" in shown
    assert shown.endswith("\r\x1b[K")  # erased when the step ended


def test_status_line_draws_nothing_when_piped(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    piped = io.StringIO()
    with progress.StatusLine("", stream=piped) as line:
        assert not line.enabled and not steps.watched()
        with steps.step("loading the sentence-embedding model"):
            pass
    assert piped.getvalue() == ""


def test_the_auto_probe_reports_a_step_per_kind(_isolated_home):
    from mlotspark.caches.policy import decide_cache_kind
    from tiny import tiny_model

    seen: list[steps.StepProgress] = []
    stop = steps.listen(seen.append)
    try:
        decide_cache_kind(tiny_model(hidden_size=128, vocab_size=64), None, fingerprint="fp-steps",
                          setup="float32@cpu", budget_bytes=10**9, tokens=512, probe_ids=list(range(3, 60)))
        n = len(seen)
        decide_cache_kind(tiny_model(hidden_size=128, vocab_size=64), None, fingerprint="fp-steps",
                          setup="float32@cpu", budget_bytes=10**9, tokens=512, probe_ids=list(range(3, 60)))
    finally:
        stop()
    assert seen[0].name.startswith("choosing the KV cache kind: probing float16, q8, q4")
    assert [e.done for e in seen] == [0, 1, 2, 3, 3] and seen[-1].finished
    assert len(seen) == n  # stored: the second decision probes nothing, so says nothing


def test_the_embedder_load_is_a_step(monkeypatch):
    from mlotspark.models.sentence_embedders import MiniLMEmbedder

    seen: list[str] = []
    monkeypatch.setattr(MiniLMEmbedder, "_load_files", lambda self: seen.append(steps.active()[-1].name))
    emb = MiniLMEmbedder.__new__(MiniLMEmbedder)
    emb._model = None
    emb._load()
    assert seen == ["loading the sentence-embedding model (all-MiniLM-L6-v2)"] and steps.active() == []


def test_a_conversion_reports_its_bytes_and_leaves_the_line_to_a_status_line(tmp_path, monkeypatch, _isolated_home):
    from mlotspark.models.formats import gguf_convert
    from tiny import tiny_model, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "t.gguf", tiny_model())
    seen: list[steps.StepProgress] = []
    bars: list[bool] = []
    real_bar = gguf_convert.progress_bar
    monkeypatch.setattr(gguf_convert, "progress_bar", lambda total, desc, show: bars.append(show) or real_bar(total, desc, False))
    monkeypatch.setenv("MLOTSPARK_PROGRESS", "1")  # a bar would be drawn ...
    stop = steps.listen(seen.append)
    try:
        with steps.watching():  # ... but a status line shows the steps
            gguf_convert.load_converted(path, progress=True)
    finally:
        stop()
    assert bars == [False]
    assert seen[0].name == "converting t.gguf (once)" and seen[-1].finished
    assert seen[-1].done == seen[-1].total > 0 and seen[-1].unit == "B"
