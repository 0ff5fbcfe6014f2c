# syntax=docker/dockerfile:1
# modelpool-extproc: build a wheel, install it into a clean slim image, run as non-root.

FROM python:3.11-slim AS builder
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extproc ./extproc
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
# read-only root fs in the pod: no .pyc writes; logs unbuffered to the container log
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels modelpool-extproc
# distroless-style "nonroot" uid/gid, matching the Deployment's securityContext
USER 65532:65532
EXPOSE 9002 9090
ENTRYPOINT ["modelpool-extproc"]
CMD ["serve"]
