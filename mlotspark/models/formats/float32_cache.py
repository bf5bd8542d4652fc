"""A GGUF's weights as the CPU runs them (float32), kept on disk so a later load reads them.

On MLX's CPU backend only float32 reaches BLAS, so every GGUF is widened to float32 at
load: dequantized from its blocks (Q4_0/Q4_1/Q8_0, read by MLX) or cast from the
conversion cache's float16 (``gguf_convert``). That costs ~2-5 ns per weight on one core;
reading the same weights already widened costs what mlx-lm's load of a float32
directory costs. So after a load widens a GGUF for the CPU strategy
(``Runner.float32_cache``), its weights are written here, beside the
conversion cache in ``$MLOTSPARK_HOME/cache/gguf/<id>/``:

- ``float32.safetensors``: the model's parameters by name, float32; a group the strategy
  keeps in one buffer (q/k/v, gate/up: ``execution.fuse_projections``) is one tensor
  named by ``widen.group_key``, so a later load reads it straight into that buffer;
- ``float32.json``: the source's stamp (size, mtime, path), the model config, GGUF
  metadata and tensor types (a later load needs nothing from the GGUF itself), the
  tensors file's size and a check: CRC-32 of its header and of 16 blocks of 64 KiB
  spread over its data.

Disk cost: 4 bytes per parameter (SmolLM2-135M 538 MB, Qwen2.5-Coder-0.5B 2.52 GB,
Gemma 3 270M ~1.07 GB), beside the GGUF and, for formats MLX cannot read, the float16
conversion cache. ``mlotspark list`` shows a model's caches; ``mlotspark rm`` removes
them with the model. ``MLOTSPARK_FLOAT32_CACHE=0`` turns the cache off (loads widen
every time; nothing is written, and an existing cache is not read). Nothing is written
when it would leave less than ``_RESERVE`` of the disk free.

Crash safety: both files are written atomically (temp file, fsync, rename), the JSON
last, so a killed write leaves no entry that looks complete (the next write removes the
temp file it left). An entry whose stamp, size
or check does not match, whose header MLX cannot parse, whose tensors do not fit the
model, or whose data cannot be read is removed and the weights are widened again (and
written again); it is never loaded. Damage outside the sampled blocks goes unseen, as in
the conversion cache.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlotspark import storage
from mlotspark.errors import StoreError
from mlotspark.models.formats import gguf_convert
from mlotspark.models.cpu.widen import group_key

log = logging.getLogger(__name__)

#: Environment variable: ``0`` (or ``off``, ``false``, ``no``) turns the float32 cache off.
ENV = "MLOTSPARK_FLOAT32_CACHE"
FORMAT = 1  # bump when the stored layout changes
TENSORS, INFO = "float32.safetensors", "float32.json"
_BLOCK, _BLOCKS = 64 * 1024, 16
#: Free disk a write must leave: the larger of 2 GiB and 5% of the disk.
_RESERVE = (2 << 30, 0.05)

__all__ = ["ENV", "Cached", "discard", "enabled", "files", "load", "place", "save"]


@dataclass
class Cached:
    """A fresh, intact float32 cache entry, its tensors not read yet (``mx.load`` is lazy).

    Args:
        tensors: parameter name (or fused ``group_key``) -> float32 array.
        config: the model config the weights fit.
        metadata: the GGUF's metadata (plain Python values).
        types: GGUF tensor name -> GGML type name.
        native: whether MLX read the GGUF itself when the cache was written.
        n_params: weights in the model.
    """

    tensors: dict[str, mx.array]
    config: dict[str, Any]
    metadata: dict[str, Any]
    types: dict[str, str]
    native: bool
    n_params: int


def enabled() -> bool:
    """Whether the float32 cache is on (``MLOTSPARK_FLOAT32_CACHE``, default on)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def files(path: Path) -> tuple[Path, Path]:
    """``(tensors, info)`` paths of the float32 cache of the GGUF at ``path``."""
    entry = gguf_convert.cache_dir(path)
    return entry / TENSORS, entry / INFO


def _lock(path: Path) -> storage.FileLock:
    entry = gguf_convert.cache_dir(path)
    return storage.FileLock(entry.parent / f".{entry.name}.lock")  # the conversion cache's lock


def _stamp(path: Path) -> dict[str, Any]:
    st = Path(path).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "source": str(Path(path).resolve())}


