# syntax=docker/dockerfile:1
# Tuner worker: `python -m tuner` on the one GPU the container is given (inside it, index 0).
# Build from the repository root: docker build -f docker/tuner.Dockerfile -t gemmtune-tuner .
#
# What the GPU work needs at run time, and where it comes from:
#   NVRTC           the nvidia-cuda-nvrtc wheel (a core dependency)
#   cuBLAS          the nvidia-cublas wheel (the `gpu` extra), for the baseline
#   libcuda.so      the host driver, mounted in by the NVIDIA Container Toolkit
# The CUDA base image adds what the toolkit reads: NVIDIA_DRIVER_CAPABILITIES (compute,utility)
# and NVIDIA_REQUIRE_CUDA, so a host driver too old for CUDA 13 is refused when the container
# starts rather than failing in the middle of a run.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

# Ubuntu's Python is externally managed (PEP 668), so gemmtune gets a virtual environment.
ENV VIRTUAL_ENV=/opt/gemmtune \
    PATH=/opt/gemmtune/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/gemmtune

COPY pyproject.toml README.md /src/
COPY kernels /src/kernels
COPY tuner /src/tuner
COPY db /src/db
COPY api /src/api
COPY gemmtune /src/gemmtune
RUN pip install '/src[gpu]' && rm -rf /src

# An unprivileged user; the CUBIN cache folder is theirs, so a named volume mounted there is too.
RUN useradd --system --create-home --shell /usr/sbin/nologin gemmtune \
 && mkdir -p /var/cache/gemmtune \
 && chown gemmtune:gemmtune /var/cache/gemmtune
ENV GEMMTUNE_CACHE=/var/cache/gemmtune/cubins
USER gemmtune
WORKDIR /home/gemmtune

# The tuner stops between trials on SIGINT (recording the run as interrupted); SIGTERM would
# kill it in the middle of one.
STOPSIGNAL SIGINT
ENTRYPOINT ["python", "-m", "tuner"]
CMD ["--gpu", "0"]
