"""``mlotspark chat`` in a real terminal: tmux starts it, types a question, and the
captured pane shows the answer streaming in, then the app quits cleanly.

Run with ``-s`` to see the captured panes. Needs tmux (skipped without it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux"),
]

GIVE_UP_S = 600  # only so a hung run ends; nothing is asserted about speed
QUESTION = "What is the capital of France?"


# A private tmux server (own socket, no config): other sessions on the machine cannot
# resize or otherwise touch the test's window.
SOCKET = f"mlotspark-test-{os.getpid()}"


def tmux(*args: str) -> str:
    cmd = ["tmux", "-L", SOCKET, "-f", os.devnull, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def capture(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session: str, check, what: str) -> str:
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        pane = capture(session)
        if check(pane):
            return pane
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}\n{pane}")
        time.sleep(0.05)


def chat_column(pane: str) -> list[str]:
    """The middle column's lines (between the list's and the side panel's borders)."""
    cells = []
    for line in pane.splitlines():
        parts = line.split("▕", 1)
        cells.append(parts[1].split("▏")[0] if len(parts) > 1 else "")
    return cells


def reply_lines(pane: str) -> str:
    """The reply so far: the lines with the reply's border mark ("█") below the
    question. (A notification toast may cover other lines of the chat column.)"""
    cells = chat_column(pane)
    start = next((i for i, cell in enumerate(cells) if QUESTION in cell), None)
    if start is None:
        return ""
    out: list[str] = []
    for cell in cells[start + 1:]:
        if cell.lstrip(" ").startswith("█"):  # after the log's padding and its (blank) focus bar
            out.append(cell.strip(" █"))
        elif out:
            break
    return " ".join(x for x in out if x).strip()


def test_chat_streams_an_answer_in_tmux(default_gguf, tmp_path, _isolated_home):
    session = f"mlotspark-chat-{os.getpid()}"
    chat = [sys.executable, "-m", "mlotspark", "chat", "--model", str(default_gguf), "--temp", "0", "--max-tokens", "40"]
    # Keep the pane after the app exits so its exit status (and any traceback) can be read.
    # COLUMNS/LINES (set in this process by a pytest plugin) would override the pane's size.
    env = f"env -u COLUMNS -u LINES MLOTSPARK_HOME={shlex.quote(str(_isolated_home))}"
    command = f"{env} {shlex.join(chat)}; echo EXIT=$?; sleep 60"
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "36", command)
    try:
        ready = wait_for(session, lambda p: "0 turns" in p and "Type a message" in p, "the app ready")
        print("\n--- ready ---\n" + ready)
        tmux("send-keys", "-t", session, "-l", QUESTION)
        tmux("send-keys", "-t", session, "Enter")
        states: list[str] = []

        def done(pane: str) -> bool:
            text = reply_lines(pane)
            if text.startswith("⏳"):  # the prefill line shown before the first piece: not the reply
                return False
            if text and (not states or text != states[-1]):
                states.append(text)
            # finished: the list shows the turn and no reply is marked as streaming
            return "Paris" in text and "1 turn" in pane and "(live)" not in pane and "●" not in pane

        final = wait_for(session, done, "the answer")
        print("--- answered ---\n" + final)
        print("--- reply as captured, state by state ---\n" + "\n".join(states))
        assert len(states) >= 2, states  # it streamed: seen in more than one piece
        assert all(b.startswith(a[: len(a) - 1]) for a, b in zip(states, states[1:])), states
        tmux("send-keys", "-t", session, "C-q")
        end = wait_for(session, lambda p: "EXIT=" in p, "the app exited")
        assert "EXIT=0" in end and "Traceback" not in end, end
    finally:
        subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True)
