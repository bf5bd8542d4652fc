"""Start-up: light commands never import MLX (issue 15: they start in well under a second)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Runs a command in-process and reports which heavy modules it imported.
_PROBE = """
import contextlib, io, json, sys
from mlotspark.cli.entry import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps([m for m in ("mlx", "mlx.core", "mlx_lm", "transformers") if m in sys.modules]))
"""


# Every command's --help but bench's, whose list of suites is read from the suite modules (MLX).
HELPS = [[*cmd, "--help"] for cmd in (["chat"], ["generate"], ["pull"], ["list"], ["rm"], ["info"], ["memory"],
                                      ["memory", "add"], ["serve"], ["ps"])]


@pytest.mark.parametrize("argv", [["--help"], ["info"], ["info", "--json"], ["memory", "list"], *HELPS])
def test_light_commands_do_not_import_mlx(argv, tmp_path):
    env = {"MLOTSPARK_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{argv} imported MLX"


def test_cli_distributed_choices_match_the_package():
    from mlotspark import distributed
    from mlotspark.cli import distributed as cli_distributed

    assert cli_distributed.MODES == distributed.MODES
    assert cli_distributed.SPLITS == distributed.SPLITS
    assert cli_distributed.DEFAULT_TIMEOUT_S == distributed.DEFAULT_TIMEOUT_S
