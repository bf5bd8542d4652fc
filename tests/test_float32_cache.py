"""The float32 cache of a GGUF (``models/formats/float32_cache.py``): a later load reads the weights
the first one widened, bit for bit, with the tokens the old path gave; a killed write or
a damaged entry is never loaded, it is rebuilt."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from mlotspark import storage
from mlotspark.models.cpu import cpu_step
from mlotspark.models import execution, loader
from mlotspark.models.formats import float32_cache, gguf, gguf_convert
from mlotspark.models.hub.catalogue import ModelSource
from tiny import greedy
from tiny_gguf import write_tiny

PROMPT = [5, 40, 41, 42, 100, 7, 250, 3]


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch):
    monkeypatch.setenv(float32_cache.ENV, "1")  # the suite runs with it off (conftest.py)


def _load(path):
    return loader.load(ModelSource(path.stem, "gguf", path), weights="float32", progress=False)


def _weights(loaded) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(loaded.model.parameters())}


def _tokens(loaded, steps: int = 12) -> list[int]:
    return greedy(loaded.runner, make_prompt_cache(loaded.runner), PROMPT, steps)[0]


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("arch,qtype", [("llama", "Q4_K"), ("llama", "Q8_0"), ("llama", "Q4_1"), ("llama", "F16"),
                                        ("gemma3", "Q4_K"), ("phi3", "Q8_0")])
def test_a_later_load_reads_the_widened_weights_with_the_old_paths_tokens(tmp_path, monkeypatch, arch, qtype):
    path, ref = write_tiny(tmp_path / f"{arch}-{qtype}.gguf", arch, qtype)
    first = _load(path)
    assert "write" in first.extra["load"]["phases"]
    assert all(f.is_file() for f in float32_cache.files(path))

    later = _load(path)
    load = later.extra["load"]
    assert load["reader"] == "float32-cache" and load["from_cache"] is True
    assert set(load["phases"]) == {"read", "widen", "tokenizer", "materialize"} and load["phases"]["widen"] == 0
    assert _same_weights(_weights(first), _weights(later))
    assert _tokens(later) == _tokens(first)
    assert later.config == first.config and later.weights == "float32"
    assert later.extra["weight_formats"] == first.extra["weight_formats"]
    assert later.extra["gguf_types"] == first.extra["gguf_types"] and later.sampling == first.sampling
    text = "hi there, 12 <|im_end|> ok"
    assert later.tokenizer.encode(text) == first.tokenizer.encode(text)

    # The old path: widened as mlx-lm widens (dequantize_model, set_dtype), run op by op.
    monkeypatch.setenv(execution.ENV, "plain")
    monkeypatch.setenv(float32_cache.ENV, "0")
    old = _load(path)
    assert old.extra["load"]["reader"] != "float32-cache"
    assert _tokens(old) == _tokens(later)
    old_w, new_w = _weights(old), _weights(later)
    if qtype in ("Q4_K", "F16"):  # cast from float16 either way: the same values
        assert _same_weights(old_w, new_w)
    else:  # dequantized in float32 now: the file's values, which float16 arithmetic missed by up to ~1e-3
        assert old_w.keys() == new_w.keys()
        file_values = {k: np.array(v) for k, v in gguf.map_weight_names(
            {k: mx.array(v) for k, v in ref.items()}, arch).items()}
        for k in new_w:
            np.testing.assert_allclose(new_w[k], file_values[k], rtol=1e-6, atol=1e-7, err_msg=k)
            np.testing.assert_allclose(old_w[k], file_values[k], rtol=0, atol=2e-3, err_msg=k)


def test_groups_are_read_into_one_buffer(tmp_path):
    path, _ = write_tiny(tmp_path / "f.gguf", "llama", "Q8_0")
    first = _load(path)
    later = _load(path)
    for loaded in (first, later):  # widened straight into the buffers, then read back so
        for layer in loaded.model.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            assert cpu_step.one_buffer([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])
            assert cpu_step.one_buffer([mlp.gate_proj.weight, mlp.up_proj.weight])
        assert execution.fuse_projections(loaded.model) == 0  # nothing left to fuse
    names = set(mx.load(str(float32_cache.files(path)[0])))
    assert "model.layers.0.mlp.gate_proj.weight|model.layers.0.mlp.up_proj.weight" in names


def _damage(path, how: str) -> None:
    tensors, info = float32_cache.files(path)
    if how == "truncated":
        with open(tensors, "r+b") as f:
            f.truncate(tensors.stat().st_size - 100)
    elif how == "header":
        with open(tensors, "r+b") as f:
            f.seek(12)
            f.write(b"#" * 40)
    elif how == "data":  # same size, the second half zeroed
        size = tensors.stat().st_size
        with open(tensors, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(size - size // 2))
    elif how == "json":
        info.write_text("{not json")
    elif how == "no-json-fields":
        info.write_text(json.dumps({"format": float32_cache.FORMAT}))
    elif how == "missing-tensor":  # intact and checked, but not what the model needs
        arrays = mx.load(str(tensors))
        arrays.pop("model.norm.weight")
        mx.save_safetensors(str(tensors), arrays)
        doc = json.loads(info.read_text())
        doc.update(bytes=tensors.stat().st_size, check=float32_cache._check(tensors))
        info.write_text(json.dumps(doc))
    elif how == "source-changed":
        os.utime(path, ns=(1, 1))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "header", "data", "json", "no-json-fields", "missing-tensor",
                                 "source-changed"])
def test_a_damaged_cache_is_rebuilt_never_loaded(tmp_path, how):
    path, _ = write_tiny(tmp_path / "d.gguf", "llama", "Q4_0")
    first = _load(path)
    _damage(path, how)
    again = _load(path)
    assert again.extra["load"]["reader"] != "float32-cache"  # widened from the file
    assert "write" in again.extra["load"]["phases"]  # and written anew
    assert _same_weights(_weights(first), _weights(again))
    assert _load(path).extra["load"]["reader"] == "float32-cache"


def test_off_writes_nothing_and_reads_nothing(tmp_path, monkeypatch):
    path, _ = write_tiny(tmp_path / "o.gguf", "llama", "Q8_0")
    monkeypatch.setenv(float32_cache.ENV, "0")
    first = _load(path)
    assert "write" not in first.extra["load"]["phases"]
    assert not any(f.exists() for f in float32_cache.files(path))
    monkeypatch.setenv(float32_cache.ENV, "1")
    _load(path)
    monkeypatch.setenv(float32_cache.ENV, "0")
    assert _load(path).extra["load"]["reader"] == "mlx"


def test_no_room_on_disk_writes_nothing(tmp_path, monkeypatch):
    path, _ = write_tiny(tmp_path / "r.gguf", "llama", "Q8_0")
    monkeypatch.setattr(float32_cache, "_RESERVE", (1 << 60, 0.0))
    loaded = _load(path)
    assert loaded.extra["load"]["float32_cache"] == "not written: no room on disk"
    assert not any(f.exists() for f in float32_cache.files(path))


_KILLED_LOAD = """
import sys
from pathlib import Path
from mlotspark.models import loader
from mlotspark.models.hub.catalogue import ModelSource
p = Path(sys.argv[1])
loader.load(ModelSource(p.stem, "gguf", p), weights="float32", progress=False)
"""


@pytest.mark.parametrize("step,file", [("written", float32_cache.TENSORS), ("renamed", float32_cache.TENSORS),
                                       ("half", float32_cache.INFO)])
def test_a_write_killed_midway_leaves_nothing_that_loads(tmp_path, monkeypatch, step, file):
    path, _ = write_tiny(tmp_path / "k.gguf", "llama", "Q8_0")
    # Which write of this step is the float32 cache's, in a first load (a dry run here).
    seen = []
    real = storage.write_step
    monkeypatch.setattr(storage, "write_step", lambda s, p: seen.append((s, str(p))) or real(s, p))
    _load(path)
    monkeypatch.setattr(storage, "write_step", real)
    same_step = [p for s, p in seen if s == step]
    nth = next(i for i, p in enumerate(same_step) if p.endswith(os.sep + file)) + 1

    home = tmp_path / "killed-home"
    env = {**os.environ, "MLOTSPARK_HOME": str(home), float32_cache.ENV: "1",
           "MLOTSPARK_FAULT_KILL_STEP": step, "MLOTSPARK_FAULT_KILL_AT": str(nth)}
    run = subprocess.run([sys.executable, "-c", _KILLED_LOAD, str(path)], env=env, capture_output=True, timeout=300)
    assert run.returncode == -9, run.stderr.decode()[-2000:]

    monkeypatch.setenv("MLOTSPARK_HOME", str(home))
    tensors, info = float32_cache.files(path)
    assert not info.exists()  # the JSON comes last: no entry that looks complete
    assert float32_cache.load(path) is None
    again = _load(path)
    assert again.extra["load"]["reader"] == "mlx" and "write" in again.extra["load"]["phases"]
    assert not list(tensors.parent.glob(".float32*"))  # the killed writer's temp file is gone
    assert _load(path).extra["load"]["reader"] == "float32-cache"


def test_the_entry_holds_what_a_later_load_needs(tmp_path):
    path, _ = write_tiny(tmp_path / "e.gguf", "llama", "Q4_K")
    _load(path)
    tensors, info = float32_cache.files(path)
    doc = json.loads(info.read_text())
    assert doc["bytes"] == tensors.stat().st_size and doc["stamp"]["size"] == path.stat().st_size
    assert doc["metadata"]["general.architecture"] == "llama" and doc["native"] is False
    assert tensors.parent == gguf_convert.cache_dir(path)
    assert all(a.dtype == mx.float32 for a in mx.load(str(tensors)).values())
