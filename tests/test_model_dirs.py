"""Model directories as users bring them: the variants around the zoo's plain ``hf`` one.

Sharded weights load to the same model as one file; ``generation_config.json``'s list of
EOS ids ends a reply at each of them (it was ignored: the tokenizer read ``config.json``
only); an ``lm_head.weight`` in a config that does not say ``tie_word_embeddings`` is
used, as transformers' Llama does (it was dropped unread: replies from the embeddings);
a cut-short shard, an empty one or a Git LFS pointer is named in one line (MLX's error
named neither the file nor the cause); a config.json without a ``model_type`` says so
(it was a bare ``KeyError: 'model_type'``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import zoo
from mlotspark import Engine
from mlotspark.cli.entry import main
from mlotspark.errors import ModelFormatError

PROMPT = [[5, 70, 80, 90, 100]]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return zoo.write_hf_dir(tmp_path_factory.mktemp("dirs") / "llama-hf", "llama")


def _variant(base: Path, tmp_path: Path, name: str = "variant") -> Path:
    return Path(shutil.copytree(base, tmp_path / name))


def _shard(d: Path) -> list[str]:
    """Split ``d``'s model.safetensors in two shards with an index, as the hub ships them."""
    weights = mx.load(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    keys = sorted(weights)
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2:]]
    for name, part in zip(names, halves):
        mx.save_safetensors(str(d / name), {k: weights[k] for k in part})
    weight_map = {k: name for name, part in zip(names, halves) for k in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return names


def _edit_config(d: Path, **changes) -> None:
    config = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            config.pop(k, None)
        else:
            config[k] = v
    (d / "config.json").write_text(json.dumps(config))


def _logits_and_reply(path: Path) -> tuple[np.ndarray, list[int], str]:
    engine = Engine.load(str(path), progress=False, cascade=None)
    try:
        logits = engine.scheduler.call(lambda: np.array(engine.loaded.model(mx.array(PROMPT))[0, -1]))
        out = engine.generate("hello", raw=True, max_tokens=4, temperature=0)
        return logits, out.tokens, out.stats.finish_reason
    finally:
        engine.close()


def test_sharded_directory_is_the_same_model(base, tmp_path):
    d = _variant(base, tmp_path)
    _shard(d)
    logits, tokens, _ = _logits_and_reply(d)
    ref_logits, ref_tokens, _ = _logits_and_reply(base)
    assert tokens == ref_tokens
    np.testing.assert_array_equal(logits, ref_logits)


def test_generation_config_eos_list_ends_the_reply_at_each(base, tmp_path):
    _, tokens, reason = _logits_and_reply(base)
    assert reason == "length" and 2 not in tokens  # config.json's EOS 2 never comes
    first = tokens[0]
    for eos in ([2, first], [first, 2]):
        d = _variant(base, tmp_path, f"eos-{eos[0]}")
        (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "bos_token_id": 1}))
        _, tokens, reason = _logits_and_reply(d)
        assert (tokens, reason) == ([], "stop")


def test_a_stored_lm_head_is_used_when_the_config_does_not_say_tied(base, tmp_path):
    weights = mx.load(str(base / "model.safetensors"))
    head = mx.array(np.random.default_rng(5).normal(0, 0.05, weights["model.embed_tokens.weight"].shape)
                    .astype(np.float32))
    untied = _variant(base, tmp_path, "untied")
    mx.save_safetensors(str(untied / "model.safetensors"), {**weights, "lm_head.weight": head})
    _edit_config(untied, tie_word_embeddings=False)
    unsaid = _variant(base, tmp_path, "unsaid")
    shutil.copy(untied / "model.safetensors", unsaid / "model.safetensors")
    _edit_config(unsaid, tie_word_embeddings=None)
    tied = _variant(base, tmp_path, "tied")  # tied said: a stored head is dropped, as before
    shutil.copy(untied / "model.safetensors", tied / "model.safetensors")

    np.testing.assert_array_equal(_logits_and_reply(unsaid)[0], _logits_and_reply(untied)[0])
    np.testing.assert_array_equal(_logits_and_reply(tied)[0], _logits_and_reply(base)[0])
    no_head = _variant(base, tmp_path, "no-head")  # unsaid and no head stored: tied
    _edit_config(no_head, tie_word_embeddings=None)
    np.testing.assert_array_equal(_logits_and_reply(no_head)[0], _logits_and_reply(base)[0])


def _truncate(f: Path) -> str:
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return "truncated"


def _empty(f: Path) -> str:
    f.write_bytes(b"")
    return "truncated"


def _lfs_pointer(f: Path) -> str:
    f.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 2670739\n")
    return "git lfs pull"


@pytest.mark.parametrize("damage", [_truncate, _empty, _lfs_pointer])
def test_a_broken_shard_is_named_in_one_line(base, tmp_path, capsys, damage):
    d = _variant(base, tmp_path, "broken dir ü")  # a path with a space and non-ASCII
    shard = _shard(d)[1]
    cause = damage(d / shard)
    with pytest.raises(ModelFormatError, match=cause) as info:
        Engine.load(str(d), progress=False)
    assert shard in str(info.value)
    assert main(["generate", "-m", str(d), "-p", "hi", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and shard in err[0] and cause in err[0]


def test_a_missing_lm_head_is_one_line(base, tmp_path):
    d = _variant(base, tmp_path)
    _edit_config(d, tie_word_embeddings=False)
    with pytest.raises(ModelFormatError) as info:
        Engine.load(str(d), progress=False)
    message = str(info.value)
    assert "lm_head.weight" in message and "\n" not in message and message.count(str(d)) == 1


@pytest.mark.parametrize("model_type, needle", [("frobnicator", "frobnicator"), (None, "no model_type")])
def test_a_config_without_a_known_model_type_is_named(base, tmp_path, model_type, needle):
    d = _variant(base, tmp_path)
    _edit_config(d, model_type=model_type, architectures=["LlamaForCausalLM"])
    with pytest.raises(ModelFormatError, match=needle) as info:  # was a bare KeyError: 'model_type'
        Engine.load(str(d), progress=False)
    assert str(d) in str(info.value) and "\n" not in str(info.value)
