#!/usr/bin/env bash
# Set everything up (scripts/setup.sh --test) and run the whole test suite,
# real-model tests included. Extra arguments go to pytest: -m "not slow" is the inner
# loop (no real model, about 3 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Two workers, one per core (-n 0 runs in this process); the tests of one real model go to
# one worker (--dist loadgroup), so it is loaded once per run.
exec .venv/bin/python -m pytest -n "${MLOTSPARK_TEST_WORKERS:-2}" --dist loadgroup "$@"
