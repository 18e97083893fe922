#!/usr/bin/env bash
# Install mpbroker from this checkout as a systemd service:
#
#   sudo bash ops/install.sh [--prefix /opt/mpbroker] [--extras export] [--root DIR] [--wheel FILE]
#
# It makes a venv at PREFIX and installs the checkout into it, or a wheel built from it
# (--wheel: build once, install on many hosts; never the `mpbroker` package on PyPI: that
# name belongs to an unrelated project), creates the system user mpbroker,
# installs the systemd units from ops/ and, when missing, /etc/mpbroker/mpbroker.toml.
# Running it again upgrades: the package is reinstalled into the same venv and the config is
# kept. --root DIR installs into DIR instead of / (to build a package, or in tests): then no
# user is created, nothing is chowned and systemctl is not run.
# Set PYTHON to choose the interpreter (3.11 or newer): sudo PYTHON=/usr/bin/python3.11 ...
set -euo pipefail

usage() {
    echo "usage: sudo bash ops/install.sh [--prefix DIR] [--extras LIST] [--root DIR] [--wheel FILE]" >&2
    echo "  --prefix DIR   where the venv goes (default /opt/mpbroker)" >&2
    echo "  --extras LIST  extras to install: export (pyarrow, for mpbroker-export.timer), spark" >&2
    echo "  --root DIR     install into DIR instead of / (no useradd, chown or systemctl)" >&2
    echo "  --wheel FILE   install this wheel (python -m build --wheel) instead of the checkout" >&2
}

fail() {
    echo "install.sh: $1" >&2
    exit "${2:-1}"
}

checkout="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix=/opt/mpbroker
extras=""
root=/
wheel=""
while (($#)); do
    case "$1" in
        --prefix | --extras | --root | --wheel)
            (($# >= 2)) || { usage; fail "$1 needs a value" 2; }
            case "$1" in
                --prefix) prefix="$2" ;;
                --extras) extras="$2" ;;
                --root) root="$2" ;;
                --wheel) wheel="$2" ;;
            esac
            shift 2
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *)
            usage
            fail "unknown argument: $1" 2
            ;;
    esac
done

# The prefix is written into the unit files, so it must be a plain absolute path: no spaces
# or characters that systemd (or the sed below) would read specially.
[[ "$prefix" =~ ^/[A-Za-z0-9._/-]*$ && "$prefix" != / ]] ||
    fail "--prefix must be an absolute path of letters, digits and . _ / - (got '$prefix')" 2
prefix="${prefix%/}"
[[ "$extras" =~ ^[A-Za-z0-9_,-]*$ ]] || fail "--extras must be a comma-separated list of extras (got '$extras')" 2
if [[ -n "$wheel" ]]; then
    [[ "$wheel" == *.whl && -f "$wheel" ]] || fail "--wheel must name a wheel file (got '$wheel')" 2
    wheel="$(cd "$(dirname "$wheel")" && pwd)/$(basename "$wheel")"
fi

if [[ "$root" == / ]]; then
    staged=false
    [[ "$(id -u)" -eq 0 ]] || fail "must run as root (sudo bash ops/install.sh), or with --root DIR to install into a directory" 2
else
    staged=true
    mkdir -p "$root"
    root="$(cd "$root" && pwd)"
fi
# What the venv, units and config are written under (ROOT + path); "" for /.
dest="${root%/}"
venv="$dest$prefix"

# The same Python rules as ops/_venv.sh.
python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || fail "no '$python' found: install Python 3.11 or newer, or set PYTHON"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "mpbroker needs Python 3.11 or newer ($python is $("$python" -c 'import sys; print(sys.version.split()[0])'))"
# Debian and Ubuntu ship venv's pip bootstrap separately.
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
    fail "$python cannot make a venv: install python3-venv (apt-get install python3-venv)"

# Files are read by the mpbroker user: make them world-readable whatever root's umask is.
umask 022

if $staged; then
    echo "--root: skipped creating the user mpbroker"
elif id -u mpbroker >/dev/null 2>&1; then
    echo "user mpbroker exists"
else
    # A group of the same name may be left from an earlier install.
    if getent group mpbroker >/dev/null; then group_opt=(--gid mpbroker); else group_opt=(--user-group); fi
    useradd --system "${group_opt[@]}" --home-dir /var/lib/mpbroker --shell /usr/sbin/nologin \
        --comment "mpbroker message broker" mpbroker
    echo "created the system user mpbroker"
fi

