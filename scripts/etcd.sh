#!/usr/bin/env bash
# Installs what the etcd backend needs where missing, and prints the path of the etcd server:
#   - protoc (Debian's protobuf-compiler): the etcd-client crate compiles etcd's .proto files
#     when it builds, so every build of the workspace needs it;
#   - etcd 3.5.16, the version Kubernetes 1.32 ships and tests with: the store conformance
#     suite, the etcd tests and benches start their own members on free loopback ports
#     (tests/testkit/src/etcd.rs).
#
# etcd comes from Debian's own package, etcd-server 3.5.16-4 of Debian 13 (trixie), unpacked
# (not installed) into ETCD_DIR: bookworm's etcd-server is 3.4.23, whose write transactions
# run at a third of its puts (an applier cost etcd fixed in 3.5, BENCHMARKS.md), and
# Kubernetes 1.32 no longer tests with 3.4. The binary is static apart from libc (trixie's
# package needs libc6 >= 2.34; bookworm has 2.36). The package's SHA-256 is pinned; should
# Debian replace it, the trixie index names the current 3.5 package and its SHA-256.
#
#   ETCD_DIR   where the package is unpacked (default: $HOME/.cache/ccm-rs/etcd-3.5)
#
# Used by scripts/test (which exports CCM_ETCD=<path>) and by .ci/run before its first build.
# Safe to run again: it downloads nothing once both are there. Needs root (or sudo) for protoc.
set -euo pipefail

mirror="http://deb.debian.org/debian"
pinned_file="pool/main/e/etcd/etcd-server_3.5.16-4_amd64.deb"
pinned_sha256="0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b"
dir="${ETCD_DIR:-$HOME/.cache/ccm-rs/etcd-3.5}"
etcd="$dir/usr/bin/etcd"

if ! command -v protoc >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        sudo="sudo"
    fi
    echo "scripts/etcd.sh: installing protobuf-compiler" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler >&2
fi
command -v protoc >/dev/null 2>&1 || { echo "scripts/etcd.sh: protoc is still missing" >&2; exit 1; }

is_3_5() {
    [ -x "$1" ] && "$1" --version 2>/dev/null | grep -q '^etcd Version: 3\.5\.'
}

if is_3_5 "$etcd"; then
    echo "$etcd"
    exit 0
fi
if [ "$(dpkg --print-architecture 2>/dev/null || echo unknown)" != amd64 ]; then
    echo "scripts/etcd.sh: only amd64 is fetched here; set CCM_ETCD to an etcd 3.5 binary" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetch() { # fetch FILE SHA256: download a pool file and check it
    curl -fsSL --retry 3 -o "$work/etcd.deb" "$mirror/$1" &&
        echo "$2  $work/etcd.deb" | sha256sum -c --quiet -
}

echo "scripts/etcd.sh: fetching etcd 3.5 ($pinned_file) into $dir" >&2
if ! fetch "$pinned_file" "$pinned_sha256"; then
    # Debian replaced the package (a point release): its index says which one is current.
    echo "scripts/etcd.sh: $pinned_file is gone; reading trixie's package index" >&2
    curl -fsSL --retry 3 "$mirror/dists/trixie/main/binary-amd64/Packages.xz" |
        xz -d | awk '/^Package: etcd-server$/ && !done {f = 1} f && /^$/ {f = 0; done = 1} f' \
        >"$work/stanza"
    version="$(sed -n 's/^Version: //p' "$work/stanza")"
    file="$(sed -n 's/^Filename: //p' "$work/stanza")"
    sha256="$(sed -n 's/^SHA256: //p' "$work/stanza")"
    case "$version" in
        3.5.*) ;;
        *) echo "scripts/etcd.sh: trixie's etcd-server is '$version', not 3.5" >&2; exit 1 ;;
    esac
    fetch "$file" "$sha256" || { echo "scripts/etcd.sh: downloading $file failed" >&2; exit 1; }
fi
rm -rf "$dir"
mkdir -p "$dir"
dpkg-deb -x "$work/etcd.deb" "$dir"
is_3_5 "$etcd" || { echo "scripts/etcd.sh: the unpacked etcd does not run" >&2; exit 1; }
echo "$etcd"
