#!/usr/bin/env bash
# Installs what the etcd backend needs where missing, and prints the path of the etcd server:
#   - protoc (Debian's protobuf-compiler): the etcd-client crate compiles etcd's .proto files
#     when it builds, so every build of the workspace needs it;
#   - the etcd server of the Kubernetes release core-cluster serves (3.6.6 for v1.35.4: its
#     build/dependencies.yaml): the store conformance suite, the etcd tests and benches start
#     their own members on free loopback ports (tests/testkit/src/etcd.rs).
#
# etcd is built from its Go module (go.etcd.io/etcd/server/v3 at the pinned version) by
# scripts/upstream.sh, into the upstream cache ($HOME/.cache/ccm-rs/upstream/<release>/bin,
# CCM_UPSTREAM_CACHE overrides where), like the other upstream programs; the version is pinned
# there with the release's. The first run builds it (about 3 minutes on two cores from an
# empty Go cache; Go itself comes through the module proxy where missing); later runs find it.
#
# Used by scripts/test (which exports CCM_ETCD=<path>) and by .ci/run before its first build.
# Safe to run again. Needs root (or sudo) for protoc.
set -euo pipefail
cd "$(dirname "$0")/.."

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

etcd="$(scripts/upstream.sh etcd)" || { echo "scripts/etcd.sh: building etcd failed" >&2; exit 1; }
# Read whole before matching: `grep -q` leaves at its first match, and under pipefail the
# SIGPIPE etcd may then get would fail the check.
version="$("$etcd" --version 2>/dev/null || true)"
grep -q '^etcd Version: 3\.' <<<"$version" ||
    { echo "scripts/etcd.sh: $etcd does not run" >&2; exit 1; }
echo "$etcd"
