#!/usr/bin/env bash
# Install what is needed and run every check: lint, types, then the whole test suite
# (unit, property and end-to-end tests against real broker processes).
# Extra arguments go to pytest, e.g. `bash ops/test.sh -x -k queues`. The tests run in
# MPBROKER_TEST_WORKERS processes (default 2; whole test files to each, so a module's broker
# or Spark session starts once); `-n 0` runs them in this one (for -s or --pdb).
set -euo pipefail
MPBROKER_EXTRAS=test
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy"
exec "$venv/bin/pytest" -n "${MPBROKER_TEST_WORKERS:-2}" --dist loadfile "$@"
