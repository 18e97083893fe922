#!/usr/bin/env bash
# Regenerate ops/mpbroker.toml from `mpbroker config show`: every setting, commented out.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
{
    echo "# mpbroker sample configuration: every setting with its default (mpbroker config show)."
    echo "# Uncomment and change what you need; unknown keys and bad values are refused at start."
    echo
    "$root/.venv/bin/python" -m mpbroker config show | sed -E 's/^([a-z0-9_]+ = )/# \1/'
} > "$root/ops/mpbroker.toml"
