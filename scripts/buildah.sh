#!/usr/bin/env bash
# Makes sure Debian's buildah is installed and prints its path: apt-get installs it where
# missing (as root, or through sudo). Used by scripts/test (the image test) and
# scripts/image.sh. Safe to run again: it does nothing once buildah is there.
set -euo pipefail

if command -v buildah >/dev/null 2>&1; then
    command -v buildah
    exit 0
fi
echo "scripts/buildah.sh: installing buildah with apt-get" >&2
sudo=()
[ "$(id -u)" -eq 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y --no-install-recommends buildah >&2 ||
    { "${sudo[@]}" apt-get update >&2 && "${sudo[@]}" apt-get install -y --no-install-recommends buildah >&2; }
command -v buildah
