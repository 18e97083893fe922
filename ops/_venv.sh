# Sourced by ops/run.sh and ops/test.sh: make .venv with the project installed in it.
# Needs only Python 3.11+ (with venv) on the machine; everything else comes from PyPI.
# MPBROKER_EXTRAS: the extras the caller needs (comma-separated; ops/test.sh: test).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
if ! "${PYTHON:-python3}" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "mpbroker needs Python 3.11 or newer" >&2
    exit 1
fi
if [[ ! -x "$venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi

# The extras of a comma-separated list, sorted, once each, comma-separated.
_mpbroker_extras() {
    tr ', \t' '\n\n\n' <<<"$1" | grep -v '^$' | LC_ALL=C sort -u | paste -sd, - || true
}

# The stamp holds the extras installed (its first line) and the pyproject.toml they were
# installed from. A venv with more extras than the caller needs will do, so ops/run.sh and
# ops/test.sh one after the other install once: only a changed pyproject.toml or a missing
# extra installs again, and then the extras of both.
stamp="$venv/.mpbroker-installed"
pyproject="$(cat "$root/pyproject.toml")"
needed="$(_mpbroker_extras "${MPBROKER_EXTRAS:-}")"
installed=""
installed_pyproject=""
if [[ -f "$stamp" ]] && [[ "$(head -n 1 "$stamp")" == extras=* ]]; then
    installed="$(head -n 1 "$stamp")"
    installed="${installed#extras=}"
    installed_pyproject="$(tail -n +2 "$stamp")"
fi
missing=""
for extra in ${needed//,/ }; do
    [[ ",$installed," == *",$extra,"* ]] || missing="$missing,$extra"
done
if [[ ! -f "$stamp" ]] || [[ "$installed_pyproject" != "$pyproject" ]] || [[ -n "$missing" ]]; then
    extras="$(_mpbroker_extras "$installed,$needed")"
    what="mpbroker${extras:+[$extras]}"
    # pip's output (with setuptools' warnings about the editable install, which read like
    # errors) goes to a log, shown only when pip fails.
    log="$venv/pip-install.log"
    echo "installing $what into $venv (up to a few minutes the first time)..." >&2
    rm -f "$stamp" # a failed install leaves no stamp: the next run tries again
    started=$SECONDS
    if ! {
        "$venv/bin/python" -m pip install --upgrade pip &&
            "$venv/bin/python" -m pip install -e "$root${extras:+[$extras]}"
    } >"$log" 2>&1; then
        tail -n 25 "$log" >&2
        echo "could not install $what into $venv: pip failed (above, the end of $log)" >&2
        exit 1
    fi
    printf 'extras=%s\n%s' "$extras" "$pyproject" >"$stamp"
    echo "installed $what in $((SECONDS - started)) s" >&2
fi
