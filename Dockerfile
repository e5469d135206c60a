# dlock-server and the dlock command in one image. Build and run:
#   docker build -t dlock-server .
#   docker run -p 7436:7436 -v dlock-state:/var/lib/dlock dlock-server \
#       --fence-file /var/lib/dlock/fence
#   docker exec CONTAINER dlock --inspect -k some/key
# A cluster of three from this image: compose.yaml. Every server flag can
# be given as an environment variable instead (DLOCK_ and the flag's name
# in capitals: --data-dir is DLOCK_DATA_DIR).
# A token file is mounted and named with --token-file, with the health
# check's token beside it (see HEALTHCHECK below), e.g.
#   -v /etc/dlock/tokens:/etc/dlock/tokens:ro \
#   -v /etc/dlock/health.token:/etc/dlock/health.token:ro \
#   -e DLOCK_CLIENT_TOKEN_FILE=/etc/dlock/health.token ... --token-file /etc/dlock/tokens
# (both readable by uid 10001, the user the server and the check run as).
# packaging/check.sh checks this file in CI where docker cannot run.

# The toolchain CI uses; the builder and final image share Debian bookworm,
# so the binary finds the same glibc.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# Every workspace member's manifest must be present for cargo to load the
# workspace, so the whole context goes in (.dockerignore keeps target/ out).
COPY . .
# .git stays out of the context: name the commit for --version and
# dlock_build_info with --build-arg DLOCK_COMMIT=$(git rev-parse --short=12 HEAD).
ARG DLOCK_COMMIT=unknown
RUN cargo build --release --locked -p dlock-server -p dlock-client --bin dlock-server --bin dlock

FROM debian:bookworm-slim
# A fixed non-root uid, so a mounted state volume can be chowned to it.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin dlock \
    && mkdir -p /var/lib/dlock \
    && chown dlock:dlock /var/lib/dlock
COPY --from=build /src/target/release/dlock-server /usr/local/bin/dlock-server
COPY --from=build /src/target/release/dlock /usr/local/bin/dlock
USER 10001:10001
# Set by environment rather than as arguments, so that flags given to
# `docker run` add to them instead of replacing them (same as --listen
# 0.0.0.0:7436 --log-format json; either can still be overridden).
ENV DLOCK_LISTEN=0.0.0.0:7436 \
    DLOCK_LOG_FORMAT=json
VOLUME /var/lib/dlock
# Clients; a cluster node's peers (--peer-listen); metrics and health
# probes (--metrics-listen).
EXPOSE 7436 7437 9436
# A Ping through the client port, as a client would see the server. On a
# cluster node the ping goes on to the leader: healthy means this node serves.
# With --token-file the ping needs a token of its own: give the container
# DLOCK_CLIENT_TOKEN_FILE=/etc/dlock/health.token, a file holding one token, and add
# that token to the server's token file as an identity with no rules
# ("token health SECRET", nothing indented under it). A token the server
# knows may Ping, Hello and open and close sessions, nothing else: no lock,
# no inspect, no cluster status. (Not DLOCK_TOKEN_FILE: that is the
# server's own --token-file, the access rules, which the two would mix up.)
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/dlock", "--ping", "-s", "127.0.0.1:7436"]
ENTRYPOINT ["/usr/local/bin/dlock-server"]
