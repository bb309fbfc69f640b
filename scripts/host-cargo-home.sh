#!/usr/bin/env bash
# Prepares a cargo home that holds only what a build for this machine downloads, and prints
# its path.
#
# `cargo fetch --target <host>` into a private CARGO_HOME fetches exactly the crates (and the
# registry index entries) a build and the tests need on this platform, and nothing for other
# platforms. scripts/test runs every test process with CARGO_HOME pointing here (through a
# cargo runner, scripts/lib/host-only-runner.sh), so a test that runs cargo itself (for example
# `cargo metadata`) sees what a newcomer's fresh machine has, not whatever a warm cache holds.
# The build keeps the usual cargo home, so nothing is compiled twice.
#
#   CCM_HOST_CARGO_HOME   where that cargo home lives
#                         (default: <target dir>/host-cargo-home, kept with the target dir)
#
# Used by scripts/test. Safe to run again: a second fetch only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || { echo "scripts/host-cargo-home.sh: rustc -vV names no host" >&2; exit 1; }
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
home="${CCM_HOST_CARGO_HOME:-$target_dir/host-cargo-home}"
mkdir -p "$home"
# Keep the user's cargo configuration (registries, mirrors, network settings), not its caches.
user_home="${CARGO_HOME:-$HOME/.cargo}"
for config in config.toml config credentials.toml credentials; do
    if [ -f "$user_home/$config" ] && [ ! -e "$home/$config" ]; then
        cp "$user_home/$config" "$home/$config"
    fi
done
CARGO_HOME="$home" cargo fetch --quiet --locked --target "$host" >&2
echo "$home"
