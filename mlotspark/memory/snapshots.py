"""Episodic snapshots: a conversation's KV / cascade state on disk (DESIGN §4, §6).

A snapshot directory holds ``snapshot.json`` and segment files::

    snapshot.json                          what the snapshot covers (see SnapshotMeta)
    kv-00000000-00000412-3fa9c1.safetensors  tokens [0, 412) of every layer
    kv-00000412-00000530-8d01be.safetensors  tokens [412, 530): the next turn

Conversations only grow, so a ``kv`` snapshot appends one segment per turn (the
turn's tokens, a few MB) instead of rewriting the history (~46 KB per token for
the default model in float32); after ``MAX_SEGMENTS`` it is rewritten whole. A
``cascade`` state is always one segment. Segments are written first, each
atomically, then ``snapshot.json`` atomically, and only then unreferenced files
are removed: a kill at any instant leaves the previous or the new snapshot whole.

The JSON names the model (fingerprint and weight format: KV made by other weights
is refused, never used), the token ids covered, the cache kind and config, and each
segment's size and sha256, so a truncated or corrupt file is refused at load.

Files are written in the safetensors format by a small numpy writer rather than
``mx.save_safetensors``: the bytes are hashed as they are written, and writing
needs no MLX call, so it can run without a model (the kill test) or off the
engine thread. ``mx.load`` reads the files too.

The caller holds the conversation's lock while saving (``storage.FileLock``).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import struct
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from mlotspark.memory.cascade import CascadeConfig
from mlotspark.memory.kv_state import CacheState, cache_kind, capture, evaluate, restore
from mlotspark.errors import SnapshotError, StoreError
from mlotspark.storage import atomic_path, check_no_symlinks, ensure_dir, write_json

FORMAT = "mlotspark-snapshot"
VERSION = 1
META_FILE = "snapshot.json"
MAX_SEGMENTS = 16  # past it the next save rewrites one segment: restore reads few files

_TAGS = {
    np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64",
    np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.int16): "I16",
    np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32",
    np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64", np.dtype(np.bool_): "BOOL",
}
_NP = {tag: dt for dt, tag in _TAGS.items()}
_NP["BF16"] = np.dtype(np.uint16)  # numpy has no bfloat16: carried as raw 2-byte words


class SnapshotWarning(UserWarning):
    """A snapshot was refused (other model, corrupt, truncated); the turn re-prefills."""


# ------------------------------------------------------------ safetensors I/O
def _to_numpy(a: Any) -> tuple[np.ndarray, str]:
    if isinstance(a, np.ndarray):
        if a.dtype not in _TAGS:
            raise SnapshotError(f"cannot store numpy dtype {a.dtype}")
        return np.ascontiguousarray(a), _TAGS[a.dtype]
    if a.dtype == mx.bfloat16:
        return np.ascontiguousarray(np.array(a.view(mx.uint16))), "BF16"
    arr = np.ascontiguousarray(np.array(a))  # MLX slices come out strided
    if arr.dtype not in _TAGS:
        raise SnapshotError(f"cannot store array dtype {a.dtype}")
    return arr, _TAGS[arr.dtype]


def _to_mx(arr: np.ndarray, tag: str) -> mx.array:
    out = mx.array(arr)
    return out.view(mx.bfloat16) if tag == "BF16" else out


def write_safetensors(path: Path, arrays: dict[str, Any], metadata: dict[str, str] | None = None) -> tuple[int, str]:
    """Write ``arrays`` (numpy or MLX) to ``path`` atomically (mode 0600).

    Returns:
        ``(bytes written, sha256 hex of the file)``.

    Raises:
        StoreError: the write failed (disk full, permissions); the old file is intact.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name, a in arrays.items():
        arr, tag = _to_numpy(a)
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        blobs.append(arr)
        offset += arr.nbytes
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as the format advises
    digest = hashlib.sha256()
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            for chunk in (struct.pack("<Q", len(head)), head, *(memoryview(b.reshape(-1).view(np.uint8)) for b in blobs)):
                digest.update(chunk)
                f.write(chunk)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror or e}") from e
    return 8 + len(head) + offset, digest.hexdigest()


