#!/usr/bin/env bash
# A cargo runner (`target.<triple>.runner`) for scripts/test: runs a test binary with
# CARGO_HOME set to the host-only cargo home that scripts/host-cargo-home.sh prepared
# (CCM_HOST_CARGO_HOME), so anything the test runs with cargo resolves offline against only the
# crates a build for this platform downloads.
set -euo pipefail
: "${CCM_HOST_CARGO_HOME:?scripts/lib/host-only-runner.sh: CCM_HOST_CARGO_HOME is not set}"
export CARGO_HOME="$CCM_HOST_CARGO_HOME"
exec "$@"
