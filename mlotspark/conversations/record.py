"""A conversation on disk: its record and its directory (no MLX here).

``$MLOTSPARK_HOME/conversations/<name>/``::

    conversation.json   name, title, system prompt, messages (the ground truth), the
                        user's standing answers about MCP tools (``tool_approvals``)
    snapshot/           the KV / cascade state after the last turn (memory/snapshots.py)
    .lock               held for a whole turn, so processes sharing the home take turns

``render`` places each turn's retrieved memory (see ``conversation.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlotspark.errors import StoreError
from mlotspark.memory.snapshots import SnapshotStore
from mlotspark.storage import FileLock, ensure_dir, read_json, write_json

FORMAT = "mlotspark-conversation"
TITLE_CHARS = 60
ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's result fed back (chat --mcp)
STANDING_ANSWERS = ("always", "never")  # the approvals of a tool kept with the conversation (``once`` is not kept)


@dataclass
class ConversationInfo:
    """One line of ``engine.conversations()``."""

    name: str
    title: str
    updated: float
    turns: int
    tokens: int


@dataclass
class ConversationRecord:
    """What ``conversation.json`` holds. ``messages`` are dicts with ``role``,
    ``content``, ``time`` and, on user turns, the ``memory`` section shown with them."""

    name: str
    system: str
    messages: list[dict] = field(default_factory=list)
    title: str = ""
    created: float = 0.0
    updated: float = 0.0
    tokens: int = 0  # tokens in the model's context after the last turn
    revision: int = 0
    memory: bool = True  # semantic memory read and written by this conversation's turns
    tool_approvals: dict[str, str] = field(default_factory=dict)  # tool name -> always | never

    @property
    def turns(self) -> int:
        return sum(m.get("role") == "assistant" for m in self.messages)

    def info(self) -> ConversationInfo:
        return ConversationInfo(self.name, self.title, self.updated, self.turns, self.tokens)

    @classmethod
    def from_json(cls, doc: Any, where: Path) -> "ConversationRecord":
        """Raises: StoreError when ``doc`` is not a conversation."""
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a conversation file")
            messages = [dict(m) for m in doc["messages"]]
            if any(m.get("role") not in ROLES or not isinstance(m.get("content"), str) for m in messages):
                raise ValueError("a message lacks a role or text")
            # Read leniently, as ``memory``: an answer that is not one of the two is no answer (asked again).
            approvals = doc.get("tool_approvals") if isinstance(doc.get("tool_approvals"), dict) else {}
            approvals = {k: v for k, v in approvals.items() if isinstance(k, str) and v in STANDING_ANSWERS}
            return cls(
                name=str(doc["name"]), system=str(doc.get("system", "")), messages=messages,
                title=str(doc.get("title", "")), created=float(doc.get("created", 0)), updated=float(doc.get("updated", 0)),
                tokens=int(doc.get("tokens", 0)), revision=int(doc.get("revision", 0)),
                memory=doc.get("memory", True) is not False, tool_approvals=dict(approvals),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError(f"cannot read conversation {where}: {e}") from e


class ConversationFiles:
    """A conversation's directory: the record, its snapshot and its lock (no MLX here)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.path = self.directory / "conversation.json"
        self.lock = FileLock(self.directory / ".lock")
        self.snapshots = SnapshotStore(self.directory / "snapshot")

    def load(self) -> ConversationRecord | None:
        """The stored record, or None if there is none. Raises StoreError if unreadable."""
        doc = read_json(self.path, default=None)
        return None if doc is None else ConversationRecord.from_json(doc, self.path)

    def save(self, record: ConversationRecord) -> None:
        """Write the record atomically (revision + 1)."""
        ensure_dir(self.directory)
        record.revision += 1
        write_json(self.path, {"format": FORMAT, "version": 1, **asdict(record)})
        # Temp files of a writer killed mid-write (callers hold the lock: none is in flight).
        for stale in self.directory.glob(f".{self.path.name}.*.tmp"):
            stale.unlink(missing_ok=True)


def render(record: ConversationRecord, user: dict | None = None) -> list[dict]:
    """The messages as the model sees them (memory sections placed, see module docstring)."""
    messages = [*record.messages, *([user] if user else [])]
    system = record.system
    out: list[dict] = []
    for i, m in enumerate(messages):
        content, memory = m["content"], m.get("memory") or ""
        if memory and i == 0 and system:
            system = f"{system}\n\n{memory}"
        elif memory:
            content = f"{memory}\n\n{content}"
        out.append({"role": m["role"], "content": content})
    return ([{"role": "system", "content": system}] if system else []) + out


__all__ = ["FORMAT", "ROLES", "TITLE_CHARS", "ConversationFiles", "ConversationInfo", "ConversationRecord", "render"]
