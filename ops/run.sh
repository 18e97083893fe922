#!/usr/bin/env bash
# Install what is needed and start the broker on its embedded defaults
# (STOMP on 127.0.0.1:61613, data under ./mpbroker-data). Extra arguments go to
# `mpbroker serve`, e.g. `bash ops/run.sh --port 0 --log-level debug`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
exec "$venv/bin/mpbroker" serve "$@"
