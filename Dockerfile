# syntax=docker/dockerfile:1
# modelpool-extproc: build a wheel, install it into a clean slim image, run as non-root.
#
# The base is pinned by digest so a rebuild gets the same bytes; the tag only says what the
# digest is. This digest of python:3.11.11-slim-bookworm is the one several public projects
# pin (read from their Dockerfiles); check or bump it with
#   docker buildx imagetools inspect python:3.11.11-slim-bookworm
# (or let Renovate/Dependabot do it) and change it here only, both stages use it.
ARG PYTHON_BASE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

# Every dependency comes from the locks (`make lock`), each file checked against its hash:
# a rebuild installs the versions that were tested, and a changed file on the index fails it.
FROM ${PYTHON_BASE} AS builder
WORKDIR /src
COPY requirements-build.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements-build.lock
COPY pyproject.toml README.md ./
COPY extproc ./extproc
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_BASE}
ARG PYTHON_BASE
# set by the release build: docker build --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD)
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="modelpool-extproc" \
      org.opencontainers.image.description="Envoy ext_proc service that lets several LLMs share one GPU slot (LLMKube ModelPool)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_BASE}"
# read-only root fs in the pod: no .pyc writes; logs unbuffered to the container log
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# the locked dependencies, then the wheel alone; pip check: the lock covers what it requires
RUN --mount=type=bind,source=requirements.lock,target=/tmp/requirements.lock \
    --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --require-hashes -r /tmp/requirements.lock && \
    pip install --no-cache-dir --no-deps --no-index --find-links /wheels modelpool-extproc && \
    pip check
# distroless-style "nonroot" uid/gid, matching the Deployment's securityContext
USER 65532:65532
EXPOSE 9002 9090
ENTRYPOINT ["modelpool-extproc"]
CMD ["serve"]
