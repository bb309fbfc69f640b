#!/usr/bin/env bash
# Installs the official Kubernetes Python client (PyPI `kubernetes`) into a private virtualenv
# where it is missing, and prints the path of the venv's python.
#
#   KUBE_PYTHON_VENV     where the venv lives (default: $HOME/.cache/ccm-rs/kubernetes-venv)
#   KUBE_PYTHON_VERSION  the client version to install (default: the one pinned below, the
#                        client of Kubernetes 1.33, the API version this project serves)
#
# Used by scripts/test, which exports CCM_KUBE_PYTHON=<venv>/bin/python for the Python client's
# test (core-cluster/tests/it/python_client.rs). Safe to run again: it does nothing when the pinned
# version is there.
set -euo pipefail
. "$(dirname "$0")/lib/venv.sh"

KUBE_PYTHON_VERSION="${KUBE_PYTHON_VERSION:-33.1.0}"
ensure_venv_package scripts/python-client.sh \
    "${KUBE_PYTHON_VENV:-$HOME/.cache/ccm-rs/kubernetes-venv}" \
    "kubernetes==$KUBE_PYTHON_VERSION" '
import sys
from importlib.metadata import version
import kubernetes.client, kubernetes.config, kubernetes.watch  # noqa: F401
sys.exit(0 if version("kubernetes") == sys.argv[1] else 1)
'
