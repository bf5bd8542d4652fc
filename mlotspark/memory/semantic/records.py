"""What a memory entry is, which values it accepts, and its JSON (export) form."""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlotspark.errors import OptionError, StoreError
from mlotspark.options import check_text

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_TEXT_CHARS = 2000  # an entry is a fact, not a document; keeps the prompt section short
MAX_META_BYTES = 16384
EXPORT_FORMAT = "mlotspark-semantic-memory"
EXPORT_VERSION = 2  # 2: entries carry id, superseded_by and superseded (1 had neither: read as all current)


@dataclass(frozen=True)
class Entry:
    """One remembered text.

    Attributes:
        id: stable id (never reused after ``forget``).
        text: the text as remembered.
        source: who stated it: "user" (default), "turn" (extracted), "import", ...
        conversation: the conversation it came from, if any.
        meta: free JSON-serialisable metadata.
        created: Unix time it was first remembered.
        superseded_by: the id of a newer entry about the same thing ("I moved to
            Porto" after "I live in Utrecht"), None while this one is current.
        superseded: Unix time it was superseded, None while current.
    """

    id: int
    text: str
    source: str = "user"
    conversation: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0
    superseded_by: int | None = None
    superseded: float | None = None

    @property
    def current(self) -> bool:
        """Whether no newer entry has replaced this one."""
        return self.superseded_by is None


@dataclass(frozen=True)
class Hit:
    """A search result.

    Attributes:
        entry: the entry found.
        score: combined score in [0, 1] (see ``store``'s docstring).
        vector: cosine similarity (negative clipped to 0).
        lexical: normalised lexical score.
    """

    entry: Entry
    score: float
    vector: float
    lexical: float

    @property
    def id(self) -> int:
        return self.entry.id

    @property
    def text(self) -> str:
        return self.entry.text


@dataclass(frozen=True)
class NewEntry:
    """A checked entry on its way in (from ``remember`` or an import file).

    An exported entry also carries its id in the file (``ref``) and, when superseded,
    the file id of the entry that replaced it and when, so an import keeps the history.
    """

    text: str
    source: str
    conversation: str | None
    meta_json: str
    created: float
    ref: int | None = None
    superseded_by: int | None = None
    superseded: float | None = None


ENTRY_COLUMNS = "id, text, source, conversation, meta, created, superseded_by, superseded"


def entry_from_row(row: tuple[Any, ...]) -> Entry:
    """An ``Entry`` from a row of ``SELECT {ENTRY_COLUMNS}``."""
    try:
        meta = json.loads(row[4]) if row[4] else {}
    except ValueError:
        meta = {}  # one hand-edited row must not make the whole store unreadable
    return Entry(id=row[0], text=row[1], source=row[2], conversation=row[3], meta=meta, created=row[5],
                 superseded_by=row[6], superseded=row[7])


def check_int(value: Any, what: str, low: int = 0) -> int:
    """``value`` if it is an int >= ``low`` (not a bool), else OptionError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:  # SQLite INTEGER
        raise OptionError(f"invalid {what} {value!r}: use an integer from {low} to {2**63 - 1}")
    return value


def check_unit(value: Any, what: str) -> float:
    """``value`` as a float if it is a number in [0, 1], else OptionError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise OptionError(f"invalid {what} {value!r}: use a number in [0, 1]")
    return float(value)


