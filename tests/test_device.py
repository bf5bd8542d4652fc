"""Device facts for `mlotspark info`, and the Metal guards (no-ops on the CPU)."""

from __future__ import annotations

import pytest

from mlotspark.platform import blas, device  # isort: skip  (mlotspark before mlx: BLAS)
from mlotspark.models.hub import catalogue, wheel_pull

import mlx.core as mx  # isort: skip

KEYS = [
    "device", "metal_available", "blas", "mlx_version", "mlx_lm_version", "python",
    "platform", "cpu", "cores_logical", "cores_physical", "memory_total_mb",
    "memory_available_mb",
]


def test_device_info_has_every_key():
    info = device.device_info()
    for key in KEYS:
        assert key in info, key
    assert info["device"] in ("cpu", "gpu (Metal)", "gpu (CUDA)", "gpu")
    assert info["metal_available"] is device.is_metal()
    assert (info["device"] == "gpu (Metal)") <= info["metal_available"]
    assert info["blas"] == blas.BLAS_IN_USE
    assert info["mlx_version"] == mx.__version__
    assert info["mlx_lm_version"][0].isdigit()
    assert info["cpu"] and info["cpu"] != "unknown"
    assert info["cores_logical"] >= info["cores_physical"] >= 1
    assert 0 < info["memory_available_mb"] <= info["memory_total_mb"]


def test_default_model_status_never_downloads(monkeypatch):
    def no_download(*a, **k):
        raise AssertionError("the default model's status line must not download")

    monkeypatch.setattr(wheel_pull, "_download_wheel", no_download)
    default = catalogue.default_model()  # SmolLM2 on the CPU, Qwen2.5-Coder on a GPU
    line = catalogue.default_model_line()
    assert default in line
    assert "not pulled" in line
    assert not catalogue.alias_path(default).exists()

    # A file of the right size counts as pulled.
    path = catalogue.alias_path(default)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(catalogue.ALIASES[default].size)
    assert "(pulled" in catalogue.default_model_line()


def test_format_info_aligned_lines():
    info = device.device_info()
    text = device.format_info(info)
    lines = text.splitlines()
    assert len(lines) == len(info)
    starts = set()
    for line, (key, value) in zip(lines, info.items()):
        assert line.startswith(f"{key}:")
        shown = ("yes" if value else "no") if isinstance(value, bool) else str(value)
        assert line.endswith(shown)
        starts.add(len(line) - len(shown))
    assert len(starts) == 1  # every value starts in the same column


def test_is_metal_guarded(monkeypatch):
    def boom():
        raise RuntimeError("no metal here")

    monkeypatch.setattr(mx.metal, "is_available", boom)
    assert device.is_metal() is False


def test_configure_metal_limits_is_noop_without_metal(monkeypatch):
    calls = []
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: calls.append(n))
    device.configure_metal_limits()
    assert calls == []


def test_configure_metal_limits_sets_recommended_working_set(monkeypatch):
    calls = []
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 12345})
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: calls.append(n))
    device.configure_metal_limits()
    assert calls == [12345]


@pytest.mark.skipif(not device.is_metal(), reason="needs a Metal GPU")
def test_metal_info_on_a_mac():
    info = device.device_info()
    assert info["device"] == "gpu (Metal)" and info["gpu_working_set_mb"] > 0


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="the BLAS preload is Linux only")
def test_mlx_imported_first_is_named_in_a_warning_and_in_info():
    """Too late to swap MLX's BLAS: say so once, and `info` does not claim OpenBLAS."""
    import subprocess
    import sys

    code = "import mlx.core\nimport mlotspark.platform.blas as b\nprint(b.BLAS_IN_USE)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("reference (mlx imported before mlotspark)")
    assert "RuntimeWarning" in out.stderr and "import mlotspark first" in out.stderr
