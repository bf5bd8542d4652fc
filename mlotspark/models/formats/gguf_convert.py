"""GGUF files MLX cannot unpack itself: read with llama.cpp's ``gguf`` package, cache.

MLX's own reader (``mx.load``) handles F32/F16/Q4_0/Q4_1/Q8_0 only; a Q4_K_M file
(the file most GGUF repositories publish first) mixes Q4_K, Q6_K, Q5_0 and Q8_0
tensors and fails there as a whole. Such files are read with gguf-py's memory-mapped
``GGUFReader`` and every tensor is dequantized by ``gguf.quants.dequantize`` (NumPy;
we write no block decoder of our own).

Dequantizing a 250 MB file takes seconds, so the result is cached under
``$MLOTSPARK_HOME/cache/gguf/<id>/`` (the entry also holds the built tokenizer and, on
the CPU, the float32 cache: ``models/formats/float32_cache.py``; ``mlotspark rm`` removes it with
the model): ``tensors.safetensors`` (quantized tensors as
float16, which holds a K-quant's values to ~1e-3 relative, far below its own
quantization error; float tensors as stored) and ``meta.json`` (the GGUF metadata,
tensor types, and the source's size and mtime). A GGUF whose size or mtime changed
is converted again. Both files are written atomically, ``meta.json`` last, so a
killed conversion leaves no entry that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from mlotspark import steps, storage
from mlotspark.errors import ModelFormatError, StoreError
from mlotspark.models.hub.wheel_pull import progress_bar, show_progress

#: Formats MLX's own GGUF reader unpacks (``mx.load``): the fast path.
MLX_NATIVE = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0"})
_FLOAT_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
CACHE_FORMAT = 1  # bump when the cached layout changes


@dataclass
class ConvertedGGUF:
    """A GGUF file's tensors (GGUF names, dequantized) and metadata.

    Args:
        tensors: GGUF tensor name -> array (float16 for quantized origins, else as stored).
        metadata: GGUF key -> Python value (strings, numbers, lists).
        types: GGUF tensor name -> GGML type name (``Q4_K`` ...).
        from_cache: whether the tensors came from the conversion cache.
        seconds: time spent reading (and converting).
    """

    tensors: dict[str, mx.array]
    metadata: dict[str, Any]
    types: dict[str, str]
    from_cache: bool = False
    seconds: float = 0.0


class _Reader(GGUFReader):
    """``GGUFReader`` that checks every tensor before mapping it, and parses faster.

    The stock reader fails on a truncated file with NumPy's "cannot reshape array"
    and on an unknown type with an enum error, neither naming the tensor; the checks
    here name the file, the tensor and the type. Slicing a plain ndarray view of the
    memory map instead of the ``np.memmap`` itself skips memmap's per-slice Python
    hooks: 3x faster on a 262k-token vocabulary (12 s -> 3.6 s here).
    """

    def __init__(self, path: Path):
        self._path = Path(path)
        super().__init__(path)

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mm: np.memmap) -> None:
        self._mmap = mm  # keeps the mapping alive
        self._plain = mm.view(np.ndarray)

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        size = len(self._plain)
        for f in fields:
            _len, name_data, _n_dims, dims, raw_dtype, offset = f.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                qtype = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise ModelFormatError(
                    f"{self._path}: tensor {name!r} has unknown GGML quantization type {int(raw_dtype[0])} "
                    f"(gguf {_gguf_version()} knows {', '.join(t.name for t in GGMLQuantizationType)})"
                ) from None
            block, type_size = GGML_QUANT_SIZES[qtype]
            n = int(np.prod(dims))
            if n % block:
                raise ModelFormatError(
                    f"{self._path}: tensor {name!r} ({qtype.name}) has {n} elements, not a multiple of its block of {block}"
                )
            end = int(start_offs + offset[0]) + n * type_size // block
            if end > size:
                raise ModelFormatError(
                    f"{self._path}: tensor {name!r} ({qtype.name}) is truncated: it ends at byte {end} "
                    f"but the file has {size} bytes"
                )
        super()._build_tensors(start_offs, fields)


def open_reader(path: Path) -> GGUFReader:
    """Open ``path`` with gguf-py's reader.

    Raises:
        ModelFormatError: not GGUF, an unsupported version, a truncated or unknown tensor.
    """
    try:
        return _Reader(path)
    except ModelFormatError:
        raise
    except (ValueError, IndexError, OSError, KeyError) as e:
        raise ModelFormatError(f"cannot read GGUF {path}: {e}") from e


class _Header(GGUFReader):
    """``GGUFReader`` that stops at the header: metadata and tensor infos, no tensor mapped."""

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        self.tensors = []


def header_metadata(path: Path) -> dict[str, Any]:
    """A GGUF file's metadata alone (vocabulary, chat template, hyperparameters), read from
    its header: the tensors need not be there (the first part of a split file will do).

    Raises:
        ModelFormatError: not GGUF, or a header cut short.
    """
    try:
        return metadata_of(_Header(path))
    except (ValueError, IndexError, OSError, KeyError) as e:
        raise ModelFormatError(f"cannot read the GGUF header of {path}: {e}") from e


def metadata_of(reader: GGUFReader) -> dict[str, Any]:
    """The metadata of an open reader as plain Python values (``GGUF.*`` keys dropped)."""
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = _plain(f.contents())
    return meta


def tensor_types(reader: GGUFReader) -> dict[str, str]:
    """GGUF tensor name -> GGML type name."""
    return {t.name: t.tensor_type.name for t in reader.tensors}


def needs_conversion(types: dict[str, str]) -> bool:
    """Whether some tensor is of a type ``mx.load`` cannot unpack."""
    return any(t not in MLX_NATIVE for t in types.values())


def cache_dir(path: Path) -> Path:
    """Where the conversion of the GGUF at ``path`` is cached (one entry per file path)."""
    key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
    return storage.subdir("cache") / "gguf" / key


def cached_bytes(path: Path) -> int:
    """Bytes the caches of the GGUF at ``path`` hold (conversion, tokenizer, float32); 0
    when it has none (nothing is created)."""
    try:
        entry = cache_dir(path)
        return sum(f.stat().st_size for f in entry.iterdir() if f.is_file()) if entry.is_dir() else 0
    except (OSError, StoreError):
        return 0


def remove_caches(path: Path) -> int:
    """Remove every cache of the GGUF at ``path`` (``mlotspark rm``); the bytes freed.

    Raises:
        StoreError: the entry cannot be removed.
    """
    entry = cache_dir(path)
    if not entry.is_dir():
        return 0
    freed = cached_bytes(path)
    with storage.FileLock(entry.parent / f".{entry.name}.lock"):  # not while a load writes it
        try:
            shutil.rmtree(entry)
        except OSError as e:
            raise StoreError(f"cannot remove the caches of {path} ({entry}): {e.strerror or e}") from e
    return freed  # the empty lock file stays: a load waiting on it must lock the same file


def tokenizer_cache(path: Path) -> Path:
    """Where the built tokenizer of the GGUF at ``path`` is cached: named after the
    file's size and mtime, so a changed file never gets a stale vocabulary."""
    st = Path(path).stat()
    return cache_dir(path) / f"tokenizer-{st.st_size}-{st.st_mtime_ns}.json"


