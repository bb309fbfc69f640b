# The `ccm` image for users with a registry and a container builder (docker buildx, podman,
# buildah bud):
#
#   docker build --build-arg CCM_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t REGISTRY/ccm:0.2.0 .
#   docker push REGISTRY/ccm:0.2.0
#
# Stage one builds the release binary against glibc on Debian 12; stage two is distroless'
# `cc` base (glibc, libgcc, CA certificates; no shell, no package manager) as its `nonroot`
# user, uid/gid 65532, which deploy/ccm-daemonset.yaml runs with a read-only root filesystem.
# scripts/image.sh builds the same layout from an already-built binary with no network and
# no daemon.

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# `ccm --version` prints it (ccm-bin/build.rs); the build context carries no .git.
ARG CCM_GIT_COMMIT=unknown
ENV CCM_GIT_COMMIT=${CCM_GIT_COMMIT}
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ccm \
    && install -D -m 0755 target/release/ccm /out/ccm

FROM gcr.io/distroless/cc-debian12:nonroot
ARG CCM_GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="ccm" \
      org.opencontainers.image.description="The cloud-controller-manager, with the aws and fake providers" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.revision="${CCM_GIT_COMMIT}"
COPY --from=build /out/ccm /usr/local/bin/ccm
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ccm"]
