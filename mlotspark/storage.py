"""Where mlotspark keeps its files, and how it writes them safely.

Every write of state goes through ``atomic_path`` (``atomic_write`` for bytes and
text): a temp file in the same directory, fsync, rename, fsync of the directory, so
a kill at any instant leaves either the old or the new file (DESIGN §6). User data
is private: directories 0700, files 0600. ``FileLock`` serialises writers from
several processes sharing one ``$MLOTSPARK_HOME``.

Writes never follow a symbolic link planted inside the data directory (a
conversation directory pointing at ``~/Documents`` must not be written or pruned
there): ``check_no_symlinks`` refuses them. The data directory itself may be a link.

``write_step`` marks the instants inside a write (temp file open, half written,
synced, renamed) where the reliability suite (``tests/reliability``) kills the
process: with ``MLOTSPARK_FAULT_KILL_AT=N`` in the environment the Nth step of
the process SIGKILLs it, so kills land inside writes, not only between them
(``MLOTSPARK_FAULT_KILL_STEP=half`` counts only the steps of that name).
Unset (always, outside that suite) a step costs one integer test.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator

from mlotspark.errors import OptionError, StoreError

try:  # POSIX advisory locks; Windows is not a target, but keep imports safe.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


def home_path() -> Path:
    """The data directory's path (``$MLOTSPARK_HOME`` or ``~/.mlotspark``), not created."""
    return Path(os.environ.get("MLOTSPARK_HOME") or Path.home() / ".mlotspark").expanduser()


def home() -> Path:
    """The data directory: ``$MLOTSPARK_HOME`` or ``~/.mlotspark`` (created 0700)."""
    return ensure_dir(home_path())


def writable(directory: Path | None = None) -> bool:
    """Whether files can be created in ``directory`` (default the data directory).

    Args:
        directory: an existing or missing directory; missing counts as writable when
            its nearest existing parent is.

    Returns:
        False on a read-only file system or without write permission.
    """
    path = Path(directory) if directory is not None else home_path()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not os.access(path, os.W_OK | os.X_OK):
        return False
    try:  # os.access does not see a read-only mount on every system
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe.")
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return True


# ---------------------------------------------------------------- fault injection
_KILL_AT = int(os.environ.get("MLOTSPARK_FAULT_KILL_AT") or 0)
_KILL_STEP = os.environ.get("MLOTSPARK_FAULT_KILL_STEP") or ""
_steps = 0


def write_step(step: str, path: Path | str) -> None:
    """An instant inside a write of ``path`` where a kill test may stop the process.

    Args:
        step: what has happened so far (``open``, ``half``, ``synced``, ``renamed`` ...).
        path: the file being written (for a debugger breakpoint's condition).
    """
    global _steps
    if _KILL_AT and (not _KILL_STEP or step == _KILL_STEP):
        _steps += 1
        if _steps == _KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)


def check_no_symlinks(path: Path) -> None:
    """Refuse to write ``path`` when a directory between the data directory and it is a
    symbolic link, or ``path`` itself is one. Paths outside the data directory pass
    (the user chose them, e.g. ``--output``).

    Raises:
        StoreError: naming the link.
    """
    path = Path(path)
    root = home_path()
    try:
        rel = path.relative_to(root)
    except ValueError:
        return
    cur = root
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink():
            raise StoreError(
                f"refusing to write {path}: {cur} is a symbolic link inside the data directory "
                f"{root} (remove it; mlotspark never follows links there for writes)"
            )


def ensure_dir(path: Path) -> Path:
    """Create ``path`` (and parents) with mode 0700 if missing; return it.

    Raises:
        StoreError: it cannot be created, or a symbolic link inside the data
            directory leads to it.
    """
    path = Path(path)
    check_no_symlinks(path)
    try:
        # Each missing directory by itself: ``mkdir(parents=True, mode=...)`` gives the mode to
        # the last one only, the parents it makes get the umask's (0755: cache/gguf was).
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for p in reversed(missing):
            p.mkdir(exist_ok=True, mode=0o700)
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
    """Write ``data`` to ``path`` atomically, mode 0600 (through :func:`atomic_path`).

    Raises:
        StoreError: the write failed (disk full, permissions); the old file is intact.
    """
    if isinstance(data, str):
        try:
            data = data.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate: refuse before touching the file
            raise StoreError(f"cannot write {path}: text is not valid Unicode ({e.reason} at {e.start})") from e
    with atomic_path(path, suffix=".tmp") as tmp, open(tmp, "wb") as f:
        half = len(data) // 2
        f.write(data[:half])
        f.flush()
        write_step("half", path)
        f.write(data[half:])


