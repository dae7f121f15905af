# The agentrun-operator image: the operator (`agentrun run`, the default) and the step runner
# (`agentrun step -- COMMAND ...`) in one image, on Debian bookworm with Debian's Python 3.11.
#
#   docker build -t agentrun-operator:0.1.0 .              (where debian:bookworm-slim can be pulled)
#   hack/build-images.sh                                   (anywhere with a Debian mirror: builds
#                                                           the base from Debian packages first)
#
# BASE_IMAGE is any Debian bookworm image with apt; hack/build-images.sh passes the one
# hack/build-base-images.sh makes with debootstrap (agentrun/debian:bookworm-slim). It is named by
# tag: pin the base you vetted with --build-arg BASE_IMAGE=debian:bookworm-slim@sha256:...
# The build reaches the Debian mirror (python3) and PyPI (uv, the locked dependencies); where
# the engine's default network cannot, build with `--network host`.
#
# The image runs as uid 65532 with a read-only root filesystem: nothing is written outside /tmp
# (give it a writable /tmp, as the chart and manifests/ do), bytecode is compiled at build time.
ARG BASE_IMAGE=debian:bookworm-slim

# --- Debian's Python: the interpreter of both stages (the venv's symlinks point at it) --------
# ca-certificates: the system trust store, for HTTPS from the operator's and steps' code.
FROM ${BASE_IMAGE} AS python
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates python3 \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nonroot

# --- builder: a virtualenv at /opt/agentrun, exactly as uv.lock pins it -------------------------
FROM python AS builder
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
# Certificate authorities (PEM) to trust for the downloads below, on networks whose HTTPS goes
# through an intercepting proxy: hack/build-images.sh passes the ones the building machine
# added to its own trust store. Only this stage sees them; the runtime image does not.
ARG EXTRA_CA_CERTS=""
RUN if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" >/usr/local/share/ca-certificates/build-extra.crt \
        && update-ca-certificates >/dev/null; \
    fi
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
# uv from PyPI, at the version hack/ensure-uv.sh pins.
ARG UV_VERSION=0.13.8
RUN python3 -m venv /opt/uv \
    && /opt/uv/bin/pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}"
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/bin/python3.11 \
    UV_PROJECT_ENVIRONMENT=/opt/agentrun
WORKDIR /src
# Dependencies first (a layer that changes only with uv.lock), then the project itself.
COPY pyproject.toml uv.lock ./
# The workspace's local-cluster member is declared in pyproject.toml: only its metadata is
# copied (the image installs no development packages).
COPY hack/devcluster/pyproject.toml ./hack/devcluster/pyproject.toml
# Optional extras of the distribution, e.g. EXTRAS=otel for OpenTelemetry traces
# (docs/observability.md); none by default.
ARG EXTRAS=""
RUN /opt/uv/bin/uv sync --locked --no-dev --no-install-project ${EXTRAS:+--extra $EXTRAS}
COPY README.md ./
COPY operator ./operator
RUN /opt/uv/bin/uv sync --locked --no-dev --no-editable ${EXTRAS:+--extra $EXTRAS}

# --- runtime ----------------------------------------------------------------------------------
FROM python
LABEL org.opencontainers.image.title="agentrun-operator" \
      org.opencontainers.image.description="Durable AI agent workflows as Kubernetes custom resources" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/agentrun /opt/agentrun
ENV PATH=/opt/agentrun/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root, numeric (so runAsNonRoot can check it); the same uid as step pods' default.
USER 65532:65532
# 8080: /healthz (liveness); 8081: /metrics (Prometheus) and /readyz.
EXPOSE 8080 8081
ENTRYPOINT ["agentrun"]
CMD ["run", "--all-namespaces"]
