"""Everything the TUI asks of the engine, through mlotspark's public API only.

One room for it so that the widgets never touch the engine. The engine is any
``EngineProtocol`` (``Engine``, or the fake of the tests: tests/test_tui_fakes.py),
called directly; a figure that cannot be read (a broken store) degrades to "—" here
instead of failing in many places. Calls that can wait on the engine thread
(``engine.persistence.stats``, ``engine.status``) are made from worker threads by the app.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from mlotspark import MlotsparkError, active_steps, blas_warning

if TYPE_CHECKING:  # the TUI starts before MLX loads: the Protocol only for annotations
    from mlotspark import ConversationProtocol, EngineProtocol

log = logging.getLogger(__name__)

NEW_NAME = "chat-{}"
_NEW_RE = re.compile(r"^chat-(\d+)$")


@dataclass(frozen=True)
class ConversationRow:
    """One line of the conversation list."""

    name: str
    title: str
    turns: int = 0
    tokens: int = 0

    @property
    def label(self) -> str:
        return self.title or self.name


@dataclass
class TurnFigures:
    """What the side panel shows about the last finished turn."""

    decode_tps: float | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    generated: int | None = None
    cached_tokens: int | None = None
    cache_source: str | None = None
    finish_reason: str | None = None
    peak_memory_mb: float | None = None
    memories: list[str] = field(default_factory=list)
    learned: int = 0
    updated: int = 0  # older entries the turn's facts superseded
    forgotten: int = 0
    not_forgotten: int = 0  # retractions that named nothing clearly
    not_remembered: int = 0  # "Remember that ..." requests that kept nothing
    cascade: dict = field(default_factory=dict)


@dataclass
class MachineFigures:
    """The scheduler and governor, as ``engine.status()`` reports them."""

    state: str | None = None
    mode: str | None = None
    cap: int | None = None
    batch_size: int | None = None
    queued: int | None = None
    kv_bytes: int | None = None
    decode_tps: float | None = None
    reason: str = ""
    #: Across ranks (``Engine.load(distributed=...)``): every rank's figures, rank 0 first.
    ranks: list[dict] = field(default_factory=list)
    #: Set when MLX runs on its slow reference BLAS: the warning with the fix.
    blas_warning: str | None = field(default_factory=blas_warning)
    #: The memory signal in force (``kernel pressure level`` on macOS, ``psutil available
    #: memory`` elsewhere) and what it reads now: the kernel's level (0 normal, 1 warn,
    #: 2 critical) or the share of RAM in use and the bytes available.
    memory_signal: str | None = None
    pressure_level: int | None = None
    pressure: float | None = None
    available_bytes: int | None = None
    #: What KV may take (``memory_status``) and where that pool comes from.
    kv_budget: int | None = None
    budget_source: str | None = None


@dataclass(frozen=True)
class ModelRow:
    """One model the picker offers (``mlotspark.available_models``)."""

    name: str  # what Engine.load takes: an alias, a repo id or a path
    where: str  # catalogue | hf | used before | hf cache
    size: int  # bytes (an alias not pulled: its download size)
    pulled: bool
    path: str = ""
    default: bool = False
    description: str = ""
    capabilities: str = ""  # "chat, json, tools" (measured), or "... (unverified)"


def load_engine(model: str | None, **defaults: Any) -> "EngineProtocol":
    """Load the engine (no stderr progress bar: it would tear the screen).

    Raises:
        MlotsparkError: the model cannot be found or loaded, or a bad option.
    """
    from mlotspark import Engine

    return Engine.load(model, progress=False, **defaults)


def model_name(engine: "EngineProtocol") -> str:
    return engine.model_name


def default_options(engine: "EngineProtocol") -> dict[str, Any]:
    """The engine's default generation options as a dict."""
    return engine.defaults.to_dict()


def sampling_sources(engine: "EngineProtocol") -> dict[str, str]:
    """Where each default sampling option came from (the model's file, the catalogue,
    the global default, the caller)."""
    return dict(engine.sampling_sources)


def list_models() -> list[ModelRow]:
    """The models a user can open by name: every catalogue alias (pulled or not) and what
    ``mlotspark list`` shows (``mlotspark.available_models``, the same source). Reads the
    disk (the Hugging Face cache too): call it from a worker thread."""
    from mlotspark import available_models

    return [ModelRow(r["name"], r.get("where", ""), int(r.get("size") or 0), bool(r.get("pulled")),
                     str(r.get("path") or ""), bool(r.get("default")), str(r.get("description") or ""),
                     _capabilities(r.get("capabilities")))
            for r in available_models()]


def _capabilities(caps: Any) -> str:
    if not isinstance(caps, dict):
        return ""
    return ", ".join(caps.get("features") or ()) + ("" if caps.get("verified") else " (unverified)")


# -- conversations ----------------------------------------------------------------------
def list_conversations(engine: "EngineProtocol") -> list[ConversationRow]:
    """Stored conversations, newest first."""
    return [ConversationRow(c.name, c.title, c.turns, c.tokens) for c in engine.conversations()]


def next_name(existing: Iterable[str]) -> str:
    """The next free ``chat-N`` name."""
    used = {int(m.group(1)) for n in existing if (m := _NEW_RE.match(n))}
    n = 1
    while n in used:
        n += 1
    return NEW_NAME.format(n)


