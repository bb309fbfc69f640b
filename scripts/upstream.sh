#!/usr/bin/env bash
# Builds upstream Kubernetes' own programs, at the release core-cluster serves, into a cache
# outside the clone, and prints where they are: the judge the project's behaviour is held to
# (issue #49). Nothing of upstream's source is kept in the repository: every program is built
# by `go` from its module, by name and version, through the Go module proxy.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, e2e.test
#                     k8s.io/kubernetes at KUBE_VERSION (one build module, below)
#   ginkgo            the ginkgo CLI at the version k8s.io/kubernetes requires (e2e.test's own)
#   etcd              the etcd server KUBE_VERSION tests with (its build/dependencies.yaml)
#   kwok              sigs.k8s.io/kwok's node simulator
#   cloud-controller-manager
#                     upstream's cloud-controller-manager (k8s.io/cloud-provider's app) over
#                     scripts/upstream/fake-ccm, our small provider that answers as the fake
#                     cloud does (instances, addresses, zones, routes, load balancers, latency)
#
# Versions are stamped as upstream's release build stamps them (hack/lib/version.sh: the
# gitVersion/gitMajor/gitMinor/gitTreeState/buildDate variables of k8s.io/component-base/version
# and k8s.io/client-go/pkg/version), with its flags (-trimpath, -s -w, tags
# selinux,notest,grpcnotrace, cgo off), so `kube-apiserver --version` says v1.35.4.
#
# Usage:
#   scripts/upstream.sh               builds whatever is missing, prints the bin directory
#   scripts/upstream.sh NAME...       builds only those programs, prints the path of each
#   scripts/upstream.sh --list        prints the names of the programs
#
#   CCM_UPSTREAM_CACHE   the cache (default: $HOME/.cache/ccm-rs/upstream); the programs are
#                        in $CCM_UPSTREAM_CACHE/$KUBE_VERSION/bin
#
# A program is built again only when it is missing or its stamp (bin/.stamp/NAME: what it was
# built from) differs from what the pins below say, so this is cheap to run again and a change
# of a pin rebuilds exactly what it affects. The Go module and build caches are Go's own
# (`go env GOMODCACHE GOCACHE`). Builds run under `nice -n 19`, so the cargo builds sharing the
# machine keep priority. Where Go is missing, or older than the modules ask for, the toolchain
# comes through the module proxy too (ensure_go below).
#
# Everything from cold (empty Go module and build caches) took 31 min on two cores shared with
# other builds (22 min of CPU): kube-apiserver 523 s (it compiles most of what the others
# share), kube-controller-manager 148 s, kube-scheduler 9 s, kubectl 57 s, e2e.test 279 s,
# ginkgo 3 s, etcd 66 s, kwok 242 s, cloud-controller-manager 547 s (its own module: little is
# shared). Once built, a run that finds everything takes 0.05 s.
set -euo pipefail

# ---- the pins: the one place versions are named --------------------------------------------
# The Kubernetes release core-cluster serves.
KUBE_VERSION=v1.35.4
# The etcd that release tests with: build/dependencies.yaml's "etcd" (hack/lib/etcd.sh's
# ETCD_VERSION, kubeadm's DefaultEtcdVersion) in k8s.io/kubernetes@KUBE_VERSION.
ETCD_VERSION=v3.6.6
# The ginkgo that k8s.io/kubernetes@KUBE_VERSION's go.mod requires: the CLI must match the
# library inside e2e.test (checked after the build).
GINKGO_VERSION=v2.27.2
# kwok: the newest release; its clients are client-go 0.36, which speaks to 1.35 servers.
KWOK_VERSION=v0.8.0
# The oldest Go every module above builds with (kwok's go.mod says 1.26.0), and the
# toolchain taken from the module proxy (module golang.org/toolchain) when the go at hand
# is older or missing.
GO_MIN=1.26.0
GO_TOOLCHAIN=go1.26.8
# ---------------------------------------------------------------------------------------------

PROGRAMS=(kube-apiserver kube-controller-manager kube-scheduler kubectl e2e.test ginkgo etcd
    kwok cloud-controller-manager)

me="scripts/upstream.sh"
repo="$(cd "$(dirname "$0")/.." && pwd)"
fake_ccm_src="$repo/scripts/upstream/fake-ccm"
cache="${CCM_UPSTREAM_CACHE:-$HOME/.cache/ccm-rs/upstream}/$KUBE_VERSION"
bin="$cache/bin"
src="$cache/src"

die() {
    echo "$me: $*" >&2
    exit 1
}
say() {
    echo "$me: $*" >&2
}

usage() {
    sed -n '/^# Usage:/,/^# A program/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
}