def check_entry(
    text: Any,
    source: Any = "user",
    conversation: Any = None,
    meta: Any = None,
    created: Any = None,
) -> NewEntry:
    """Check the fields of an entry to store.

    Args:
        text: non-empty string, at most ``MAX_TEXT_CHARS`` once stripped.
        source: string of 1-64 characters.
        conversation: None or a string of 1-256 characters.
        meta: None or a JSON-serialisable dict (at most ``MAX_META_BYTES`` as JSON).
        created: None (now) or a finite Unix time.

    Returns:
        The checked entry, text stripped and meta encoded.

    Raises:
        OptionError: naming the bad value.
    """
    if isinstance(text, str):
        check_text(text, "memory text")  # a lone surrogate: OptionError, not a failed write
    if not isinstance(text, str) or not _CONTROL.sub(" ", text).strip():
        raise OptionError(f"invalid memory text {text!r}: use a non-empty string")
    text = _CONTROL.sub(" ", text).strip()  # NUL and other invisible controls: a fact has none
    if len(text) > MAX_TEXT_CHARS:
        raise OptionError(f"memory text {text[:40]!r}... is {len(text)} characters; at most {MAX_TEXT_CHARS}")
    if not isinstance(source, str) or not 1 <= len(source) <= 64:
        raise OptionError(f"invalid memory source {source!r}: use a string of 1-64 characters")
    if conversation is not None and (not isinstance(conversation, str) or not 1 <= len(conversation) <= 256):
        raise OptionError(f"invalid conversation {conversation!r}: use a string of 1-256 characters")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise OptionError(f"invalid memory meta {meta!r}: use a dict")
    try:
        meta_json = json.dumps(meta, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise OptionError(f"invalid memory meta {meta!r}: not JSON-serialisable ({e})") from e
    if len(meta_json.encode("utf-8")) > MAX_META_BYTES:
        raise OptionError(f"memory meta is {len(meta_json)} bytes of JSON; at most {MAX_META_BYTES}")
    created = check_time(time.time() if created is None else created, "created time")
    return NewEntry(text, source, conversation, meta_json, created)


# Times an entry may carry: 1900 to 9999 (an imported 1e308 had made every `memory list` fail).
_EARLIEST, _LATEST = -2_208_988_800.0, 253_402_300_799.0


def check_time(value: Any, name: str) -> float:
    """``value`` as a Unix time between 1900 and 9999, or ``OptionError`` naming it."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not _EARLIEST <= value <= _LATEST):
        raise OptionError(f"invalid {name} {value!r}: use a Unix time between 1900 and 9999")
    return float(value)


def export_document(entries: list[Entry]) -> dict[str, Any]:
    """The JSON document ``export_json`` writes (no vectors: they belong to an embedder).

    Args:
        entries: the entries, in id order.

    Returns:
        ``{"format", "version", "exported", "entries": [{id, text, source, conversation, meta, created,
        superseded_by, superseded}]}``: ids only link entries within the file (an import gives new ones).
    """
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported": time.time(),
        "entries": [
            {"id": e.id, "text": e.text, "source": e.source, "conversation": e.conversation, "meta": e.meta,
             "created": e.created, "superseded_by": e.superseded_by, "superseded": e.superseded}
            for e in entries
        ],
    }


def parse_import(path: Path, doc: Any) -> list[NewEntry]:
    """Check an import document: an ``export_document`` or a plain list of strings.

    Args:
        path: where it came from (for messages).
        doc: the parsed JSON.

    Returns:
        The entries to add; their source defaults to "import".

    Raises:
        StoreError: wrong format, or a bad entry (its index and value are named).
    """
    if isinstance(doc, dict) and doc.get("format", EXPORT_FORMAT) != EXPORT_FORMAT:
        raise StoreError(f"cannot import {path}: format {doc.get('format')!r}, expected {EXPORT_FORMAT!r}")
    version = doc.get("version", 1) if isinstance(doc, dict) else 1
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= EXPORT_VERSION:
        raise StoreError(f"cannot import {path}: version {version!r}; this mlotspark reads 1 to {EXPORT_VERSION}")
    items = doc.get("entries") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise StoreError(f"cannot import {path}: expected a list of entries or {{'entries': [...]}}")
    parsed: list[NewEntry] = []
    refs: set[int] = set()
    for i, item in enumerate(items):
        try:
            if isinstance(item, str):
                item = {"text": item}
            if not isinstance(item, dict):
                raise OptionError(f"expected a string or an object, got {item!r}")
            new = check_entry(
                item.get("text"),
                item.get("source", "import"),
                item.get("conversation"),
                item.get("meta"),
                item.get("created"),
            )
            ref, by, when = (item.get(k) for k in ("id", "superseded_by", "superseded"))
            ref = None if ref is None else check_int(ref, "id")
            if ref is not None and ref in refs:
                raise OptionError(f"id {ref} is used twice in the file")
            by = None if by is None else check_int(by, "superseded_by")
            when = None if when is None else check_time(when, "superseded time")
            if ref is not None:
                refs.add(ref)
                new = replace(new, ref=ref, superseded_by=by, superseded=when)
            parsed.append(new)
        except OptionError as e:
            raise StoreError(f"cannot import {path}: entries[{i}]: {e}") from e
    # A loop of updates ("1 superseded by 2", "2 superseded by 1") would leave no value current.
    by_ref = {e.ref: e.superseded_by for e in parsed if e.ref is not None}
    for start in by_ref:
        seen, ref = set(), start
        while ref in by_ref and by_ref[ref] is not None:
            if ref in seen:
                raise StoreError(f"cannot import {path}: entry {start} is superseded in a loop ({sorted(seen)})")
            seen.add(ref)
            ref = by_ref[ref]
    return parsed