def _stamp(path: Path) -> dict[str, Any]:
    st = Path(path).stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "format": CACHE_FORMAT, "source": str(Path(path).resolve())}


def cached_metadata(path: Path) -> tuple[dict[str, Any], dict[str, str]] | None:
    """Metadata and tensor types from a fresh cache entry of ``path``, else None."""
    entry = cache_dir(path)
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if meta.get("stamp") != _stamp(path):
        return None
    tensors = entry / "tensors.safetensors"
    if not tensors.is_file() or tensors.stat().st_size != meta.get("tensors_bytes"):
        return None
    return meta["metadata"], meta["types"]


def read_metadata(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """GGUF metadata and tensor types, from the cache when fresh (no tensor is read).

    Raises:
        ModelFormatError: see ``open_reader``.
    """
    hit = cached_metadata(path)
    if hit is not None:
        return hit
    reader = open_reader(path)
    return metadata_of(reader), tensor_types(reader)


def load_converted(path: Path, *, progress: bool = False) -> ConvertedGGUF:
    """Every tensor of ``path`` dequantized, from the cache or converted now (then cached).

    Args:
        path: a GGUF file.
        progress: show a progress bar on stderr while converting (TTY only unless
            ``MLOTSPARK_PROGRESS=1``; none while a display shows ``mlotspark.steps``,
            which report the conversion always).

    Returns:
        ``ConvertedGGUF``.

    Raises:
        ModelFormatError: unreadable file, unknown or truncated tensor, a type gguf
            cannot dequantize.
        StoreError: the cache cannot be written.
    """
    path = Path(path)
    t0 = time.perf_counter()
    entry = cache_dir(path)
    with storage.FileLock(entry.parent / f".{entry.name}.lock"):
        done = _from_cache(path, entry, t0)
        if done is not None:
            return done
        reader = open_reader(path)
        meta, types = metadata_of(reader), tensor_types(reader)
        tensors = _dequantize_all(reader, path, progress)
        _write_cache(entry, path, tensors, meta, types)
    return ConvertedGGUF(tensors, meta, types, False, time.perf_counter() - t0)


def load_cached(path: Path) -> ConvertedGGUF | None:
    """The conversion of ``path`` from a fresh cache entry, else None (nothing is converted).

    A fresh entry was written from this very file (same size and mtime) after it passed
    the reader's checks, so a caller holding one can skip the file's own header check
    and MLX's reader: 0.5-0.8 s of a second Gemma 3 load.
    """
    path = Path(path)
    t0 = time.perf_counter()
    entry = cache_dir(path)
    if not (entry / "meta.json").is_file():
        return None
    with storage.FileLock(entry.parent / f".{entry.name}.lock"):
        return _from_cache(path, entry, t0)


def _from_cache(path: Path, entry: Path, t0: float) -> ConvertedGGUF | None:
    hit = cached_metadata(path)
    if hit is None:
        return None
    try:
        tensors = mx.load(str(entry / "tensors.safetensors"))
    except (RuntimeError, ValueError, OSError):
        return None  # a damaged entry: the caller converts again
    return ConvertedGGUF(tensors, hit[0], hit[1], True, time.perf_counter() - t0)


def _dequantize_all(reader: GGUFReader, path: Path, progress: bool) -> dict[str, mx.array]:
    total = sum(int(t.n_bytes) for t in reader.tensors)
    out: dict[str, mx.array] = {}
    # Reported as a step (the CLI's status line, the TUI's loading panel); the tqdm bar
    # only where no display shows steps, so two bars never fight over one line.
    show_bar = show_progress(progress) and not steps.watched()
    with steps.step(f"converting {path.name} (once)", total, "B") as s, \
            progress_bar(total, f"converting {path.name}", show_bar) as bar:
        for t in reader.tensors:
            name, qtype = t.name, t.tensor_type
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF dims are innermost first
            try:
                if qtype.name in _FLOAT_TYPES or qtype == GGMLQuantizationType.BF16:
                    a = dequantize(t.data, qtype) if qtype == GGMLQuantizationType.BF16 else np.asarray(t.data)
                    arr = mx.array(a.reshape(shape))
                    if qtype == GGMLQuantizationType.BF16:
                        arr = arr.astype(mx.bfloat16)  # exact: bf16 widened to f32 and back
                    elif qtype.name == "F64":
                        arr = arr.astype(mx.float32)
                else:
                    a = dequantize(t.data, qtype).reshape(shape)
                    arr = mx.array(a.astype(np.float16))
            except NotImplementedError:
                raise ModelFormatError(
                    f"{path}: tensor {name!r} is {qtype.name}, which gguf {_gguf_version()} cannot dequantize"
                ) from None
            out[name] = arr
            mx.eval(arr)
            bar.update(int(t.n_bytes))
            s.advance(int(t.n_bytes))
    return out


def _write_cache(entry: Path, path: Path, tensors: dict[str, mx.array], meta: dict, types: dict) -> None:
    storage.ensure_dir(entry)
    for stale in entry.glob("tokenizer-*.json"):  # built from the file's previous contents
        if stale != tokenizer_cache(path):
            stale.unlink(missing_ok=True)
    target = entry / "tensors.safetensors"
    try:
        with storage.atomic_path(target) as tmp:
            # mx.save_safetensors appends ".safetensors" unless the name ends with it.
            mx.save_safetensors(str(tmp), tensors)
    except (RuntimeError, ValueError, OSError) as e:
        raise StoreError(f"cannot write the GGUF conversion cache {target}: {e}") from e
    storage.atomic_write(entry / "meta.json", json.dumps({
        "stamp": _stamp(path),
        "tensors_bytes": target.stat().st_size,
        "types": types,
        "metadata": meta,
    }, ensure_ascii=False))


def format_counts(types: dict[str, str]) -> dict[str, int]:
    """GGML type name -> number of tensors, most frequent first."""
    return dict(Counter(types.values()).most_common())


def _plain(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _gguf_version() -> str:
    try:
        from importlib.metadata import version

        return version("gguf")
    except Exception:  # metadata missing in an odd install: only used in messages
        return "(unknown version)"


__all__ = [
    "MLX_NATIVE",
    "ConvertedGGUF",
    "cache_dir",
    "cached_bytes",
    "cached_metadata",
    "format_counts",
    "header_metadata",
    "load_cached",
    "load_converted",
    "metadata_of",
    "needs_conversion",
    "open_reader",
    "read_metadata",
    "remove_caches",
    "tensor_types",
    "tokenizer_cache",
]