def _check(file: Path) -> str:
    """CRC-32 of the file's size, its safetensors header and ``_BLOCKS`` sampled blocks."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        header = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        crc = zlib.crc32(str(size).encode())
        first = min(size, 8 + header, 16 << 20)  # a damaged length must not read the whole file
        f.seek(0)
        crc = zlib.crc32(f.read(first), crc)
        span = max(0, size - first - _BLOCK)
        for i in range(_BLOCKS):
            f.seek(first + span * i // max(1, _BLOCKS - 1))
            crc = zlib.crc32(f.read(_BLOCK), crc)
    return f"{crc:08x}"


def discard(path: Path) -> None:
    """Remove the float32 cache of ``path`` (info first: a half-removed entry is no entry)."""
    tensors, info = files(path)
    for f in (info, tensors):
        try:
            f.unlink(missing_ok=True)
        except OSError as e:
            log.warning("cannot remove %s: %s", f, e.strerror or e)


def load(path: Path) -> Cached | None:
    """The float32 cache of the GGUF at ``path`` when it is fresh and intact, else None.

    An entry that is there but stale or damaged (see the module docstring) is removed,
    so the caller widens the weights again and writes a new one.
    """
    tensors, info = files(path)
    if not info.is_file():
        return None
    with _lock(path):
        try:
            doc = json.loads(info.read_text(encoding="utf-8"))
            fresh = (doc.get("format") == FORMAT and doc.get("stamp") == _stamp(path)
                     and tensors.stat().st_size == doc.get("bytes") and _check(tensors) == doc.get("check"))
            if fresh:
                arrays = mx.load(str(tensors))
                if all(a.dtype == mx.float32 for a in arrays.values()):
                    return Cached(arrays, dict(doc["config"]), dict(doc["metadata"]), dict(doc["types"]),
                                  bool(doc["native"]), int(doc["n_params"]))
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError, struct.error) as e:
            log.info("float32 cache of %s is unreadable (%s): widening again", path, e)
        discard(path)
        return None


def place(model: nn.Module, tensors: dict[str, mx.array]) -> None:
    """Put the cached ``tensors`` into ``model`` (dense layers, fresh from its config) and
    read them; a fused group's members become row views of its one buffer.

    Raises:
        ValueError: the tensors do not fit the model (names, shapes).
        RuntimeError: MLX could not read the data.
    """
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    weights: dict[str, mx.array] = {}
    for key, arr in tensors.items():
        if "|" not in key:
            weights[key] = arr
            continue
        start = 0
        for name in key.split("|"):
            if name not in shapes:
                raise ValueError(f"fused tensor {key!r} names {name!r}, which the model does not have")
            rows = shapes[name][0]
            weights[name] = arr[start:start + rows]  # a view of the one buffer
            start += rows
        if start != arr.shape[0]:
            raise ValueError(f"fused tensor {key!r} has {arr.shape[0]} rows, its members {start}")
    if hasattr(model, "sanitize"):
        # Sanitized once already (a no-op on its own output, as mlx-lm's loads rely on), but
        # some classes set themselves up in it: Gemma 3 drops its lm_head when tied.
        weights = model.sanitize(weights)
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())


def _room(directory: Path, need: int) -> bool:
    usage = shutil.disk_usage(directory)
    return usage.free - need >= max(_RESERVE[0], _RESERVE[1] * usage.total)


def save(path: Path, model: nn.Module, fused: dict[str, mx.array], *, config: dict, metadata: dict,
         types: dict[str, str], native: bool) -> int:
    """Write ``model``'s float32 weights as the float32 cache of the GGUF at ``path``.

    Args:
        path: the GGUF file the weights came from.
        model: the widened model (every floating parameter float32).
        fused: buffers of groups widened into one (``widen.widen``), by ``group_key``;
            each is stored once, in place of its members.
        config, metadata, types, native: what a later load needs instead of the GGUF.

    Returns:
        Bytes written; 0 when the disk has no room for it (nothing written).

    Raises:
        StoreError: the files cannot be written (the previous entry, if any, is gone).
    """
    params = dict(tree_flatten(model.parameters()))
    for key, whole in fused.items():
        members = key.split("|")
        if all(m in params for m in members) and key == group_key([m[: -len(".weight")] for m in members]):
            for m in members:
                del params[m]
            params[key] = whole
    need = sum(v.nbytes for v in params.values())
    tensors, info = files(path)
    entry = tensors.parent
    storage.ensure_dir(entry)
    if not _room(entry, need):
        log.info("no room for the float32 cache of %s (%.0f MB): not written", path, need / 1e6)
        return 0
    doc = {"format": FORMAT, "stamp": _stamp(path), "n_params": sum(v.size for v in params.values()),
           "native": native, "config": config, "types": types,
           "metadata": {k: v.tolist() if isinstance(v, mx.array) else v for k, v in metadata.items()}}
    try:
        json.dumps(doc)  # fails before anything is written
    except (TypeError, ValueError) as e:
        raise StoreError(f"cannot write the float32 cache of {path}: metadata is not JSON ({e})") from e
    with _lock(path):
        discard(path)  # a stale entry must not outlive a failed write
        for name in (TENSORS, INFO):  # temp files a killed writer left (writers hold this lock)
            for left in entry.glob(f".{name}.*"):
                left.unlink(missing_ok=True)
        try:
            with storage.atomic_path(tensors) as tmp:
                mx.save_safetensors(str(tmp), params)  # a name ending in .safetensors is kept as is
        except (RuntimeError, ValueError) as e:
            raise StoreError(f"cannot write the float32 cache {tensors}: {e}") from e
        doc.update(bytes=tensors.stat().st_size, check=_check(tensors))
        storage.atomic_write(info, json.dumps(doc, ensure_ascii=False))
    return doc["bytes"]
