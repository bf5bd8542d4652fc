"""A small fake engine for the TUI's widget and snapshot tests (no model, no timing),
and the ``until`` helper they share.

It implements the engine's declared interface, ``EngineProtocol`` (checked in
test_engine_api.py), so the TUI calls it as it calls an ``Engine``; option values
are checked by the real ``GenerationOptions``.
Replies are scripted: each turn yields the words of ``reply`` one by one, waiting
on ``gate`` before each when the test wants to hold a reply mid-stream.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from mlotspark.errors import OptionError, StoreError
from mlotspark.memory.semantic.store import Told
from mlotspark import GenerationResult, GenerationStats
from mlotspark.options import GenerationOptions

REPLY = "The capital of France is **Paris**. It is on the Seine."


async def until(pilot: Any, check: Callable[[], Any], what: str, steps: int = 2000) -> None:
    """Let the app run until ``check()`` is true (counted in event-loop pauses, not time)."""
    for _ in range(steps):
        if check():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"never happened: {what}")


@dataclass
class FakeInfo:
    name: str
    title: str
    updated: float
    turns: int
    tokens: int


@dataclass
class FakeEntry:
    id: int
    text: str
    superseded_by: int | None = None


@dataclass
class FakeHit:
    entry: FakeEntry
    score: float

    @property
    def id(self) -> int:
        return self.entry.id


class FakeMemory:
    def __init__(self) -> None:
        self.entries: dict[int, FakeEntry] = {}
        self.next_id = 1

    def remember(self, text: str) -> int:
        if not text.strip():
            raise OptionError(f"invalid memory text {text!r}")
        if len(text) > 2000:
            raise OptionError(f"memory text {text[:40]!r}... is {len(text)} characters; at most 2000")
        self.entries[self.next_id] = FakeEntry(self.next_id, text)
        self.next_id += 1
        return self.next_id - 1

    def tell(self, text: str) -> Told:
        return Told(self.remember(text), True, False, ())

    def forget(self, entry_id: int) -> bool:
        return self.entries.pop(entry_id, None) is not None

    def get(self, entry_id: int) -> FakeEntry | None:
        return self.entries.get(entry_id)

    def superseded_by(self, entry_id: int) -> list[FakeEntry]:
        return [e for e in self.entries.values() if e.superseded_by == entry_id]

    def list(self, limit: int | None = None, *, current_only: bool = False) -> list[FakeEntry]:
        return list(self.entries.values())[:limit]

    calibration = SimpleNamespace(threshold_about_user=0.37, threshold_other=0.57)  # what /memory QUERY reads

    def search(self, query: str, k: int = 5, threshold: float = 0.0) -> list[FakeHit]:
        words = set(query.lower().split())
        return [FakeHit(e, 1.0) for e in self.entries.values() if words & set(e.text.lower().split())][:k]

    def __len__(self) -> int:
        return len(self.entries)


class FakeConversation:
    name: str

    def __init__(self, engine: "FakeEngine", name: str) -> None:
        self.engine, self.name = engine, name
        self._cancel = threading.Event()

    @property
    def _rec(self) -> dict:
        return self.engine.store.setdefault(self.name, {"system": "You are a helpful assistant.", "title": "",
                                                        "messages": [], "updated": 0.0})

    @property
    def messages(self) -> list[dict]:
        return [dict(m) for m in self._rec["messages"]]

    @property
    def system(self) -> str:
        return self._rec["system"]

    @system.setter
    def system(self, text: str) -> None:
        self._touch()["system"] = text

    @property
    def title(self) -> str:
        return self._rec["title"]

    @title.setter
    def title(self, text: str) -> None:
        self._touch()["title"] = text

    @property
    def tool_approvals(self) -> dict[str, str]:
        return dict(self._rec.get("tool_approvals", {}))

    def remember_tool(self, name: str, answer: str) -> None:
        self._touch().setdefault("tool_approvals", {})[name] = answer

    def _touch(self) -> dict:
        rec = self._rec
        self.engine.clock += 1
        rec["updated"] = self.engine.clock
        return rec

    def reset(self) -> None:
        rec = self._touch()
        rec["messages"], rec["title"], rec["tool_approvals"] = [], "", {}

    def delete(self) -> None:
        self.engine.store.pop(self.name, None)

    def cancel(self) -> None:
        self._cancel.set()

    def info(self) -> FakeInfo:
        rec = self._rec
        return FakeInfo(self.name, rec["title"], rec["updated"], sum(m["role"] == "assistant" for m in rec["messages"]), 0)

    def render(self, text: str | None = None) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.messages + ([{"role": "user", "content": text}] if text is not None else [])

    def add(self, role: str, content: str) -> None:
        self._touch()["messages"].append({"role": role, "content": content})

    def send(self, text: str, *, role: str = "user", **options: Any) -> GenerationResult:
        *pieces, stats = list(self.stream(text, role=role, **options))
        return GenerationResult(text="".join(pieces), tokens=[], stats=stats)

    @property
    def progress(self) -> Any:
        """The scripted prefill progress (``FakeEngine.prefill``) until the first piece."""
        return self.engine.prefill

    def stream(self, text: str, *, role: str = "user", **options: Any) -> Iterator[Any]:
        opts = self.engine.defaults.merged(**options)
        self.engine.calls.append((self.name, text, options))
        self.engine.roles.append(role)
        if self.engine.fail_with is not None:
            raise self.engine.fail_with
        self._cancel.clear()
        words = (self.engine.replies.pop(0) if self.engine.replies else self.engine.reply).split(" ")
        out, reason = [], "stop"
        for i, w in enumerate(words[: opts.max_tokens]):
            if self.engine.gate is not None:
                self.engine.gate.acquire()
            if self._cancel.is_set():
                reason = "cancelled"
                break
            piece = w if i == 0 else " " + w
            self.engine.prefill = None  # the prompt is in: pieces come now
            out.append(piece)
            yield piece
        else:
            if len(words) > opts.max_tokens:
                reason = "length"
        rec = self._touch()
        rec["messages"] += [{"role": role, "content": text}, {"role": "assistant", "content": "".join(out),
                                                                    "finish_reason": reason}]
        rec["title"] = rec["title"] or text[:60]
        yield GenerationStats(prompt_tokens=27, generation_tokens=len(out), finish_reason=reason, ttft_s=0.25,
                              decode_tps=12.5, peak_memory_mb=512.0, prefilled_tokens=7, cached_tokens=20,
                              extra={"turn_ttft_s": 0.3, "cache_source": "prefix",
                                     "memory": {"used": list(self.engine.memory.entries)[:2], "learned": []}})


class FakePersistence:
    """``engine.persistence``: the tier figures the stats panel shows (a ``StoreError`` with ``fail_with``)."""

    def __init__(self, engine: "FakeEngine") -> None:
        self.engine = engine
        self.opened = True

    def set_budgets(self, **budgets: Any) -> Any:
        return budgets

    def conversations(self) -> list:
        return self.engine.conversations()

    def stats(self) -> dict:
        if self.engine.fail_with is not None:
            raise StoreError("the store is unreadable")
        return {
            "working": {"bytes": 11_796_480, "conversations_warm": 1},
            "episodic": {"snapshots": 2, "bytes": 1_572_322, "hit_rate": 0.5},
            "prefix_cache": {"entries": 1, "bytes": 552_960, "hit_rate": 0.5},
            "semantic": {"entries": len(self.engine.memory), "hit_rate": 0.25},
        }


@dataclass
class FakeEngine:
    """``EngineProtocol`` with scripted replies (no model: ``loaded`` and ``tokenizer`` are None)."""

    reply: str = REPLY
    replies: list = field(default_factory=list)  # the next turns' replies, in order (then ``reply``)
    roles: list = field(default_factory=list)  # each turn's role: user, or tool (MCP results fed back)
    gate: threading.Semaphore | None = None
    fail_with: Exception | None = None
    model_name: str = "fake-135m"
    store: dict = field(default_factory=dict)
    memory: FakeMemory = field(default_factory=FakeMemory)
    calls: list = field(default_factory=list)
    clock: float = 0.0
    closed: bool = False
    prefill: Any = None  # a PrefillProgress the next turn reports until its first piece
    sampling_sources: dict = field(default_factory=dict)
    defaults: GenerationOptions = field(default_factory=GenerationOptions)
    device: str = "cpu"
    loaded: Any = None
    caches: Any = None
    tokenizer: Any = None
    vocab_size: int = 0
    rank: int = 0
    # What status() says of memory (Engine: ``scheduler_config.memory_status``, the
    # governor's last reading); tests change them to see the panel follow.
    kv_bytes: int = 0
    memory_status: dict = field(default_factory=lambda: {
        "signal": "psutil available memory (ratio and bytes)", "source": "available memory",
        "kv_budget_bytes": 7_100_000_000, "admission_limit_bytes": None})
    reading: dict = field(default_factory=lambda: {"memory_pressure": 0.41, "memory_available_bytes": 14_200_000_000})

    @property
    def persistence(self) -> "FakePersistence":
        return FakePersistence(self)

    @property
    def scheduler(self) -> Any:
        return SimpleNamespace(call=lambda fn, *args, **kwargs: fn(*args, **kwargs))

    # -- requests: the scripted reply, word by word (the TUI itself talks through conversations)
    def encode(self, prompt_or_messages: Any, raw: bool = False, tools: Any = None, think: Any = None) -> list[int]:
        text = prompt_or_messages if isinstance(prompt_or_messages, str) else " ".join(
            m["content"] for m in prompt_or_messages)
        return list(range(len(text.split())))

    def submit(self, prompt_or_messages: Any = None, **options: Any) -> Any:
        raise NotImplementedError("the TUI submits through conversations")

    def stream(self, prompt_or_messages: Any, raw: bool = False, *, progress: bool = False,
               **options: Any) -> Iterator[Any]:
        words = self.reply.split(" ")[: self.defaults.merged(**options).max_tokens]
        yield from (w if i == 0 else " " + w for i, w in enumerate(words))
        yield GenerationStats(prompt_tokens=27, generation_tokens=len(words), finish_reason="stop")

    def generate(self, prompt_or_messages: Any, raw: bool = False, **options: Any) -> GenerationResult:
        *pieces, stats = list(self.stream(prompt_or_messages, raw, **options))
        return GenerationResult(text="".join(pieces), tokens=[], stats=stats)

    def generate_batch(self, prompts: Any, raw: bool = False, priority: int = 0, **options: Any) -> list[str]:
        return [self.generate(p, raw, **options).text for p in prompts]

    # -- conversations and memory
    def conversation(self, name: str, *, system: str | None = None) -> FakeConversation:
        if "/" in name or name.startswith("."):
            raise OptionError(f"invalid conversation name {name!r}")
        conv = FakeConversation(self, name)
        if system is not None:
            conv.system = system
        return conv

    def conversations(self) -> list[FakeInfo]:
        rows = [FakeInfo(n, r["title"], r["updated"], sum(m["role"] == "assistant" for m in r["messages"]), 0)
                for n, r in self.store.items()]
        return sorted(rows, key=lambda r: -r.updated)

    def status(self) -> dict:
        return {"state": "nominal", "mode": "balanced", "cap": 8, "batch_size": 1, "queued": 0,
                "kv_bytes": self.kv_bytes, "decode_tps": 12.5, "reason": "calm",
                "memory": dict(self.memory_status), "governor": {"reading": dict(self.reading)}}

    def info(self) -> dict:
        return {"model": self.model_name, "weights": "float32", "weights_mb": 540.0, "context_length": 8192,
                "device": "cpu", "scheduler": {}}

    def close(self) -> None:
        self.closed = True


def fake_with_history() -> FakeEngine:
    """A fake engine with two stored conversations, the newer one with a finished turn."""
    engine = FakeEngine()
    engine.memory.remember("My sister's name is Ilse.")
    old = engine.conversation("chat-1")
    old.title = "Rust lifetimes"
    new = engine.conversation("chat-2")
    list(new.stream("What is the capital of France?"))
    return engine
