#!/usr/bin/env bash
# Set everything up (scripts/setup.sh --test) and run the whole test suite,
# real-model tests included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest "$@"