# ---- arguments -----------------------------------------------------------------------------
wanted=()
for arg in "$@"; do
    case "$arg" in
        -h | --help) usage; exit 0 ;;
        --list) printf '%s\n' "${PROGRAMS[@]}"; exit 0 ;;
        -*) usage; die "unknown option '$arg'" ;;
        *)
            known=false
            for p in "${PROGRAMS[@]}"; do [ "$p" = "$arg" ] && known=true; done
            $known || die "no program '$arg' here; these are: ${PROGRAMS[*]}"
            wanted+=("$arg")
            ;;
    esac
done
print_paths=true
if [ "${#wanted[@]}" = 0 ]; then
    wanted=("${PROGRAMS[@]}")
    print_paths=false
fi

# ---- Go -------------------------------------------------------------------------------------
version_at_least() { # version_at_least HAVE WANT: both "1.26.0"-like
    [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}
go_version_of() { # the "1.26.8" of a go command, or nothing
    "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9][0-9.]*\).*/\1/p'
}

# Sets GO to a go command of GO_MIN or newer. A suitable one on PATH is used as it is. Else
# the toolchain GO_TOOLCHAIN is fetched as the module golang.org/toolchain through the module
# proxy by whatever go there is (Debian's golang-go, installed where there is none: any go
# since modules can download a module), exactly as Go's own toolchain switching does, and
# used from the module cache.
ensure_go() {
    local have
    if command -v go >/dev/null 2>&1; then
        have="$(go_version_of go)"
        if [ -z "$have" ]; then # Go before 1.16 has no GOVERSION: treat it as too old
            have=0
        fi
        if version_at_least "$have" "$GO_MIN"; then
            GO="$(command -v go)"
            return
        fi
        say "go $have is older than $GO_MIN; fetching $GO_TOOLCHAIN through the module proxy"
    else
        say "no go on PATH: installing Debian's golang-go to fetch $GO_TOOLCHAIN with it"
        local sudo=""
        [ "$(id -u)" = 0 ] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq golang-go >&2
        command -v go >/dev/null 2>&1 || die "installing golang-go gave no go command"
    fi
    local arch os module dir scratch
    os="$(uname -s | tr 'A-Z' 'a-z')"
    case "$(uname -m)" in
        x86_64) arch=amd64 ;;
        aarch64 | arm64) arch=arm64 ;;
        *) die "no Go toolchain is fetched for $(uname -m) here; put Go $GO_MIN+ on PATH" ;;
    esac
    module="golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.$os-$arch"
    scratch="$(mktemp -d)"
    # Outside any module, with no toolchain switching of its own.
    dir="$(cd "$scratch" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "$module" |
        sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')" ||
        { rm -rf "$scratch"; die "fetching $module from the module proxy failed"; }
    rm -rf "$scratch"
    [ -f "$dir/bin/go" ] || die "$module has no bin/go"
    # A module zip keeps no modes: make the programs executable, as go's own switching does.
    chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
    unset GOROOT # the toolchain finds its own root
    GO="$dir/bin/go"
    have="$(go_version_of "$GO")"
    version_at_least "${have:-0}" "$GO_MIN" || die "$module runs as go '$have', not $GO_MIN+"
}

# ---- stamps ---------------------------------------------------------------------------------
# bin/.stamp/NAME says what NAME was built from; a program is current when it is there, runs
# and its stamp is the one the pins give now.
stamp_of() { # the stamp NAME should have
    case "$1" in
        kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | e2e.test)
            echo "k8s.io/kubernetes@$KUBE_VERSION flags=$build_flags_id" ;;
        ginkgo) echo "github.com/onsi/ginkgo/v2@$GINKGO_VERSION k8s.io/kubernetes@$KUBE_VERSION flags=$build_flags_id" ;;
        etcd) echo "go.etcd.io/etcd/server/v3@$ETCD_VERSION" ;;
        kwok) echo "sigs.k8s.io/kwok@$KWOK_VERSION stages" ;;
        cloud-controller-manager)
            echo "fake-ccm $(cd "$fake_ccm_src" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16) flags=$build_flags_id" ;;
    esac
}
is_current() {
    [ -x "$bin/$1" ] && [ -f "$bin/.stamp/$1" ] && [ "$(cat "$bin/.stamp/$1")" = "$(stamp_of "$1")" ]
}

