"""The public surface: every name in ``mlotspark.__all__`` resolves, in a fresh
interpreter too, and keeps working across moves inside the package (the import
graph's rules are in test_layout.py)."""

from __future__ import annotations

import subprocess
import sys

import mlotspark

PUBLIC = {
    "Engine", "CascadeConfig", "Conversation", "ConversationInfo", "GenerationOptions",
    "GenerationResult", "GenerationStats", "PersistenceConfig", "ReasoningPiece", "RequestHandle", "RequestOptions",
    "MlotsparkError", "ModelError", "ModelFormatError", "ModelNotFoundError", "OfflineError",
    "OptionError", "PromptTooLongError", "SnapshotError", "SnapshotWarning", "StoreError",
    "DistributedError",
}


def test_all_names_resolve():
    assert PUBLIC <= set(mlotspark.__all__)
    for name in mlotspark.__all__:
        assert getattr(mlotspark, name) is not None, name


def test_public_imports_work_in_a_fresh_interpreter():
    code = f"from mlotspark import {', '.join(sorted(PUBLIC))}; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_errors_share_one_base():
    for name in PUBLIC:
        obj = getattr(mlotspark, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, mlotspark.MlotsparkError), name