def parse_safetensors(data: bytes, what: str = "file") -> dict[str, tuple[np.ndarray, str]]:
    """Arrays (numpy views of ``data``) and dtype tags of a safetensors blob.

    Raises:
        SnapshotError: not a well-formed safetensors blob.
    """
    try:
        (n,) = struct.unpack_from("<Q", data, 0)
        if not 0 < n <= len(data) - 8:
            raise ValueError(f"header length {n}")
        header = json.loads(data[8 : 8 + n])
        base, out = 8 + n, {}
        for name, spec in header.items():
            if name == "__metadata__":
                continue
            tag, shape, (lo, hi) = spec["dtype"], tuple(int(d) for d in spec["shape"]), spec["data_offsets"]
            dt = _NP[tag]
            if not 0 <= lo <= hi <= len(data) - base or hi - lo != int(np.prod(shape)) * dt.itemsize:
                raise ValueError(f"tensor {name!r} offsets {lo}..{hi} do not fit")
            out[name] = (np.frombuffer(data, dtype=dt, count=(hi - lo) // dt.itemsize, offset=base + lo).reshape(shape), tag)
        return out
    except (struct.error, ValueError, KeyError, TypeError) as e:
        raise SnapshotError(f"corrupt {what}: {e}") from e


def write_state(path: Path, state: CacheState) -> tuple[int, str]:
    """Write a ``CacheState``'s arrays as ``"<layer>.<name>"`` tensors; per-layer meta
    is the caller's to keep (in its JSON). Returns ``(bytes, sha256)``."""
    arrays = {f"{i}.{name}": a for i, (layer, _) in enumerate(state.layers) for name, a in layer.items()}
    return write_safetensors(path, arrays, {"format": FORMAT, "kind": state.kind})


def read_state(
    path: Path, *, kind: str, start: int, end: int, n_layers: int, size: int, sha256: str,
    config: dict | None = None, layer_meta: Sequence[dict] = (),
) -> CacheState:
    """Read what ``write_state`` wrote, checking its size and sha256 first.

    Raises:
        SnapshotError: a missing, truncated or corrupt file, or unexpected tensors.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SnapshotError(f"snapshot file {path} is missing or unreadable: {e.strerror or e}") from e
    if len(data) != size:
        raise SnapshotError(f"snapshot file {path} is truncated: {len(data)} of {size} bytes")
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SnapshotError(f"snapshot file {path} is corrupt (sha256 mismatch)")
    layers: list[tuple[dict[str, mx.array], dict]] = [({}, {}) for _ in range(n_layers)]
    for key, (arr, tag) in parse_safetensors(data, f"snapshot file {path}").items():
        index, _, name = key.partition(".")
        if not index.isdigit() or int(index) >= n_layers or not name:
            raise SnapshotError(f"snapshot file {path} has an unexpected tensor {key!r}")
        layers[int(index)][0][name] = _to_mx(arr, tag)
    if kind != "kv":
        if len(layer_meta) != n_layers:
            raise SnapshotError(f"snapshot file {path}: per-layer metadata for {len(layer_meta)} of {n_layers} layers")
        layers = [(arrays, dict(m)) for (arrays, _), m in zip(layers, layer_meta)]
    return CacheState(kind, layers, start, end, dict(config or {}))


# ------------------------------------------------------------------ metadata
@dataclass
class Segment:
    """One segment file: tokens ``[start, end)``, its size and sha256."""

    file: str
    start: int
    end: int
    bytes: int
    sha256: str


@dataclass
class SnapshotMeta:
    """What ``snapshot.json`` says (everything but the arrays)."""

    fingerprint: str
    weights: str
    kind: str
    n_layers: int
    tokens: list[int]
    segments: list[Segment]
    config: dict = field(default_factory=dict)
    layer_meta: list[dict] = field(default_factory=list)  # per layer (cascade); [] for kv
    model: str = ""
    revision: str = ""
    updated: float = 0.0

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> "SnapshotMeta":
        """Parse and check a ``snapshot.json`` document.

        Raises:
            SnapshotError: not a snapshot, a newer version, or inconsistent fields.
        """
        try:
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ValueError("not a snapshot")
            if doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version')!r}, this mlotspark reads {VERSION}")
            segs = [Segment(str(s["file"]), int(s["start"]), int(s["end"]), int(s["bytes"]), str(s["sha256"])) for s in doc["segments"]]
            meta = cls(
                fingerprint=str(doc["fingerprint"]), weights=str(doc["weights"]), kind=str(doc["kind"]),
                n_layers=int(doc["n_layers"]), tokens=[int(t) for t in doc["tokens"]], segments=segs,
                config=dict(doc.get("config") or {}), layer_meta=list(doc.get("layer_meta") or []),
                model=str(doc.get("model", "")), revision=str(doc.get("revision", "")), updated=float(doc.get("updated", 0)),
            )
            pos = 0
            for s in segs:
                if s.start != pos or s.end <= s.start or "/" in s.file or s.file.startswith("."):
                    raise ValueError(f"bad segment {s.file!r} [{s.start}, {s.end})")
                pos = s.end
            if pos != len(meta.tokens) or not segs:
                raise ValueError(f"segments cover {pos} tokens, the snapshot lists {len(meta.tokens)}")
            return meta
        except (KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"corrupt snapshot {where}: {e}") from e


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# --------------------------------------------------------------------- store
@dataclass
class PendingSave:
    """A snapshot captured on the engine thread, waiting to be written (``SnapshotStore.prepare``)."""

    state: CacheState
    keep: list[Segment]


class SnapshotStore:
    """A snapshot directory (see the module docstring).

    Args:
        directory: where the snapshot lives (created 0700 on first save).
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.meta_path = self.directory / META_FILE

    def exists(self) -> bool:
        return self.meta_path.is_file()

    def read_meta(self) -> SnapshotMeta | None:
        """The snapshot's metadata, or None when there is none.

        Raises:
            SnapshotError: the metadata is unreadable or inconsistent.
        """
        try:
            doc = json.loads(self.meta_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise SnapshotError(f"corrupt snapshot {self.meta_path}: {e}") from e
        return SnapshotMeta.from_json(doc, str(self.meta_path))

    @staticmethod
    def check_model(meta: SnapshotMeta, fingerprint: str, weights: str, where: str = "") -> None:
        """Refuse a snapshot made by another model or weight format.

        Raises:
            SnapshotError: naming both fingerprints / formats.
        """
        if meta.fingerprint != fingerprint:
            raise SnapshotError(
                f"snapshot {where} was made by another model ({meta.model or '?'}, fingerprint "
                f"{meta.fingerprint}); the loaded model's fingerprint is {fingerprint}"
            )
        if meta.weights != weights:
            raise SnapshotError(
                f"snapshot {where} was made with {meta.weights} weights; the model runs {weights} "
                "(its KV would differ slightly, so it is not reused)"
            )

    # -- saving -----------------------------------------------------------------
    def plan(self, tokens: Sequence[int], kind: str, fingerprint: str, weights: str) -> tuple[list[Segment], int]:
        """Which existing segments stay valid for ``tokens``, and where the new one starts."""
        try:
            old = self.read_meta()
        except SnapshotError:
            old = None  # rewritten whole below
        if old is None or kind != "kv" or old.kind != "kv" or old.fingerprint != fingerprint or old.weights != weights:
            return [], 0
        shared = common_prefix(old.tokens, tokens)
        keep = [s for s in old.segments if s.end <= shared and _size(self.directory / s.file) == s.bytes]
        if len(keep) >= MAX_SEGMENTS or any(a.end != b.start for a, b in zip(keep, keep[1:])):
            return [], 0
        return keep, keep[-1].end if keep else 0

    def save(self, cache: Sequence[Any], tokens: Sequence[int], *, fingerprint: str, weights: str, model: str = "") -> SnapshotMeta:
        """Save ``cache``, which holds exactly ``tokens`` (engine thread: it reads MLX arrays).

        Raises:
            SnapshotError: the cache does not hold ``len(tokens)`` tokens, or cannot be saved.
            StoreError: a write failed; the previous snapshot stays readable.
        """
        pending = self.prepare(cache, tokens, fingerprint=fingerprint, weights=weights)
        return self.write(pending.state, tokens, pending.keep, fingerprint=fingerprint, weights=weights, model=model)

    def prepare(self, cache: Sequence[Any], tokens: Sequence[int], *, fingerprint: str, weights: str) -> "PendingSave":
        """[engine thread] The MLX half of ``save``: the new segment's arrays, evaluated, and
        the segments that stay; ``write`` (no MLX call) can then run on any thread.

        Raises:
            SnapshotError: the cache does not hold ``len(tokens)`` tokens, or cannot be saved.
        """
        kind = cache_kind(cache)
        keep, start = self.plan(tokens, kind, fingerprint, weights)
        state = capture(cache, start)
        if state.end != len(tokens):
            raise SnapshotError(f"the cache holds {state.end} tokens, the conversation {len(tokens)}")
        evaluate(state)
        return PendingSave(state, keep)

    def write(
        self, state: CacheState, tokens: Sequence[int], keep: list[Segment], *, fingerprint: str, weights: str, model: str = ""
    ) -> SnapshotMeta:
        """Write ``state`` (a segment after ``keep``) and the new metadata; drop stale files.

        Arrays may be numpy or MLX (MLX ones must be evaluated).
        """
        ensure_dir(self.directory)
        segments = list(keep)
        if state.end > state.start or not segments:
            name = f"{state.kind}-{state.start:08d}-{state.end:08d}-{secrets.token_hex(3)}.safetensors"
            size, digest = write_state(self.directory / name, state)
            segments.append(Segment(name, state.start, state.end, size, digest))
        meta = SnapshotMeta(
            fingerprint=fingerprint, weights=weights, kind=state.kind, n_layers=len(state.layers),
            tokens=[int(t) for t in tokens], segments=segments, config=dict(state.config),
            layer_meta=[m for _, m in state.layers] if state.kind != "kv" else [],
            model=model, revision=secrets.token_hex(8), updated=time.time(),
        )
        write_json(self.meta_path, meta.to_json())
        self._remove_stale({s.file for s in segments})
        return meta

    def _remove_stale(self, live: set[str]) -> None:
        # Safe under the conversation lock: no other writer has files in flight here.
        for p in self.directory.iterdir():
            if p.name != META_FILE and p.name not in live and (p.suffix in (".safetensors", ".tmp") or p.name.startswith(".")):
                try:
                    p.unlink()
                except OSError:
                    pass

    # -- loading ----------------------------------------------------------------
    def _read_segment(self, meta: SnapshotMeta, seg: Segment) -> CacheState:
        return read_state(
            self.directory / seg.file, kind=meta.kind, start=seg.start, end=seg.end, n_layers=meta.n_layers,
            size=seg.bytes, sha256=seg.sha256, config=meta.config, layer_meta=meta.layer_meta,
        )

    def load(
        self, *, fingerprint: str, weights: str, n_layers: int | None = None, kind: str | None = None,
        cascade: CascadeConfig | None = None,
    ) -> tuple[SnapshotMeta, list]:
        """Restore the cache from disk.

        Args:
            fingerprint, weights: the loaded model's; anything else is refused.
            n_layers: the model's layer count (checked when given).
            kind: the cache kind the engine runs (``kv`` / ``cascade``; checked when given).
            cascade: the ``CascadeConfig`` a cascade snapshot continues with (the
                engine's now); None = the one it was saved with (``kv_state.restore``).

        Returns:
            ``(meta, cache)``: the per-layer caches hold ``meta.tokens``.

        Raises:
            SnapshotError: no snapshot, another model, or a missing, truncated or corrupt file.
        """
        meta = self.read_meta()
        if meta is None:
            raise SnapshotError(f"no snapshot in {self.directory}")
        self.check_model(meta, fingerprint, weights, str(self.meta_path))
        if kind is not None and meta.kind != kind:
            raise SnapshotError(f"snapshot {self.meta_path} holds a {meta.kind} cache; the engine runs {kind}")
        if n_layers is not None and meta.n_layers != n_layers:
            raise SnapshotError(f"snapshot {self.meta_path} has {meta.n_layers} layers, the model {n_layers}")
        cache = restore([self._read_segment(meta, s) for s in meta.segments], cascade=cascade)
        got = int(getattr(cache[0], "offset", -1))
        if got != len(meta.tokens):
            raise SnapshotError(f"snapshot {self.meta_path} restored {got} tokens, it lists {len(meta.tokens)}")
        return meta, cache

    # -- housekeeping -----------------------------------------------------------
    def nbytes(self) -> int:
        """Bytes on disk."""
        try:
            return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())
        except OSError:
            return 0

    def delete(self) -> None:
        """Remove the snapshot (the metadata first, so a kill never leaves a half one in use).

        Raises:
            StoreError: it cannot be deleted, or lies behind a symbolic link planted in
                the data directory (nothing outside it is deleted).
        """
        check_no_symlinks(self.meta_path)
        try:
            self.meta_path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StoreError(f"cannot delete snapshot {self.meta_path}: {e.strerror or e}") from e
        shutil.rmtree(self.directory, ignore_errors=True)


__all__ = [
    "FORMAT",
    "MAX_SEGMENTS",
    "PendingSave",
    "Segment",
    "SnapshotMeta",
    "SnapshotStore",
    "SnapshotWarning",
    "common_prefix",
    "parse_safetensors",
    "read_state",
    "write_safetensors",
    "write_state",
]
