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
. "$(dirname "$0")/lib/venv.sh"

MOTO_VERSION="${MOTO_VERSION:-5.2.5}"
ensure_venv_package scripts/moto.sh "${MOTO_VENV:-$HOME/.cache/ccm-rs/moto-venv}" \
    "moto[server]==$MOTO_VERSION" '
import sys
from importlib.metadata import version
import moto.server  # noqa: F401  (the server extra'"'"'s imports must load)
import flask  # noqa: F401
sys.exit(0 if version("moto") == sys.argv[1] else 1)
'