def create_conversation(engine: "EngineProtocol", name: str) -> "ConversationProtocol":
    """Open conversation ``name`` and store it at once, so it is listed before its first turn.

    The API stores a conversation on its first turn; writing its system prompt back
    (the same text) stores it now.
    """
    conv = engine.conversation(name)
    conv.system = conv.system
    return conv


def messages(conv: "ConversationProtocol") -> list[dict]:
    """The messages a chat shows: the user's, the replies, and the tool results fed back
    (an MCP tool's run, shown under the call that asked for it)."""
    return [m for m in conv.messages if m.get("role") in ("user", "assistant", "tool")]


def prefill_progress(conv: "ConversationProtocol | None") -> Any:
    """The running turn's latest ``PrefillProgress`` (None when unknown or none yet)."""
    try:
        return conv.progress if conv is not None else None
    except Exception:  # noqa: BLE001  a progress read must never take the UI down
        return None


def running_step() -> str | None:
    """The newest slow first-time step running now (a GGUF conversion, the KV cache
    probe, the embedding model's load), as one line; None when none runs."""
    try:
        running = active_steps()
    except Exception:  # noqa: BLE001  a progress read must never take the UI down
        return None
    return running[-1].describe(time.perf_counter()) if running else None


def cancel_turn(conv: "ConversationProtocol") -> bool:
    """Ask the conversation to stop its reply; True once asked."""
    conv.cancel()
    return True


# -- figures ----------------------------------------------------------------------------
def machine(engine: "EngineProtocol") -> MachineFigures | None:
    """Scheduler/governor figures, or None if the engine cannot say."""
    try:
        s = engine.status()
    except Exception as e:  # noqa: BLE001  a status read must never take the UI down
        log.warning("scheduler status unavailable: %s", e)
        return None
    memory = s.get("memory") or {}
    reading = (s.get("governor") or {}).get("reading") or {}
    signal = memory.get("signal")
    return MachineFigures(
        state=s.get("state"), mode=s.get("mode"), cap=s.get("cap"), batch_size=s.get("batch_size"),
        queued=s.get("queued"), kv_bytes=s.get("kv_bytes"), decode_tps=s.get("decode_tps"),
        reason=str(s.get("reason") or ""), ranks=list(s.get("ranks") or []),
        # "kernel pressure level (kern.memorystatus_vm_pressure_level)": the name without the detail
        memory_signal=str(signal).split(" (")[0] if signal else None,
        pressure_level=reading.get("memory_pressure_level"), pressure=reading.get("memory_pressure"),
        available_bytes=reading.get("memory_available_bytes"),
        kv_budget=memory.get("kv_budget_bytes"), budget_source=memory.get("source"),
    )


def process_memory() -> int | None:
    """Resident memory of this process in bytes (None where psutil cannot say)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return None


def tiers(engine: "EngineProtocol") -> dict | None:
    """``engine.persistence.stats()``, or None if the engine cannot say."""
    try:
        return engine.persistence.stats()
    except Exception as e:  # noqa: BLE001
        log.warning("tier stats unavailable: %s", e)
        return None


def memory_texts(engine: "EngineProtocol", ids: Iterable[int]) -> list[str]:
    """The texts of semantic memory entries (``#id text``); an id no longer stored is
    ``#id (forgotten)`` (a retraction in the same turn), one it cannot read stays bare."""
    out = []
    store = None
    with contextlib.suppress(Exception):
        store = engine.memory
    for i in ids:
        entry, read = None, False
        if store is not None:
            with contextlib.suppress(Exception):
                entry, read = store.get(i), True
        out.append(f"#{i} {entry.text}" if entry is not None else f"#{i} (forgotten)" if read else f"#{i}")
    return out


def turn_figures(engine: "EngineProtocol", stats: Any) -> TurnFigures:
    """Figures of a finished turn from its ``GenerationStats``."""
    extra = dict(getattr(stats, "extra", None) or {})
    memory = extra.get("memory") or {}
    used = list(memory.get("used") or [])
    return TurnFigures(
        decode_tps=getattr(stats, "decode_tps", None),
        ttft_s=extra.get("turn_ttft_s", getattr(stats, "ttft_s", None)),
        prompt_tokens=getattr(stats, "prompt_tokens", None),
        generated=getattr(stats, "generation_tokens", None),
        cached_tokens=getattr(stats, "cached_tokens", None),
        cache_source=extra.get("cache_source"),
        finish_reason=getattr(stats, "finish_reason", None),
        peak_memory_mb=getattr(stats, "peak_memory_mb", None),
        memories=memory_texts(engine, used) if used else [],
        learned=len(memory.get("learned") or []),
        updated=len(memory.get("updated") or []),
        forgotten=len(memory.get("forgotten") or []),
        not_forgotten=int(memory.get("not_forgotten") or 0),
        not_remembered=int(memory.get("not_remembered") or 0),
        cascade=dict(extra.get("cascade") or {}),
    )


def model_facts(engine: "EngineProtocol") -> dict:
    """``engine.info()`` without the scheduler part ({} if unavailable)."""
    try:
        info = dict(engine.info())
    except (MlotsparkError, AttributeError) as e:
        log.warning("engine info unavailable: %s", e)
        return {}
    info.pop("scheduler", None)
    return info


__all__ = [
    "ConversationRow", "MachineFigures", "ModelRow", "TurnFigures", "list_models", "cancel_turn", "create_conversation",
    "default_options", "sampling_sources", "list_conversations", "load_engine", "machine", "memory_texts", "messages",
    "model_facts", "model_name", "next_name", "prefill_progress", "process_memory", "running_step", "tiers", "turn_figures",
]
