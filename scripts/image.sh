#!/usr/bin/env bash
# Builds the `ccm` image from an already-built binary with no network and no daemon: Debian's
# buildah, FROM scratch, with the binary, the shared libraries `ldd` says it links (glibc,
# libgcc, the dynamic loader), the CA certificates, and an /etc/passwd naming the `nonroot`
# user (uid/gid 65532) it runs as; the entrypoint is /usr/local/bin/ccm, as in the Dockerfile.
#
#   scripts/image.sh BINARY [IMAGE] [--strip] [--oci-archive PATH]
#
#   BINARY               the ccm binary (e.g. target/release/ccm)
#   IMAGE                the image name (default: localhost/ccm-rs/ccm:<version>)
#   --strip              strip the binary's debug information first (a debug build's tests)
#   --oci-archive PATH   also write the image as an OCI archive (`podman load -i PATH`)
#
#   BUILDAH              the buildah to use (default: the one scripts/buildah.sh prints)
#   IMAGE_STORAGE_ROOT   keep images under this directory (vfs driver) instead of the
#                        machine's containers-storage, as the tests do
#
# Prints the image's name on stdout. To push: `buildah push IMAGE docker://REGISTRY/ccm:TAG`.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
image=""
strip=false
archive=""
while [ $# -gt 0 ]; do
    case "$1" in
        --strip) strip=true ;;
        --oci-archive) archive="$2"; shift ;;
        -*) echo "scripts/image.sh: unknown option $1" >&2; exit 2 ;;
        *) if [ -z "$binary" ]; then binary="$1"; elif [ -z "$image" ]; then image="$1";
           else echo "scripts/image.sh: too many arguments" >&2; exit 2; fi ;;
    esac
    shift
done
[ -n "$binary" ] || { echo "usage: scripts/image.sh BINARY [IMAGE] [--strip] [--oci-archive PATH]" >&2; exit 2; }
[ -x "$binary" ] || { echo "scripts/image.sh: $binary is not an executable" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
commit=$("$binary" --version | sed -n 's/.*(commit \(.*\))$/\1/p')
image="${image:-localhost/ccm-rs/ccm:$version}"
buildah="${BUILDAH:-$(scripts/buildah.sh)}"
storage=()
if [ -n "${IMAGE_STORAGE_ROOT:-}" ]; then
    storage=(--root "$IMAGE_STORAGE_ROOT/root" --runroot "$IMAGE_STORAGE_ROOT/run" --storage-driver vfs)
fi

rootfs=$(mktemp -d)
trap 'rm -rf "$rootfs"' EXIT
install -D -m 0755 "$binary" "$rootfs/usr/local/bin/ccm"
if $strip; then
    strip --strip-debug "$rootfs/usr/local/bin/ccm"
fi
# The shared libraries and the loader, at the paths the binary looks for them (symlinks
# resolved, so the image holds files).
ldd "$binary" | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]*ld-linux/{print $1}' | sort -u |
while read -r lib; do
    install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
done
# The mount points a runtime fills (podman --read-only puts a tmpfs on /tmp).
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/tmp" "$rootfs/proc" "$rootfs/dev" "$rootfs/sys"
chmod 1777 "$rootfs/tmp"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
mkdir -p "$rootfs/home/nonroot"
chown 65532:65532 "$rootfs/home/nonroot"

ctr=$("$buildah" "${storage[@]}" from --quiet scratch)
"$buildah" "${storage[@]}" copy --quiet "$ctr" "$rootfs/" / >/dev/null
"$buildah" "${storage[@]}" config \
    --user 65532:65532 \
    --workingdir / \
    --entrypoint '["/usr/local/bin/ccm"]' \
    --label org.opencontainers.image.title=ccm \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label "org.opencontainers.image.version=$version" \
    --label "org.opencontainers.image.revision=$commit" \
    "$ctr"
"$buildah" "${storage[@]}" commit --quiet --rm "$ctr" "$image" >/dev/null
if [ -n "$archive" ]; then
    rm -f "$archive"
    "$buildah" "${storage[@]}" push --quiet "$image" "oci-archive:$archive:$image" >/dev/null
fi
echo "$image"
