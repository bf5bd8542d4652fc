"""Check a safetensors file's layout before MLX reads it (the counterpart of ``gguf_check``).

MLX's reader names neither the file nor the cause a user can act on: a shard cut short
by an interrupted copy raises ``Tensor '...' invalid data offsets``, an empty one
``Unable to read 8 bytes``, and a Git LFS pointer (a repo cloned without ``git lfs``)
``Invalid json header length`` — and a sharded model loads every shard in one call.
``problem`` reads only the header (8 bytes of length, then JSON) and compares the
offsets it declares with the file's size.

Layout::

    u64 header length N (little-endian) | N bytes of JSON {name: {dtype, shape, data_offsets}} | data
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_LFS_POINTER = b"version https://git-lfs"
# Header JSON above this is not a header (real ones: a few hundred KB for thousands of tensors).
_MAX_HEADER = 100 * 1024 * 1024


def problem(path: Path) -> str | None:
    """What is wrong with the layout of safetensors file ``path``, or None when it is whole.

    Returns:
        A short phrase for a message naming the file, e.g. ``"truncated: 1,024 of
        2,048 bytes"``; None when the header parses and every tensor lies inside the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if head + f.read(len(_LFS_POINTER) - 8) == _LFS_POINTER:
                return "a Git LFS pointer, not the weights (run `git lfs pull` in the repository)"
            if len(head) < 8:
                return f"truncated: {size:,} bytes, no header"
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                return f"not a safetensors file (header length {n:,} in a file of {size:,} bytes)"
            f.seek(8)
            header = json.loads(f.read(n))
    except OSError as e:
        return f"unreadable: {e.strerror}"
    except (ValueError, UnicodeDecodeError):
        return "not a safetensors file (its header is not JSON)"
    if not isinstance(header, dict):
        return "not a safetensors file (its header is not a JSON object)"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (TypeError, KeyError, IndexError, ValueError):
            return f"not a safetensors file (tensor {name!r} has no data_offsets)"
    need = 8 + n + end
    if need > size:
        return f"truncated: {size:,} of {need:,} bytes (an interrupted download or copy?)"
    return None


def tensor_names(path: Path) -> set[str]:
    """Names of the tensors in safetensors file ``path`` (its header only; ``problem`` first).

    Raises:
        OSError, ValueError: the file cannot be read or is not safetensors.
    """
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(min(n, _MAX_HEADER)))
    return {name for name in header if name != "__metadata__"}


__all__ = ["problem", "tensor_names"]
