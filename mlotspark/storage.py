"""Where mlotspark keeps its files, and how it writes them safely.

Every write of state goes through ``atomic_write``: a temp file in the same
directory, fsync, rename, fsync of the directory, so a kill at any instant leaves
either the old or the new file (DESIGN §6). User data is private: directories
0700, files 0600. ``FileLock`` serialises writers from several processes sharing
one ``$MLOTSPARK_HOME``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

from mlotspark.errors import OptionError, StoreError

try:  # POSIX advisory locks; Windows is not a target, but keep imports safe.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


def home() -> Path:
    """The data directory: ``$MLOTSPARK_HOME`` or ``~/.mlotspark`` (created 0700)."""
    root = Path(os.environ.get("MLOTSPARK_HOME") or Path.home() / ".mlotspark").expanduser()
    return ensure_dir(root)


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700 if missing; return it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise StoreError(f"cannot create directory {path}: {e.strerror}") from e
    return path


def subdir(name: str) -> Path:
    """A directory under the data directory, e.g. ``models`` or ``conversations``."""
    return ensure_dir(home() / name)


_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.\-]{0,127}$")


def safe_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it can be a file name inside the data directory.

    Rejects path separators, ``..``, leading dots and control characters, so a
    conversation name can never escape its directory.
    """
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise OptionError(
            f"invalid {what} {name!r}: use 1-128 letters, digits, spaces, '_', '-' or '.', "
            "not starting with '.' or containing '..'"
        )
    return name


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically, mode 0600.

    Raises:
        StoreError: the write failed (disk full, permissions); the old file is intact.
    """
    path = Path(path)
    ensure_dir(path.parent)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StoreError(f"cannot write {path}: {e.strerror or e}") from e


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temp path next to ``path``; on success it replaces ``path`` atomically.

    For writers that need a file name (``mx.save_safetensors``, sqlite backups).
    """
    path = Path(path)
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    """Atomically write ``obj`` as pretty JSON."""
    atomic_write(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_json(path: Path, default: Any = None) -> Any:
    """Read JSON from ``path``; ``default`` if missing.

    Raises:
        StoreError: the file exists but is not valid JSON.
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot read {path}: {e}") from e


class FileLock:
    """An exclusive advisory lock on ``path`` (a ``.lock`` file), across processes.

    Usage: ``with FileLock(dir / ".lock"): ...``. Re-entrant within one object.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None
        self._depth = 0

    def __enter__(self) -> "FileLock":
        if self._depth == 0:
            ensure_dir(self.path.parent)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
