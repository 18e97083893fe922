#!/usr/bin/env bash
# Install what is needed and run every check: lint, types, then the whole test suite
# (unit, property and end-to-end tests against real broker processes).
# Extra arguments go to pytest, e.g. `bash ops/test.sh -x -k queues`.
set -euo pipefail
MPBROKER_EXTRAS=test
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
"$venv/bin/mypy"
exec "$venv/bin/pytest" "$@"
