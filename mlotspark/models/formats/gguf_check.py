"""Check a GGUF file's layout before any reader trusts it (independent of the loader).

GGUF readers in C (MLX's ``mx.load``, llama.cpp's gguflib) take the counts and
lengths in the header at their word: a flipped bit in a string length or a tensor
dimension makes them allocate terabytes or read past the end of the file (measured:
3 of 40 randomly mutated headers killed ``mx.load`` with SIGSEGV, others raised
``UnicodeDecodeError`` or a C++ message without the file's name).
``check_gguf`` walks the header, metadata and tensor infos in Python, checking every
declared count, length, dimension and offset against the file's real size *before*
anything is allocated, and raises ``ModelFormatError`` naming the file and the field.

It reads only the header (a few MB for a vocabulary of 50k tokens), never tensor data.
Layout (GGUF v2/v3, little-endian)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 type | value)        string = u64 length + bytes
    n_tensors x (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset)
    padding to general.alignment (default 32) | tensor data
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from mlotspark.errors import ModelFormatError

MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays: none in practice, bounded so a loop cannot recurse away
VERSIONS = (2, 3)

# Metadata value types: fixed sizes in bytes; 8 = string, 9 = array.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9

# ggml tensor types: (bytes per block, elements per block), as llama.cpp's GGML_QUANT_SIZES.
GGML_SIZES = {
    0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32),
    9: (36, 32), 10: (84, 256), 11: (110, 256), 12: (144, 256), 13: (176, 256), 14: (210, 256),
    15: (292, 256), 16: (66, 256), 17: (74, 256), 18: (98, 256), 19: (50, 256), 20: (18, 32),
    21: (110, 256), 22: (82, 256), 23: (136, 256), 24: (1, 1), 25: (2, 1), 26: (4, 1), 27: (8, 1),
    28: (8, 1), 29: (56, 256), 30: (2, 1), 34: (54, 256), 35: (66, 256),
}


class _Reader:
    """Bounded little-endian reads over a mapped file; every read checks the end."""

    def __init__(self, data: "mmap.mmap | bytes", path: Path):
        self.data, self.pos, self.path, self.size = data, 0, path, len(data)

    def fail(self, what: str) -> ModelFormatError:
        return ModelFormatError(f"corrupt GGUF {self.path}: {what} (at byte {self.pos} of {self.size})")

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} needs {n} bytes, the file ends first")
        at = self.pos
        self.pos += n
        return at

    def unpack(self, fmt: str, what: str) -> tuple:
        at = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, at)

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)[0]

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        at = self.take(n, f"{what} ({n} bytes)")
        try:
            return bytes(self.data[at : at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None


def _skip_value(r: _Reader, vtype: int, key: str, depth: int = 0) -> object:
    """Skip one metadata value (returning small scalars and strings, for alignment)."""
    if vtype in _FIXED:
        at = r.take(_FIXED[vtype], f"value of {key!r}")
        return int.from_bytes(r.data[at : at + _FIXED[vtype]], "little") if vtype in (4, 10) else None
    if vtype == _STRING:
        return r.string(f"value of {key!r}")
    if vtype != _ARRAY or depth >= MAX_NESTING:
        raise r.fail(f"metadata {key!r} has unknown value type {vtype}")
    etype = r.u32(f"element type of {key!r}")
    count = r.u64(f"element count of {key!r}")
    if etype in _FIXED:
        r.take(count * _FIXED[etype], f"{count} elements of {key!r}")
        return None
    # Strings take at least their 8-byte length each: refuse a count the file cannot hold.
    if count * 8 > r.size - r.pos:
        raise r.fail(f"{key!r} declares {count} elements, more than the file can hold")
    for _ in range(count):
        _skip_value(r, etype, key, depth + 1)
    return None


def check_gguf(path: Path) -> int:
    """Check that ``path`` is a GGUF file whose header fits inside it.

    Args:
        path: the file.

    Returns:
        The header's tensor count (the loader compares it with what MLX read).

    Raises:
        ModelFormatError: not GGUF, an unsupported version, or a count, length,
            dimension, type or offset that does not fit the file (named).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise ModelFormatError(f"corrupt GGUF {path}: {size} bytes, shorter than a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _check(_Reader(data, path))
    except OSError as e:
        raise ModelFormatError(f"cannot read GGUF {path}: {e.strerror or e}") from e


def _check(r: _Reader) -> int:
    magic = bytes(r.data[r.take(4, "magic") : 4])
    if magic != b"GGUF":
        raise ModelFormatError(f"{r.path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    version = r.u32("version")
    if version not in VERSIONS:
        raise r.fail(f"version {version}, readable versions are {', '.join(map(str, VERSIONS))}")
    n_tensors, n_kv = r.u64("tensor count"), r.u64("metadata count")
    # Each metadata pair takes >= 12 bytes and each tensor info >= 24: check before looping.
    if n_kv * 12 + n_tensors * 24 > r.size - r.pos:
        raise r.fail(f"{n_kv} metadata entries and {n_tensors} tensors cannot fit in the file")
    alignment = 32
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        value = _skip_value(r, r.u32(f"type of {key!r}"), key)
        if key == "general.alignment":
            if not isinstance(value, int) or value < 1 or value & (value - 1) or value > 1 << 20:
                raise r.fail(f"general.alignment {value!r} is not a power of two")
            alignment = value
    tensors = []
    for i in range(n_tensors):
        name = r.string(f"tensor name {i}")
        n_dims = r.u32(f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
        dims = r.unpack(f"<{n_dims}Q", f"dimensions of {name!r}")
        ggml_type = r.u32(f"type of {name!r}")
        offset = r.u64(f"offset of {name!r}")
        tensors.append((name, dims, ggml_type, offset))
    data_start = -(-r.pos // alignment) * alignment
    data_size = r.size - data_start
    for name, dims, ggml_type, offset in tensors:
        elements = 1
        for d in dims:
            if d < 1 or elements * d > data_size * 8:  # 8 elements per byte is the densest type
                raise r.fail(f"tensor {name!r} has dimensions {list(dims)} that the file cannot hold")
            elements *= d
        if ggml_type not in GGML_SIZES:
            if offset >= data_size:
                raise r.fail(f"tensor {name!r} (ggml type {ggml_type}) starts at {offset}, past the data")
            continue
        block_bytes, block = GGML_SIZES[ggml_type]
        if dims[0] % block:
            raise r.fail(f"tensor {name!r} row of {dims[0]} is not a multiple of its block of {block}")
        nbytes = elements // block * block_bytes
        if offset % alignment or offset + nbytes > data_size:
            raise r.fail(
                f"tensor {name!r} ({_type_name(ggml_type)}) at offset {offset} with {nbytes} bytes does not fit the "
                f"{data_size} bytes of data (alignment {alignment})"
            )
    return n_tensors


def _type_name(ggml_type: int) -> str:
    """``Q6_K`` for 14: the names llama.cpp's ``gguf`` package gives the ggml types."""
    from gguf import GGMLQuantizationType  # the field's table of names (light: NumPy only)

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"ggml type {ggml_type}"


__all__ = ["GGML_SIZES", "check_gguf"]
