# syntax=docker/dockerfile:1
# API and dashboard: `python -m api`, on a slim Python image (it needs no GPU).
# Build from the repository root: docker build -f docker/api.Dockerfile -t gemmtune-api .
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md /src/
COPY kernels /src/kernels
COPY tuner /src/tuner
COPY db /src/db
COPY api /src/api
COPY gemmtune /src/gemmtune
RUN pip install /src && rm -rf /src

RUN useradd --system --create-home --shell /usr/sbin/nologin gemmtune
USER gemmtune
WORKDIR /home/gemmtune

EXPOSE 8000
# 0.0.0.0: reachable through the container's published port (the default listens on loopback).
ENTRYPOINT ["python", "-m", "api"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