# ---- the build modules ----------------------------------------------------------------------
# Upstream's release build flags (hack/lib/golang.sh, non-debug): stripped, trimmed paths,
# these tags, static. All of k8s.io/kubernetes' programs share them, so its packages compile
# once for all of them.
k8s_tags="selinux,notest,grpcnotrace"
build_flags_id="trimpath,s,w,cgo0,tags=$k8s_tags,v1" # bump v1 when the flags change
kube_minor="${KUBE_VERSION#v1.}"
kube_minor="${kube_minor%%.*}"
build_date="$(date -u +'%Y-%m-%dT%H:%M:%SZ')"
version_ldflags() { # -X flags stamping KUBE_VERSION as hack/lib/version.sh does
    local pkg
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        printf -- "-X '%s.%s=%s' " \
            "$pkg" gitVersion "$KUBE_VERSION" \
            "$pkg" gitMajor 1 \
            "$pkg" gitMinor "$kube_minor" \
            "$pkg" gitTreeState clean \
            "$pkg" buildDate "$build_date"
    done
}

# The module that builds k8s.io/kubernetes' programs: k8s.io/kubernetes requires its staging
# modules (k8s.io/api, client-go, ...) at v0.0.0 and replaces them with ./staging paths, which
# only work inside its own repository; here each is replaced by its published v0.X.Y instead.
# The list is read from k8s.io/kubernetes' own go.mod, so it follows the release.
k8s_module() {
    local dir="$src/kubernetes" gomod staging_version="v0.${KUBE_VERSION#v1.}"
    if [ -f "$dir/go.mod" ] && grep -q "^// pins: $KUBE_VERSION $GINKGO_VERSION\$" "$dir/go.mod"; then
        return
    fi
    say "preparing the build module for k8s.io/kubernetes $KUBE_VERSION"
    mkdir -p "$dir"
    gomod="$(cd "$dir" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -f "$gomod" ] || die "the module proxy gave no go.mod for k8s.io/kubernetes@$KUBE_VERSION"
    {
        echo "// Generated by scripts/upstream.sh: builds k8s.io/kubernetes' programs."
        echo "// pins: $KUBE_VERSION $GINKGO_VERSION"
        echo "module ccm-rs.local/upstream/kubernetes"
        echo
        # The go and godebug lines of k8s.io/kubernetes, so the programs get its GODEBUG defaults.
        grep -E '^(go|godebug) ' "$gomod"
        echo
        echo "require ("
        echo "	k8s.io/kubernetes $KUBE_VERSION"
        echo "	github.com/onsi/ginkgo/v2 $GINKGO_VERSION"
        echo ")"
        echo
        echo "replace ("
        sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9.-]*\) => \./staging/src/.*#\1#p' "$gomod" |
            while read -r m; do echo "	$m => $m $staging_version"; done
        echo ")"
    } >"$dir/go.mod.new"
    grep -q "k8s.io/api => k8s.io/api $staging_version" "$dir/go.mod.new" ||
        die "k8s.io/kubernetes@$KUBE_VERSION's go.mod no longer replaces its staging modules as expected"
    rm -f "$dir/go.sum"
    mv "$dir/go.mod.new" "$dir/go.mod"
}

# A build module requiring one module at one version (etcd, kwok): built as that module's own
# go.mod selects its dependencies (their replace directives, which only work in their
# repositories, aside).
plain_module() { # plain_module DIR MODULE VERSION [MODULE VERSION]...
    local dir="$src/$1" pins
    shift
    pins="$*"
    if [ -f "$dir/go.mod" ] && grep -qxF "// pins: $pins" "$dir/go.mod"; then
        return
    fi
    mkdir -p "$dir"
    {
        echo "// Generated by scripts/upstream.sh."
        echo "// pins: $pins"
        echo "module ccm-rs.local/upstream/$(basename "$dir")"
        echo
        echo "go $GO_MIN"
        echo
        echo "require ("
        while [ "$#" -gt 0 ]; do
            echo "	$1 $2"
            shift 2
        done
        echo ")"
    } >"$dir/go.mod"
    rm -f "$dir/go.sum"
}

# Runs go for a build: niced, in module DIR, the binary written to bin/.NAME.tmp and moved
# into place when it is complete.
go_in() { # go_in DIR go-args...
    local dir="$1"
    shift
    (cd "$dir" && GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local nice -n 19 "$GO" "$@")
}

