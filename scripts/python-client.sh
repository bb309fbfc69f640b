#!/usr/bin/env bash
# Installs the official Kubernetes Python client (PyPI `kubernetes`) into a private virtualenv
# where it is missing, and prints the path of the venv's python.
#
#   KUBE_PYTHON_VENV     where the venv lives (default: $HOME/.cache/ccm-rs/kubernetes-venv)
#   KUBE_PYTHON_VERSION  the client version to install (default: the one pinned below, the
#                        client of Kubernetes 1.33, the API version this project serves)
#
# Used by scripts/test, which exports CCM_KUBE_PYTHON=<venv>/bin/python for the Python client's
# test (core-cluster/tests/python_client.rs). Safe to run again: it does nothing when the pinned
# version is there.
set -euo pipefail

KUBE_PYTHON_VERSION="${KUBE_PYTHON_VERSION:-33.1.0}"
venv="${KUBE_PYTHON_VENV:-$HOME/.cache/ccm-rs/kubernetes-venv}"
python="$venv/bin/python"

installed() {
    [ -x "$python" ] && "$python" - "$KUBE_PYTHON_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
import kubernetes.client  # noqa: F401
import kubernetes.config  # noqa: F401
import kubernetes.watch  # noqa: F401
sys.exit(0 if version("kubernetes") == sys.argv[1] else 1)
PY
}

if ! installed; then
    echo "scripts/python-client.sh: installing kubernetes==$KUBE_PYTHON_VERSION into $venv" >&2
    command -v python3 >/dev/null 2>&1 || { echo "scripts/python-client.sh: python3 is missing" >&2; exit 1; }
    if [ ! -x "$python" ]; then
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
    fi
    "$python" -m pip install --quiet --disable-pip-version-check "kubernetes==$KUBE_PYTHON_VERSION" >&2
    installed || { echo "scripts/python-client.sh: kubernetes==$KUBE_PYTHON_VERSION did not install into $venv" >&2; exit 1; }
fi
echo "$python"