@contextlib.contextmanager
def atomic_path(path: Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temp path next to ``path``; on success it replaces ``path`` atomically.

    The one atomic writer: a temp file in the same directory, fsync, rename, fsync of
    the directory; the temp file is removed on any failure. For writers that need a
    file name (``mx.save_safetensors``, sqlite backups) and for :func:`atomic_write`.

    Args:
        path: the file to replace.
        suffix: the temp file's suffix (default ``path``'s own, which some writers
            need; ``.tmp`` for :func:`atomic_write`, whose leftovers readers sweep).

    Raises:
        StoreError: the write failed (disk full, permissions); the old file is intact.
    """
    path = Path(path)
    ensure_dir(path.parent)
    check_no_symlinks(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                   suffix=path.suffix if suffix is None else suffix)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror or e}") from e
    os.close(fd)
    try:
        write_step("open", path)
        yield Path(tmp)
        write_step("written", path)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        write_step("synced", path)
        os.replace(tmp, path)
        write_step("renamed", path)
        _fsync_dir(path.parent)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from e
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
    except RecursionError:  # "[[[[..." 100,000 deep: json's parser recurses per level
        raise StoreError(f"cannot read {path}: JSON nested too deeply") from None


class ReadOnlyWarning(UserWarning):
    """The data directory cannot be written: replies work, nothing is saved."""


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
            if self.path.parent.is_dir() or writable(self.path.parent):
                ensure_dir(self.path.parent)
                self._fd = self._open()
            else:  # a read-only data directory without this directory: nothing to lock
                self._fd = None
            if fcntl is not None and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._depth += 1
        return self

    def _open(self) -> int | None:
        nofollow = getattr(os, "O_NOFOLLOW", 0)  # a planted link must not lead us elsewhere
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | nofollow, 0o600)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise StoreError(f"cannot lock {self.path}: {e.strerror or e}") from e
        # A read-only data directory: lock an existing file read-only (flock needs no
        # write access), or go unlocked when there is none (nothing is written then).
        try:
            return os.open(self.path, os.O_RDONLY | nofollow)
        except OSError:
            return None

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None



# (pid, parent, prefix) -> (this process's directory there, the descriptor holding its lock)
_PROCESS_DIRS: dict[tuple[int, str, str], tuple[Path, int | None]] = {}
_PROCESS_DIRS_LOCK = threading.Lock()


def process_dir(parent: Path, prefix: str) -> Path:
    """This process's private directory (0700) under ``parent``, ``<prefix>XXXXXXXX``,
    made on first use and marked in use by a lock this process holds until it ends.
    Making it first deletes those whose lock no process holds: a process killed or
    crashed before it deleted its scratch files (the cascade's spill files, gigabytes
    at long contexts) leaves them there until the next one comes.

    Args:
        parent: where it goes (created if missing).
        prefix: its name's start, for this kind of scratch files only.

    Raises:
        OSError: it cannot be made.
    """
    key = (os.getpid(), str(parent), prefix)  # a forked child makes its own
    with _PROCESS_DIRS_LOCK:
        if key in _PROCESS_DIRS:
            path, old = _PROCESS_DIRS[key]
            if path.is_dir():
                return path
            if old is not None:  # deleted under us: start again
                os.close(old)
            del _PROCESS_DIRS[key]
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        sweep_process_dirs(parent, prefix)
        # Locked under a hidden name, then renamed: a sweep never sees it unlocked.
        hidden = Path(tempfile.mkdtemp(prefix="." + prefix, dir=parent))  # mode 0700
        fd = None
        try:
            fd = os.open(hidden / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path = parent / hidden.name[1:]
            os.rename(hidden, path)
        except OSError:
            if fd is not None:
                os.close(fd)
            shutil.rmtree(hidden, ignore_errors=True)
            raise
        if not _PROCESS_DIRS:
            atexit.register(_remove_process_dirs)
        _PROCESS_DIRS[key] = (path, fd)
        return path


def _remove_process_dirs() -> None:
    for (pid, _, _), (path, _) in list(_PROCESS_DIRS.items()):
        if pid == os.getpid():
            shutil.rmtree(path, ignore_errors=True)


def sweep_process_dirs(parent: Path, prefix: str) -> int:
    """Delete the ``process_dir``s of ``prefix`` under ``parent`` whose process is gone
    (their lock is free; one without a lock file is left: it may be in the making).

    Returns:
        How many were deleted.
    """
    if fcntl is None:
        return 0
    n = 0
    for d in [*parent.glob(prefix + "*"), *parent.glob("." + prefix + "*")]:
        if d.is_symlink() or not d.is_dir():
            continue
        try:
            fd = os.open(d / ".lock", os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its process is running
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            n += 1
        finally:
            os.close(fd)
    return n
