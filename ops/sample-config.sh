#!/usr/bin/env bash
# Regenerate ops/mpbroker.toml from `mpbroker config show`: every setting, commented out.
# `config show` ends with the memory budget (TOML comments from a '# Memory budget:' line
# on), which depends on the machine's CPU count (one gateway per CPU): the sample stops
# before it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shown="$("$root/.venv/bin/python" -m mpbroker config show)"
if ! grep -q '^# Memory budget:' <<<"$shown"; then
    echo "sample-config.sh: no '# Memory budget:' line in mpbroker config show" >&2
    exit 1
fi
{
    echo "# mpbroker sample configuration: every setting with its default (mpbroker config show)."
    echo "# Uncomment and change what you need; unknown keys and bad values are refused at start."
    echo
    # The settings up to the budget, without the blank line before it.
    awk '/^# Memory budget:/ { exit } /^$/ { blank++; next } { for (; blank; blank--) print ""; print }' <<<"$shown" |
        sed -E 's/^([a-z0-9_]+ = )/# \1/'
} > "$root/ops/mpbroker.toml"
