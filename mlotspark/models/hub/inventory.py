"""What models are on disk: ``mlotspark list`` and ``mlotspark rm``.

Four places hold models a user can run:

- the catalogue's aliases and bundles, pulled into the models folder (``aliases.models_dir``);
- Hugging Face repos pulled by id, in ``<models folder>/hf/org--name``;
- GGUF files and model directories opened by path before (remembered in
  ``$MLOTSPARK_HOME/models_used.json`` when they load; never moved or copied);
- mlx-lm / Hugging Face models in the Hugging Face cache (``huggingface_hub``'s, where
  ``mlx_lm.generate --model org/name`` puts them).

``remove`` deletes what mlotspark fetched; a file the user opened by path is only
forgotten (it is the user's), and the Hugging Face cache belongs to ``huggingface-cli``.
Either way the caches mlotspark made of a GGUF (conversion, tokenizer, float32:
``gguf_convert``, ``float32_cache``) go with it; ``on_disk`` counts them as ``cache``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from mlotspark import storage
from mlotspark.errors import ModelNotFoundError, MlotsparkError, StoreError
from mlotspark.models.hub import bundles, catalogue
from mlotspark.models.formats import gguf_convert
from mlotspark.models.hub.capabilities import capabilities
from mlotspark.models.hub.aliases import ALIASES, ModelSource, models_dir

_USED = "models_used.json"
_FORMAT = 1


def _used_file() -> Path:
    return storage.home_path() / _USED


def remember(source: ModelSource) -> None:
    """Note that ``source`` (a path outside the models folder) was loaded, for ``list``.

    Never raises: a read-only data directory only means the path is not listed.
    """
    path = Path(source.path)
    with contextlib.suppress(MlotsparkError, OSError, ValueError):
        if catalogue.alias_name(source) or path.is_relative_to(models_dir()):
            return
        with storage.FileLock(storage.home() / ".models_used.lock"):
            doc = _read_used()
            doc["paths"][str(path)] = {"kind": source.kind, "name": source.name, "last_used": int(time.time())}
            storage.write_json(_used_file(), doc)


def _read_used() -> dict:
    try:
        doc = storage.read_json(_used_file(), None)
    except StoreError:  # a damaged list is rebuilt from the next load
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict):
        doc = {"format": _FORMAT, "paths": {}}
    return doc


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _ggufs(path: Path) -> list[Path]:
    """The GGUF files at ``path`` (the file itself, or those in a model's folder)."""
    if path.is_dir():
        return sorted(path.glob("*.gguf"))
    return [path] if path.suffix == ".gguf" else []  # also a file gone since: its caches are not


def _cache_size(path: Path) -> int:
    return sum(gguf_convert.cached_bytes(f) for f in _ggufs(path))


def _remove_caches(path: Path) -> int:
    return sum(gguf_convert.remove_caches(f) for f in _ggufs(path))


def hf_cache_models() -> list[dict[str, Any]]:
    """Complete model directories in the Hugging Face cache (latest snapshot of each repo)."""
    rows: list[dict[str, Any]] = []
    try:
        from huggingface_hub import scan_cache_dir

        # Read now, not at huggingface_hub's import: the variable may be set after it.
        info = scan_cache_dir(os.environ.get("HF_HUB_CACHE") or None)
    except Exception:  # no cache yet, or one huggingface_hub cannot read: nothing to list
        return rows
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        latest = max(repo.revisions, key=lambda r: r.last_modified)
        try:
            catalogue.check_model_dir(latest.snapshot_path)
        except MlotsparkError:
            continue  # a tokenizer-only or GGUF repo: not something `-m org/name` loads from here
        rows.append({"name": repo.repo_id, "kind": "hf_dir", "where": "hf cache",
                     "path": str(latest.snapshot_path), "size": repo.size_on_disk})
    return rows


def on_disk() -> list[dict[str, Any]]:
    """Every model on disk: ``name``, ``kind``, ``where`` (catalogue | hf | used before |
    hf cache), ``path``, ``size`` in bytes, and ``cache``: bytes of the caches mlotspark
    keeps of a GGUF (conversion, tokenizer, float32), which ``remove`` removes with it."""
    rows: list[dict[str, Any]] = []
    for r in catalogue.list_models():
        if r["pulled"]:
            where = "catalogue" if r["kind"] == "gguf" else "hf"
            rows.append({"name": r["name"], "kind": r["kind"], "where": where, "path": r["path"],
                         "size": r["size"], "default": r.get("default", False)})
    for name in bundles.BUNDLES:
        if bundles.is_pulled(name):
            row = bundles.bundle_status(name)
            rows.append({"name": name, "kind": "bundle", "where": "catalogue", "path": row["path"],
                         "size": _size(Path(row["path"]))})
    for path, entry in sorted(_read_used()["paths"].items()):
        p = Path(path)
        if p.exists():
            rows.append({"name": path, "kind": entry.get("kind", "gguf"), "where": "used before",
                         "path": path, "size": _size(p)})
    rows += hf_cache_models()
    for r in rows:
        r["cache"] = _cache_size(Path(r["path"])) if r["kind"] == "gguf" else 0
        if r["kind"] != "bundle":  # a sentence embedder is no chat model
            r["capabilities"] = capabilities(r["name"]).to_json()
    return rows


def available_models() -> list[dict[str, Any]]:
    """What a user can open by name (the chat's model picker): every catalogue alias,
    pulled or not, then every other model ``on_disk()`` lists (bundles left out: they
    are not chat models).

    Returns:
        One dict per model: ``name`` (what ``Engine.load`` takes), ``kind``, ``where``,
        ``path``, ``size`` (bytes; an alias not pulled: its download size), ``pulled``,
        ``default``, ``description``, ``capabilities`` (``models.hub.capabilities``: the
        features, and whether the conformance matrix measured them).
    """
    rows = [{**r, "where": "catalogue", "capabilities": capabilities(r["name"]).to_json()}
            for r in catalogue.list_models() if r["kind"] == "gguf"]
    seen = {r["path"] for r in rows}
    rows += [{"description": "", "default": False, **r, "pulled": True} for r in on_disk()
             if r["kind"] != "bundle" and r["path"] not in seen]
    return rows


def format_on_disk(rows: list[dict[str, Any]] | None = None) -> str:
    """``on_disk()`` as a table, one line per model (``*`` marks the default)."""
    rows = on_disk() if rows is None else rows
    if not rows:
        return f"no models on disk (models folder: {models_dir()}); run `mlotspark pull`"
    width = max(len(r["name"]) for r in rows)
    lines = []
    for r in rows:
        mark = "*" if r.get("default") else " "
        caps = r.get("capabilities")
        said = (", ".join(caps["features"]) + ("" if caps["verified"] else " (unverified)")) if caps else "embedder"
        cache = f"  (+{r['cache'] / 1e6:.1f} MB cache)" if r.get("cache") else ""
        lines.append(f"{mark} {r['name']:<{width}}  {r['where']:<11}  {r['size'] / 1e6:8.1f} MB  {r['path']}"
                     f"{cache}  [{said}]")
    return "\n".join(lines)


def remove(name: str) -> str:
    """Remove model ``name`` from disk (or forget a path used before).

    Args:
        name: a catalogue alias or bundle, a Hugging Face repo id pulled by mlotspark,
            or a path listed as used before.

    Returns:
        One line saying what was done.

    Raises:
        ModelNotFoundError: nothing of that name is on disk.
        StoreError: the files cannot be removed.
    """
    if name in ALIASES or name in bundles.BUNDLES:
        target = models_dir() / name
        return _delete(target, name)
    used = _read_used()
    key = str(Path(name).expanduser().absolute())
    if key in used["paths"] or name in used["paths"]:
        with storage.FileLock(storage.home() / ".models_used.lock"):
            doc = _read_used()
            doc["paths"].pop(key, None)
            doc["paths"].pop(name, None)
            storage.write_json(_used_file(), doc)
        freed = _remove_caches(Path(key if key in used["paths"] else name))
        caches = f"; its caches removed ({freed / 1e6:.1f} MB)" if freed else ""
        return f"forgot {name} (a file you opened by path: it stays where it is){caches}"
    hf = catalogue.hf_dir(name) if "/" in name and not Path(name).expanduser().exists() else None
    if hf is not None and hf.is_dir():
        return _delete(hf, name)
    if any(r["name"] == name for r in hf_cache_models()):
        raise ModelNotFoundError(f"{name!r} is in the Hugging Face cache, which mlotspark does not manage: "
                                 f"remove it with `huggingface-cli delete-cache`")
    raise ModelNotFoundError(f"no model {name!r} on disk; `mlotspark list` shows what is there")


def _delete(target: Path, name: str) -> str:
    if not target.exists():
        raise ModelNotFoundError(f"model {name!r} is not on disk ({target})")
    size = _size(target)
    freed = _remove_caches(target)  # first: they are found by the model file's path
    try:
        shutil.rmtree(target)
    except OSError as e:
        raise StoreError(f"cannot remove {target}: {e.strerror or e}") from e
    caches = f", and its caches ({freed / 1e6:.1f} MB)" if freed else ""
    return f"removed {name} ({size / 1e6:.1f} MB, {target}){caches}"


__all__ = ["available_models", "format_on_disk", "hf_cache_models", "on_disk", "remember", "remove"]
