# Sourced by ops/run.sh and ops/test.sh: make .venv with the project installed in it.
# Needs only Python 3.11+ (with venv) on the machine; everything else comes from PyPI.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
extras="${MPBROKER_EXTRAS:-}"
if ! "${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "mpbroker needs Python 3.11 or newer" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
# Re-install only when the dependency list changed since the last install.
stamp="$venv/.mpbroker-installed"
want="$(cat "$root/pyproject.toml")$extras"
if [[ ! -f "$stamp" ]] || [[ "$(cat "$stamp")" != "$want" ]]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e "$root${extras:+[$extras]}"
    printf '%s' "$want" > "$stamp"
fi