build() { # build NAME: builds one program and stamps it
    local name="$1" tmp="$bin/.$1.tmp" start
    start=$(date +%s)
    say "building $name"
    rm -f "$tmp"
    case "$name" in
        kube-apiserver | kube-controller-manager | kube-scheduler | kubectl)
            k8s_module
            CGO_ENABLED=0 go_in "$src/kubernetes" build -trimpath -tags "$k8s_tags" \
                -ldflags "all=$(version_ldflags) -s -w" -o "$tmp" "k8s.io/kubernetes/cmd/$name"
            ;;
        e2e.test)
            k8s_module
            CGO_ENABLED=0 go_in "$src/kubernetes" test -c -trimpath -tags "$k8s_tags" \
                -ldflags "all=$(version_ldflags) -s -w" -o "$tmp" k8s.io/kubernetes/test/e2e
            ;;
        ginkgo)
            # In the same module as e2e.test, so the CLI is the library e2e.test was built with.
            k8s_module
            CGO_ENABLED=0 go_in "$src/kubernetes" build -trimpath -ldflags "-s -w" -o "$tmp" \
                github.com/onsi/ginkgo/v2/ginkgo
            grep -qF "${GINKGO_VERSION#v}" <<<"$("$tmp" version)" ||
                die "the ginkgo built is '$("$tmp" version)', not $GINKGO_VERSION (k8s.io/kubernetes@$KUBE_VERSION's); update GINKGO_VERSION"
            ;;
        etcd)
            # etcd's own build (scripts/build_lib.sh) builds server/ with these flags; GitSHA
            # stays "Not provided": a module carries no commit.
            plain_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
            CGO_ENABLED=0 go_in "$src/etcd" build -trimpath -ldflags "-s -w" -o "$tmp" \
                go.etcd.io/etcd/server/v3
            grep -q "^etcd Version: ${ETCD_VERSION#v}\$" <<<"$("$tmp" --version)" ||
                die "the etcd built says '$("$tmp" --version | head -n1)', not ${ETCD_VERSION#v}"
            ;;
        kwok)
            plain_module kwok sigs.k8s.io/kwok "$KWOK_VERSION"
            CGO_ENABLED=0 go_in "$src/kwok" build -trimpath \
                -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" -o "$tmp" \
                sigs.k8s.io/kwok/cmd/kwok
            # kwok run on its own has no stages: beside it, the ones kwokctl gives a cluster
            # by default (kustomize/stage/fast: node-initialize, node-heartbeat-with-lease,
            # pod-ready, pod-complete, pod-delete), read from the module's own source.
            local kwok_dir stage
            kwok_dir="$(go_in "$src/kwok" list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
            for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
                pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
                [ -f "$kwok_dir/kustomize/stage/$stage.yaml" ] ||
                    die "sigs.k8s.io/kwok@$KWOK_VERSION has no kustomize/stage/$stage.yaml"
                echo "---"
                cat "$kwok_dir/kustomize/stage/$stage.yaml"
            done >"$bin/kwok-stages.yaml"
            ;;
        cloud-controller-manager)
            # Our module, in the repository: built where it is, its go.mod and go.sum read
            # only (never rewritten), after checking it follows the pinned release.
            local have
            have="$(cd "$fake_ccm_src" && GOFLAGS=-mod=readonly GOTOOLCHAIN=local "$GO" list -m -f '{{.Version}}' k8s.io/cloud-provider)"
            [ "$have" = "v0.${KUBE_VERSION#v1.}" ] ||
                die "scripts/upstream/fake-ccm requires k8s.io/cloud-provider $have, not v0.${KUBE_VERSION#v1.}: run there 'go get k8s.io/cloud-provider@v0.${KUBE_VERSION#v1.} && go mod tidy'"
            (cd "$fake_ccm_src" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local \
                nice -n 19 "$GO" build -trimpath -tags "$k8s_tags" \
                -ldflags "all=$(version_ldflags) -s -w" -o "$tmp" .)
            ;;
    esac
    [ -x "$tmp" ] || die "building $name left no program"
    mv -f "$tmp" "$bin/$name"
    stamp_of "$name" >"$bin/.stamp/$name"
    say "built $name in $(($(date +%s) - start)) s"
}

# ---- main -----------------------------------------------------------------------------------
mkdir -p "$bin/.stamp" "$src"
todo=()
find_todo() {
    todo=()
    for name in "${wanted[@]}"; do
        is_current "$name" || todo+=("$name")
    done
}
find_todo
if [ "${#todo[@]}" != 0 ]; then
    # One build at a time per cache: a second run waits, then builds only what the first did
    # not (a run that finds its programs built takes no lock).
    exec 9>"$cache/.lock"
    if ! flock -n 9; then
        say "another scripts/upstream.sh is building into $cache; waiting for it"
        flock 9
        find_todo
    fi
fi
if [ "${#todo[@]}" != 0 ]; then
    ensure_go
    say "building ${todo[*]} with $("$GO" version | cut -d' ' -f3) into $bin"
    total_start=$(date +%s)
    for name in "${todo[@]}"; do
        build "$name"
    done
    say "built ${#todo[@]} program(s) in $(($(date +%s) - total_start)) s"
fi

if $print_paths; then
    for name in "${wanted[@]}"; do echo "$bin/$name"; done
else
    echo "$bin"
fi
