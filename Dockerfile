# syntax=docker/dockerfile:1
#
# iggy-replicator image: a release build on the Rust image, copied into a slim
# Debian runtime that runs as an unprivileged user.
#
#   docker build -t iggy-replicator:local .
#   docker run --rm iggy-replicator:local --help
#
# The runtime expects its config at /etc/iggy-replicator/replicator.toml (mount
# it read-only) and keeps the Raft log in /var/lib/iggy-replicator (mount a
# volume). Ports: 7100 Raft RPC, 7180 admin API (/health, /ready, /status, /metrics).

# Keep in step with the toolchain the project is tested with.
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS builder
# cmake and g++ are fallbacks for C dependencies (aws-lc-sys) built from source.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake g++ make pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep the registry and the target dir across builds; the binary is
# copied out of the cached target dir because cache mounts are not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features --bin iggy-replicator \
 && install -D -m 0755 target/release/iggy-replicator /out/iggy-replicator

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# ca-certificates: TLS connections to Iggy; curl: container health checks on /health.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 replicator \
 && useradd --system --uid 10001 --gid replicator --no-create-home \
      --home-dir /var/lib/iggy-replicator --shell /usr/sbin/nologin replicator \
 && install -d -o replicator -g replicator -m 0700 /var/lib/iggy-replicator \
 && install -d -o replicator -g replicator -m 0755 /run/iggy-replicator \
 && install -d -m 0755 /etc/iggy-replicator
COPY --from=builder /out/iggy-replicator /usr/local/bin/iggy-replicator
USER 10001:10001
WORKDIR /var/lib/iggy-replicator
VOLUME ["/var/lib/iggy-replicator"]
EXPOSE 7100 7180
# SIGTERM drains: in-flight batches finish, offsets are committed, units are handed over.
STOPSIGNAL SIGTERM
ENTRYPOINT ["iggy-replicator"]
CMD ["run", "--config", "/etc/iggy-replicator/replicator.toml", "--log-format", "json"]
