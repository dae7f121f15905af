# syntax=docker/dockerfile:1
# The agentrun-operator image: the operator (`agentrun run`, the default) and the step runner
# (`agentrun step -- COMMAND ...`) in one image.
#
#   docker build -t agentrun-operator:0.1.0 .
#
# NOTE: this Dockerfile is not built in the development environment this project grew up in
# (no Docker engine there); hack/e2e-kind.sh builds it and runs the e2e suite against it
# wherever Docker is available.

# --- builder: a virtualenv at /opt/agentrun, exactly as uv.lock pins it -------------------------
# Same base as the runtime, so the venv's interpreter symlinks point at the same Python.
FROM python:3.11-slim AS builder
# uv at the version hack/ensure-uv.sh pins.
COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3.11 \
    UV_PROJECT_ENVIRONMENT=/opt/agentrun
WORKDIR /src
# Dependencies first (a layer that changes only with uv.lock), then the project itself.
COPY pyproject.toml uv.lock ./
# The workspace's local-cluster member is declared in pyproject.toml: only its metadata is
# copied (the image installs no development packages).
COPY hack/devcluster/pyproject.toml ./hack/devcluster/pyproject.toml
RUN uv sync --locked --no-dev --no-install-project
COPY README.md ./
COPY operator ./operator
RUN uv sync --locked --no-dev --no-editable

# --- runtime ----------------------------------------------------------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="agentrun-operator" \
      org.opencontainers.image.description="Durable AI agent workflows as Kubernetes custom resources" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/agentrun /opt/agentrun
ENV PATH=/opt/agentrun/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Non-root, numeric (so runAsNonRoot can check it); the same uid as step pods' default.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["agentrun"]
CMD ["run", "--all-namespaces"]
