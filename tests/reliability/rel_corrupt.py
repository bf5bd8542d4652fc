"""Corrupt files: mutate a stored file, open it, and classify what happened.

Every opener must either work or raise a typed ``mlotspark.errors`` error on one
line that names the file. GGUF files are loaded in a worker process (a C reader
may die by a signal or hang: both are failures here); the other stores are pure
Python and open in this process.
"""

from __future__ import annotations

import json
import select
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

from rel_common import HERE, child_env

TIMEOUT_S = 30


def judge(error: BaseException | str | None, path: Path, typed: bool = True) -> str:
    """``ok`` / ``typed`` (one line naming the file) / a failure class."""
    if error is None:
        return "ok"
    text = str(error)
    if not typed:
        return "untyped"
    if "\n" in text:
        return "multiline"
    if path.name not in text and str(path.parent) not in text:
        return "unnamed"
    return "typed"


class GgufWorker:
    """A process that loads GGUF files; restarted after a crash or a hang."""

    def __init__(self, home: Path):
        self.home = home
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "rel_gguf_worker.py")], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=child_env(self.home),
            )
        return self.proc

    def load(self, path: Path) -> str:
        """Outcome of loading ``path``: ok, typed, untyped, multiline, unnamed, signal, hang."""
        p = self._start()
        p.stdin.write(f"{path}\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], TIMEOUT_S)
        if not ready:
            p.kill()
            p.wait()
            return "hang"
        line = p.stdout.readline()
        if not line:
            code = p.wait()
            return "signal" if code < 0 else "exit"
        kind, *rest = json.loads(line)
        if kind == "ok":
            return "ok"
        if kind == "untyped":
            self.last_untyped = " ".join(rest)
            return "untyped"
        return judge(rest[1], path)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def gguf_header_end(path: Path) -> int:
    """Where the tensor infos of a GGUF file end (mutations aim at the header)."""
    data = path.read_bytes()
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def string(pos: int) -> int:
        (n,) = struct.unpack_from("<Q", data, pos)
        return pos + 8 + n

    def value(pos: int, t: int) -> int:
        fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
        if t in fixed:
            return pos + fixed[t]
        if t == 8:
            return string(pos)
        et, count = struct.unpack_from("<IQ", data, pos)
        pos += 12
        for _ in range(count):
            pos = value(pos, et)
        return pos

    for _ in range(n_kv):
        pos = string(pos)
        (t,) = struct.unpack_from("<I", data, pos)
        pos = value(pos + 4, t)
    for _ in range(n_tensors):
        pos = string(pos)
        (nd,) = struct.unpack_from("<I", data, pos)
        pos += 4 + 8 * nd + 4 + 8
    return pos


def mutate(data: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    """Apply ``(kind, position, value)`` edits: ``flip`` a byte, write a ``u64`` /
    ``u32``, ``truncate`` at a position, ``zero`` 64 bytes."""
    out = bytearray(data)
    for kind, pos, value in edits:
        if not out:
            break
        pos %= len(out)
        if kind == "flip":
            out[pos] ^= (value % 255) + 1
        elif kind == "u64":
            out[pos : pos + 8] = struct.pack("<Q", value % (1 << 64))[: len(out) - pos]
        elif kind == "u32":
            out[pos : pos + 4] = struct.pack("<I", value % (1 << 32))[: len(out) - pos]
        elif kind == "zero":
            out[pos : pos + 64] = bytes(len(out[pos : pos + 64]))
        elif kind == "truncate":
            del out[pos:]
    return bytes(out)


def tally(outcomes: list[str]) -> dict:
    c = Counter(outcomes)
    return {"inputs": len(outcomes), **c}
