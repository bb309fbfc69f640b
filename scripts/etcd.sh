#!/usr/bin/env bash
# Installs what the etcd backend needs where missing, and prints the path of the etcd server:
#   - protoc (Debian's protobuf-compiler): the etcd-client crate compiles etcd's .proto files
#     when it builds, so every build of the workspace needs it;
#   - etcd (Debian's etcd-server, 3.4 on bookworm): the store conformance suite and the etcd
#     tests start their own members on free loopback ports (tests/testkit/src/etcd.rs).
#
# Used by scripts/test (which exports CCM_ETCD=<path>) and by .ci/run before its first build.
# Safe to run again: it installs nothing when both are there. Needs root (or sudo) to install.
set -euo pipefail

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
if ((${#missing[@]})); then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        sudo="sudo"
    fi
    echo "scripts/etcd.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
fi
command -v protoc >/dev/null 2>&1 || { echo "scripts/etcd.sh: protoc is still missing" >&2; exit 1; }
command -v etcd
