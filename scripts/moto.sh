#!/usr/bin/env bash
# Installs moto's server mode (PyPI `moto[server]`) into a private virtualenv where it is
# missing, and prints the path of the venv's python, which runs it as `python -m moto.server`.
#
#   MOTO_VENV      where the venv lives (default: $HOME/.cache/ccm-rs/moto-venv)
#   MOTO_VERSION   the moto version to install (default: the one pinned below)
#
# Used by scripts/test, which exports CCM_MOTO_PYTHON=<venv>/bin/python for the AWS provider's
# tests (providers/aws/tests). Safe to run again: it does nothing when the pinned version is there.
set -euo pipefail

MOTO_VERSION="${MOTO_VERSION:-5.2.5}"
venv="${MOTO_VENV:-$HOME/.cache/ccm-rs/moto-venv}"
python="$venv/bin/python"

installed() {
    [ -x "$python" ] && "$python" - "$MOTO_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
import moto.server  # noqa: F401  (the server extra's imports must load)
import flask  # noqa: F401
sys.exit(0 if version("moto") == sys.argv[1] else 1)
PY
}

if ! installed; then
    echo "scripts/moto.sh: installing moto[server]==$MOTO_VERSION into $venv" >&2
    command -v python3 >/dev/null 2>&1 || { echo "scripts/moto.sh: python3 is missing" >&2; exit 1; }
    if [ ! -x "$python" ]; then
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
    fi
    "$python" -m pip install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
    installed || { echo "scripts/moto.sh: moto[server]==$MOTO_VERSION did not install into $venv" >&2; exit 1; }
fi
echo "$python"