# A venv made by another Python (the system's was upgraded) cannot be reused: make it again.
want="$("$python" -c 'import sys; print(sys.version_info[:2])')"
if [[ -x "$venv/bin/python" ]] && [[ "$("$venv/bin/python" -c 'import sys; print(sys.version_info[:2])' 2>/dev/null)" != "$want" ]]; then
    echo "the venv at $venv is for another Python: making it again"
    "$python" -m venv --clear "$venv"
elif [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
    echo "made the venv $venv"
fi

# From here on, run in / and name every path in full: Python puts the working directory on
# sys.path, and in the checkout's root (where the docs run this script) that would be the
# checkout's own mpbroker/ package (and its egg-info), not the one installed into the venv.
cd /

if [[ -n "$wheel" ]]; then
    # --force-reinstall --no-deps: the same version again is installed all the same (an
    # upgrade), without reinstalling every dependency; missing ones come with a second pass.
    echo "installing mpbroker${extras:+[$extras]} from $wheel into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall \
        --no-deps "$wheel"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel${extras:+[$extras]}"
else
    # pip builds a source tree in place (build/, *.egg-info), so build from a copy: the
    # checkout stays as it was, and root-owned files never land in a user's checkout. The
    # copy leaves out what .gitignore names and the git history.
    src="$(mktemp -d)"
    trap 'rm -rf "$src"' EXIT
    tar -C "$checkout" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ --exclude=.mypy_cache --exclude=.ruff_cache \
        --exclude=.pytest_cache --exclude=.hypothesis --exclude=./mpbroker-data -cf - . |
        tar -C "$src" -xf -
    # A local directory is always reinstalled, even at the same version, so a second run
    # upgrades; dependencies are upgraded only when the new version needs it.
    echo "installing mpbroker${extras:+[$extras]} from $checkout into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$src${extras:+[$extras]}"
fi
# pip hides the build's output: say whether the hot modules were compiled (docs/operations.md),
# asking the installed package (-I: and not one PYTHONPATH or the user's site-packages name).
echo "installed $("$venv/bin/python" -I -m mpbroker --version)"

if $staged; then
    # The tree under ROOT is copied to / later: its scripts must name PREFIX, not ROOT+PREFIX.
    # (bin/python stays a link to the Python the venv was made with, which must be at the
    # same path on the target.)
    # Python does the replacing: ROOT may hold characters sed would read as a pattern.
    "$venv/bin/python" - "$venv" "$prefix" <<'PY'
import pathlib, sys

venv, prefix = (arg.encode() for arg in sys.argv[1:])
for path in pathlib.Path(sys.argv[1], "bin").iterdir():
    if path.is_file() and not path.is_symlink():
        text = path.read_bytes()
        if venv in text and b"\0" not in text:
            path.write_bytes(text.replace(venv, prefix))
PY
fi

units="$dest/etc/systemd/system"
mkdir -p "$units"
for unit in "$checkout"/ops/*.service "$checkout"/ops/*.timer; do
    sed "s|/opt/mpbroker|$prefix|g" "$unit" >"$units/$(basename "$unit")"
    chmod 0644 "$units/$(basename "$unit")"
done
echo "installed the units in $units: $(cd "$checkout/ops" && echo *.service *.timer)"

config="$dest/etc/mpbroker/mpbroker.toml"
mkdir -p "$dest/etc/mpbroker"
if [[ -e "$config" ]]; then
    echo "kept the config $config"
else
    # Owned by root (the broker cannot change its own limits), read by mpbroker, by no one else.
    install -m 0640 "$checkout/ops/mpbroker.toml" "$config"
    if $staged; then
        echo "--root: skipped chown root:mpbroker $config"
    else
        chown root:mpbroker "$config"
    fi
    echo "installed the config $config (every setting commented, at its default)"
fi

if $staged; then
    echo "--root: skipped systemctl daemon-reload"
elif [[ -d /run/systemd/system ]]; then
    systemctl daemon-reload
    if systemctl is-active --quiet mpbroker; then
        echo "mpbroker is running the old version: systemctl restart mpbroker"
    fi
else
    echo "systemd is not running: skipped systemctl daemon-reload"
fi

cat <<EOF

Next steps:
  systemctl enable --now mpbroker      # start it now and at every boot
  journalctl -u mpbroker -f            # follow its log
  systemctl reload mpbroker            # after editing /etc/mpbroker/mpbroker.toml (flow settings)
EOF
if [[ ",$extras," == *,export,* || ",$extras," == *,spark,* ]]; then
    echo "  systemctl enable --now mpbroker-export.timer   # the hourly Parquet export"
fi
