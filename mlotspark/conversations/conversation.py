"""Conversations that survive restarts: messages on disk, KV snapshots, memory per turn.

``engine.conversation(name)`` gives a ``Conversation``; its files live in
``$MLOTSPARK_HOME/conversations/<name>/`` (``record.py``).

A turn: retrieve semantic memory for the user's text; render the messages with the
chat template; take the cache that shares the longest token prefix with the prompt
(this conversation's warm cache, its snapshot on disk, or the shared prefix cache),
cut it to that prefix, and submit only the rest; when the turn finishes, the engine
thread captures the snapshot's arrays and hands the rest to the writer (``writer.py``),
which stores the messages first, then the snapshot, then what the user stated about
themselves, while other requests go on decoding. A snapshot that cannot be used is refused with a
``SnapshotWarning`` and the turn re-prefills from the stored messages.

Where retrieved memory goes: into the system prompt on a conversation's first turn
(when it has one of its own: an empty one leaves the template's default in place);
otherwise in front of that user message. The rendered transcript then only
grows, so the KV of every earlier turn stays valid and is never re-prefilled.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from mlotspark.memory.cascade import CascadeConfig
from mlotspark.memory.kv_state import cache_block_bytes, cache_kind, cache_nbytes, cache_offset, trim_to
from mlotspark.errors import OptionError, SnapshotError, StoreError
from mlotspark.options import check_text
from mlotspark.conversations.host import ConversationHost
from mlotspark.runtime.generation import Generation
from mlotspark.results import GenerationResult, GenerationStats, ReasoningPiece
from mlotspark.memory.semantic.learning import Learned
from mlotspark.memory.snapshots import SnapshotWarning, common_prefix
from mlotspark.conversations.record import (
    ROLES,
    STANDING_ANSWERS,
    TITLE_CHARS,
    ConversationFiles,
    ConversationInfo,
    ConversationRecord,
    render,
)

log = logging.getLogger(__name__)


def _kind_of(cache: list) -> str:
    """``kv`` or ``cascade`` (a cache that cannot be saved counts as ``kv``)."""
    try:
        return cache_kind(cache)
    except SnapshotError:
        return "kv"


@dataclass
class _Turn:
    """What one turn carries from its start to its end."""

    user: dict
    prompt_ids: list[int]
    cached: int
    started: float
    extra: dict
    handle: Any = None
    first_piece: float | None = None
    error: BaseException | None = None
    stored: Future | None = None  # the writer's job storing the turn, once it finished


def _wait_stored(turn: _Turn) -> None:
    """Wait for the writer to store ``turn`` (a request that failed is never handed over)."""
    if turn.stored is not None:
        turn.stored.result()


class Conversation:
    """A named, persistent conversation. Get one with ``engine.conversation(name)``.

    Methods are safe to call from several threads (turns queue) and processes
    sharing ``$MLOTSPARK_HOME`` (turns take the conversation's file lock). It implements
    ``runtime.engine_api.ConversationProtocol``.
    """

    name: str

    def __init__(self, persistence: ConversationHost, name: str, directory: Path, system: str):
        self._p = persistence
        self.engine = persistence.engine
        self.name = name
        self.files = ConversationFiles(directory)
        self._mutex = threading.RLock()
        self._turn: _Turn | None = None
        self._cache: list | None = None  # warm cache, holding exactly _cache_tokens
        self._cache_tokens: list[int] = []
        self._snapshot_revision = ""  # the snapshot our warm cache matches
        record = self.files.load()
        self.record = record or ConversationRecord(name=name, system=system, created=time.time(), updated=time.time())

    # -- reading --------------------------------------------------------------------
    @property
    def messages(self) -> list[dict]:
        """The messages, oldest first, as ``{"role", "content"}`` dicts (copies); an
        assistant reply also has ``finish_reason`` (``stop``, ``length``, ``cancelled``)."""
        self._reload()
        out = []
        for m in self.record.messages:
            msg = {"role": m["role"], "content": m["content"]}
            if m.get("finish_reason"):
                msg["finish_reason"] = m["finish_reason"]
            out.append(msg)
        return out

    @property
    def system(self) -> str:
        """The system prompt (set it to change it; the next turn then re-prefills)."""
        self._reload()
        return self.record.system

    @system.setter
    def system(self, text: str) -> None:
        if not isinstance(text, str):
            raise OptionError(f"invalid system prompt {text!r}: use a string")
        self._update(lambda r: setattr(r, "system", text))

    @property
    def memory(self) -> bool:
        """Whether this conversation's turns read and write semantic memory (default True; kept
        with the conversation). Off: nothing is retrieved into its prompts and nothing it says
        is learned; the engine-wide switch is ``Engine.load(memory=False)`` / ``--no-memory``."""
        self._reload()
        return self.record.memory

    @memory.setter
    def memory(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise OptionError(f"invalid memory {on!r}: use True or False")
        self._update(lambda r: setattr(r, "memory", on))

    @property
    def tool_approvals(self) -> dict[str, str]:
        """Standing answers about MCP tools: tool name -> ``always`` | ``never`` (``reset`` forgets them)."""
        self._reload()
        return dict(self.record.tool_approvals)

    def remember_tool(self, name: str, answer: str) -> None:
        """Keep ``answer`` (``always`` | ``never``) for tool ``name`` in this conversation."""
        if not isinstance(name, str) or not name or answer not in STANDING_ANSWERS:
            raise OptionError(f"invalid tool approval {name!r}: {answer!r}: answer one of {', '.join(STANDING_ANSWERS)}")
        self._update(lambda r: r.tool_approvals.__setitem__(name, answer))

    @property
    def title(self) -> str:
        self._reload()
        return self.record.title

    @title.setter
    def title(self, text: str) -> None:
        self._update(lambda r: setattr(r, "title", " ".join(str(text).split())[:TITLE_CHARS]))

    def info(self) -> ConversationInfo:
        self._reload()
        return self.record.info()

    def render(self, text: str | None = None) -> list[dict]:
        """The messages the model would see for a next turn saying ``text`` (no memory lookup)."""
        self._reload()
        return render(self.record, {"role": "user", "content": text} if text is not None else None)

    def _reload(self) -> None:
        # Another process may have taken a turn; the file is replaced atomically.
        record = self.files.load()
        if record is not None and record.revision != self.record.revision:
            self.record = record

    def _update(self, change: Any) -> None:
        with self._mutex, self.files.lock:
            self._reload()
            change(self.record)
            self.record.updated = time.time()
            self._save()

    # -- writing --------------------------------------------------------------------
    def add(self, role: str, content: str) -> None:
        """Append a message without generating (import a history); the next turn prefills it."""
        if role not in ROLES or not isinstance(content, str):
            raise OptionError(f"invalid message role {role!r} or content: roles are {', '.join(ROLES)}")
        self._update(lambda r: r.messages.append({"role": role, "content": content, "time": time.time()}))

    def reset(self) -> None:
        """Forget the messages, the tool approvals and the snapshot; keep the name and system prompt."""
        with self._mutex, self.files.lock:
            self._reload()
            self.record.messages.clear()
            self.record.tokens = 0
            self.record.title = ""
            self.record.tool_approvals.clear()
            self.record.updated = time.time()
            self._save()
            if not self._p.read_only:
                self.files.snapshots.delete()
            self._drop_cache()

    def delete(self) -> None:
        """Delete the conversation and its files."""
        with self._mutex, self.files.lock:
            self._drop_cache()
            shutil.rmtree(self.files.directory, ignore_errors=True)
            self._p.forget_conversation(self.name)

    @property
    def progress(self) -> Any:
        """The latest ``PrefillProgress`` of the turn in progress (None when there is none
        yet): how much of the prompt is prefilled, for a caller that shows it."""
        turn = self._turn
        return getattr(turn.handle, "progress", None) if turn is not None else None

    def cancel(self) -> None:
        """Stop the turn in progress at the next token (its text so far is kept)."""
        turn = self._turn
        if turn is not None and turn.handle is not None:
            turn.handle.cancel()

    def _save(self) -> None:
        # A read-only data directory keeps the record in memory (Persistence warned once).
        if not self._p.read_only:
            self.files.save(self.record)

    def _drop_cache(self) -> None:
        self._cache, self._cache_tokens, self._snapshot_revision = None, [], ""

    @property
    def busy(self) -> bool:
        """A turn is running (its snapshot must not be evicted meanwhile)."""
        return self._turn is not None

    @property
    def warm_cache(self) -> list | None:
        """The cache kept in memory after the last turn (None when there is none)."""
        return self._cache

    @property
    def warm_bytes(self) -> int:
        """What the warm cache holds: memory, plus a cascade's episodic blocks in memory
        and in spill files (they duplicate the snapshot on disk, so ``warm_mb`` bounds
        them too: the spill directory does not grow with idle conversations)."""
        resident, spilled = cache_block_bytes(self._cache)
        return cache_nbytes(self._cache) + resident + spilled

    def release_warm(self) -> bool:
        """Drop the warm cache if no turn is running (its snapshot is on disk)."""
        if self._turn is None and self._cache is not None and self._mutex.acquire(blocking=False):
            try:
                self._drop_cache()
                return True
            finally:
                self._mutex.release()
        return False

    # -- turns ----------------------------------------------------------------------
    def send(self, text: str, *, role: str = "user", **options: Any) -> GenerationResult:
        """Take a turn and return the reply (``.text``, ``.tokens``, ``.stats``).

        Args:
            text: the user's message.
            role: ``user``, or ``tool``: ``text`` is a tool's result the reply answers
                (no memory lookup or learning; the chat's MCP tools feed results back so).
            **options: generation options, as ``engine.generate``.

        Raises:
            OptionError: bad options; StoreError: the messages could not be stored.
        """
        turns = self._turns(text, options, role)
        try:
            while True:
                next(turns)
        except StopIteration as done:
            return done.value

    def stream(self, text: str, *, role: str = "user", **options: Any) -> Iterator[str | ReasoningPiece | GenerationStats]:
        """Yield the reply's text pieces as they decode (a reasoning model's thinking as
        ``ReasoningPiece``s: it is shown, never stored in the history nor learned from),
        then the turn's ``GenerationStats`` (``role`` as ``send``'s)."""
        result = yield from self._turns(text, options, role)
        yield result.stats

    def _turns(self, text: str, options: dict, role: str = "user") -> Iterator[str]:
        if not isinstance(text, str) or not text.strip():
            raise OptionError(f"invalid message {text!r}: use a non-empty string")
        if role not in ("user", "tool"):
            raise OptionError(f"invalid turn role {role!r}: a turn answers a user or a tool's result")
        check_text(text, "message")  # a lone surrogate: refused here, not as a TypeError in the embedder
        self._mutex.acquire()
        self.files.lock.__enter__()
        turn = None
        try:
            turn = self._begin(text, options, role)
            for piece in turn.handle:
                if turn.first_piece is None:
                    turn.first_piece = time.perf_counter()
                yield piece
            result = turn.handle.result()
            _wait_stored(turn)
            if turn.error is not None:
                raise turn.error
            # What the user waits for: memory lookup, cache restore, queue and prefill.
            first = turn.first_piece or time.perf_counter()
            result.stats.extra["turn_ttft_s"] = round(first - turn.started, 6)
            return result
        finally:
            if turn is not None and turn.handle is not None and not turn.handle.done:
                # The caller left mid-stream: stop the reply, let it be stored, then unlock.
                turn.handle.cancel()
                with contextlib.suppress(Exception):
                    turn.handle.result()
            if turn is not None:
                with contextlib.suppress(Exception):
                    _wait_stored(turn)  # the lock is held until the turn is on disk
            self._turn = None
            self.files.lock.__exit__(None, None, None)
            self._mutex.release()

    def _begin(self, text: str, options: dict, role: str = "user") -> _Turn:
        started = time.perf_counter()
        merged = self.engine.defaults.merged(**options)  # a bad option fails before the warm cache is taken
        self._reload()
        p = self._p
        user: dict = {"role": role, "content": text, "time": time.time()}
        extra: dict = {"conversation": self.name}
        hits = p.retrieve(text) if self.record.memory and role == "user" else []
        # Entries already shown earlier in this conversation are in the context already.
        shown = {i for m in self.record.messages for i in m.get("memory_ids", ())}
        new = [h for h in hits if h.id not in shown]
        if new:
            user["memory"] = p.memory_section(new, text)
            user["memory_ids"] = [h.id for h in new]
        extra["memory"] = {"used": [h.id for h in hits], "added": [h.id for h in new], "learned": [], "updated": []}
        # With tools the template shows them to the model (the calls come back as its reply's text).
        prompt_ids = self.engine.encode(render(self.record, user), tools=merged.tools, think=merged.think)
        # A conversation that passes the context moves from a KV cache to the cascade:
        # only caches of the kind this turn runs under can continue it.
        cascade = self.engine.caches.cascade_for(len(prompt_ids), merged)
        kind = "kv" if cascade is None else "cascade"
        t0 = time.perf_counter()
        cache, cached, source, notes = p.run_exclusive(lambda: self._prepare_cache(prompt_ids, kind, cascade))
        if "cache_switch" in notes:
            context, total = self.engine.loaded.context_length, len(prompt_ids) + merged.max_tokens
            # Either way: a short max_tokens after a long one brings a conversation back to a KV cache.
            how = (f"pass the model's {context}-token context: the conversation moves from its KV cache to the "
                   "memory cascade" if kind == "cascade" else f"fit the model's {context}-token context: the "
                   "conversation moves from the memory cascade to a KV cache")
            notes["cache_switch"] = (f"prompt + max_tokens ({total}) {how} ({notes['cache_switch']} tokens "
                                     "re-prefilled once)")
            log.info("conversation %r: %s", self.name, notes["cache_switch"])
        extra.update(cache_source=source, prepare_s=round(time.perf_counter() - t0, 6), **notes)
        turn = _Turn(user, prompt_ids, cached, started, extra)
        turn.handle = self.engine.submit(
            prompt_ids=prompt_ids[cached:], cache=cache, cached_tokens=cached,
            on_finish=lambda gen: self._finished(turn, gen), cache_key=self.name, cached_ids=prompt_ids[:cached],
            **options,
        )
        self._turn = turn
        return turn

    def _prepare_cache(self, ids: list[int], kind: str = "kv",
                       cascade: CascadeConfig | None = None) -> tuple[list | None, int, str, dict]:
        """[engine thread] The cache of ``kind`` (``kv`` / ``cascade``) sharing the longest
        prefix with ``ids``, cut to it. A kept cache of the other kind is left unused
        (``notes["cache_switch"]``: the tokens it held). A kept cascade continues with
        ``cascade``, the engine's config now, not the one it was saved with (a warm one
        of another config is dropped: the snapshot is restored with this one)."""
        p, notes = self._p, {}
        limit = len(ids) - 1  # at least one token must run to get the next one's logits
        warm, self._cache, warm_tokens = self._cache, None, self._cache_tokens
        self._cache_tokens = []  # the cache is the running turn's now
        candidates: list[tuple[int, str]] = []
        if warm is not None:
            if _kind_of(warm) != kind:
                notes["cache_switch"] = len(warm_tokens)
            elif cascade is not None and warm[0].config != cascade:
                warm = None  # the engine's cascade changed since (``engine.caches.cascade``)
            else:
                candidates.append((min(common_prefix(warm_tokens, ids), limit), "warm"))
        meta = None
        if p.config.snapshots:
            try:
                meta = self.files.snapshots.read_meta()
            except SnapshotError as e:
                notes["snapshot_refused"] = self._refuse(e)
            if meta is not None and meta.kind != kind:
                notes.setdefault("cache_switch", len(meta.tokens))
            elif meta is not None and (warm is None or meta.revision != self._snapshot_revision):
                candidates.append((min(common_prefix(meta.tokens, ids), limit), "snapshot"))
        hit = p.prefix_cache.lookup(ids[:limit], kind=kind) if limit > 0 else None
        if hit is not None:
            candidates.append((hit.tokens, "prefix"))
        for n, source in sorted(candidates, key=lambda c: -c[0]):
            if n <= 0:
                break
            cache = None
            if source == "warm":
                cache = warm if trim_to(warm, n) else None
            elif source == "snapshot":
                try:
                    fp, weights = p.model_identity()
                    meta, cache = self.files.snapshots.load(
                        fingerprint=fp, weights=weights, n_layers=p.n_layers, kind=kind, cascade=cascade
                    )
                    p.counters["restored"] += 1
                    self._snapshot_revision = meta.revision
                    cache = cache if trim_to(cache, n) else None
                except SnapshotError as e:
                    notes["snapshot_refused"] = self._refuse(e)
                    cache = None
            else:
                cache = p.prefix_cache.take(hit, cascade=cascade)
            if cache is not None and cache_offset(cache) == n:
                p.counters[source] += 1
                return cache, n, source, notes
        p.counters["cold"] += 1
        return None, 0, "none", notes

    def _refuse(self, error: Exception) -> str:
        self._p.counters["refused"] += 1
        msg = f"conversation {self.name!r}: snapshot not used ({error}); re-prefilling from the stored messages"
        warnings.warn(msg, SnapshotWarning, stacklevel=4)
        log.warning("%s", msg)
        # Dropped, so this turn's save writes it whole again (a damaged segment of the
        # right size would otherwise be kept as a valid prefix).
        with contextlib.suppress(StoreError):
            self.files.snapshots.delete()
        return str(error)

    def _finished(self, turn: _Turn, gen: Generation) -> None:
        """[engine thread] Capture what needs MLX (the snapshot's new arrays, the shared
        prefix's KV), then hand the storing to the writer (``writer.py``)."""
        p = self._p
        result = gen.result
        assert result is not None
        tokens = turn.prompt_ids[: turn.cached] + list(gen.fed_tokens)
        cache = gen.cache
        if not cache or (result.stats.finish_reason == "cancelled" and cache_offset(cache) != len(tokens)):
            cache = None  # a cancelled request's cache may be gone: the next turn restores the snapshot
        elif cache_offset(cache) != len(tokens):
            log.warning("conversation %r: cache holds %d tokens, expected %d; not kept", self.name, cache_offset(cache), len(tokens))
            cache = None
        pending = None
        if cache is not None:
            try:
                pending = p.prepare_snapshot(self, cache, tokens)
                p.keep_prefix(self, cache, tokens)
            except Exception:  # noqa: BLE001  the messages must still be stored
                log.exception("conversation %r: snapshot not captured; the cache is not kept", self.name)
                cache = None
        turn.stored = p.writer.submit(lambda: self._store(turn, result, tokens, cache, pending))

    def _store(self, turn: _Turn, result: GenerationResult, tokens: list[int], cache: list | None, pending: Any) -> None:
        """[writer thread] Store the turn: messages first, then the snapshot and memory."""
        p = self._p
        stats = result.stats
        now = time.time()
        try:
            self._reload()
            self.record.messages.append(turn.user)
            self.record.messages.append({
                "role": "assistant", "content": result.text, "time": now,
                "finish_reason": stats.finish_reason, "tokens": stats.generation_tokens,
            })
            if not self.record.title and turn.user["role"] == "user":
                self.record.title = " ".join(turn.user["content"].split())[:TITLE_CHARS]
            self.record.tokens, self.record.updated = len(tokens), now
            self._save()
        except StoreError as e:
            turn.error = e  # raised in the caller's thread once the turn ends
            return
        extra = turn.extra
        if cache is not None:
            self._cache, self._cache_tokens = cache, tokens
            extra["snapshot"] = info = p.write_snapshot(self, pending, tokens)
            self._snapshot_revision = info.get("revision", "")
            p.save_prefix()
            p.note_warm(self)
        learned = (p.learn(turn.user["content"], self.name) if self.record.memory and turn.user["role"] == "user"
                   else Learned())
        # Ids only: the text of what the user asked to forget is not kept in the turn's record.
        extra["memory"].update(learned=learned.remembered, forgotten=[e.id for e in learned.forgotten],
                               not_forgotten=learned.not_forgotten, updated=learned.updated,
                               not_remembered=learned.not_remembered)
        stats.extra.update(extra)


__all__ = ["Conversation"]
