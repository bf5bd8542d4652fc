"""benchmarks/gpu_figures.sh: a payload packed here in parts comes back whole there, or not at all."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The script runs here and on the lent GPU machine (Linux): GNU split, stat -c, sha256sum.
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GNU coreutils (Linux) only")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_figures.sh"


def sh(*args: str, stage: Path) -> subprocess.CompletedProcess:
    # Parts of 1 MB stand in for the 62.5 MB ones, so the test writes 2.5 MB, not 130.
    return subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, "STAGE": str(stage), "PART_BYTES": "1000000"},
                          capture_output=True, text=True, check=True)


def test_parts_fit_a_call_and_join_only_when_complete_and_intact(tmp_path):
    big = tmp_path / "model.gguf"
    big.write_bytes(os.urandom(2_500_000))  # three parts of <= 1 MB
    packed, stage = tmp_path / "packed", tmp_path / "stage"
    packed.mkdir()
    sh("pack", str(packed), str(big), stage=stage)
    folders = sorted(packed.iterdir())
    assert [f.name for f in folders] == ["model.gguf.00", "model.gguf.01", "model.gguf.02"]
    assert all(sum(p.stat().st_size for p in f.iterdir()) <= 1_000_200 for f in folders)
    for f in folders[:2]:
        sh("stage", str(f), stage=stage)
    out = sh("join", stage=stage)
    assert "parts missing or damaged (2 here)" in out.stderr and not (stage / "model.gguf").exists()
    last = folders[2] / "model.gguf.part.02"
    good = last.read_bytes()
    last.write_bytes(bytes([good[0] ^ 0xFF]) + good[1:])  # a part damaged on the way (a byte that differs, always)
    sh("stage", str(folders[2]), stage=stage)
    assert "missing or damaged (3 here)" in sh("join", stage=stage).stderr and not (stage / "model.gguf").exists()
    last.write_bytes(good)
    sh("stage", str(folders[2]), stage=stage)
    assert "joined model.gguf" in sh("join", stage=stage).stderr
    joined = stage / "model.gguf"
    assert hashlib.sha256(joined.read_bytes()).digest() == hashlib.sha256(big.read_bytes()).digest()
    assert not list(stage.glob("model.gguf.part.*"))  # the parts are gone once joined
