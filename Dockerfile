# syntax=docker/dockerfile:1.7
#
# One image for the API and the workers; the command picks the role:
#   API:        uvicorn service.app:create_app --factory --host 0.0.0.0 --port 8000
#   migrations: torchport db upgrade      (TORCHPORT_DATABASE_URL; once per release, first)
#   worker:     torchport worker
#
# CPU image (default):   docker build -t torchport:cpu .
# CUDA image:            docker build --build-arg DEVICE=cuda -t torchport:cuda .
#
# The CUDA image needs no CUDA base image: torch's CUDA wheels carry the CUDA runtime,
# cuDNN and NCCL as pip packages; the host provides only the driver (NVIDIA Container
# Toolkit). That keeps the two variants on the same Debian base and the same layers.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build stage
FROM ${PYTHON_IMAGE} AS build

# cpu | cuda
ARG DEVICE=cpu
ARG TORCH_VERSION=2.13.0
# torchvision built for that torch (0.28 goes with 2.13), and timm: the versions tested
# beside the `models` extra of pyproject.toml.
ARG TORCHVISION_VERSION=0.28.0
ARG TIMM_VERSION=1.0.31
# Where torch and torchvision come from. Empty = by DEVICE: the CPU-only index for cpu (a
# ~200 MB wheel instead of ~3 GB), PyPI for cuda (PyPI's Linux torch wheel is the CUDA
# build). Set it to e.g. https://download.pytorch.org/whl/cu128 to pin another CUDA minor
# version.
ARG TORCH_INDEX_URL=

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

RUN case "$DEVICE" in \
      cpu)  index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" ;; \
      cuda) index="${TORCH_INDEX_URL:-https://pypi.org/simple}" ;; \
      *)    echo "DEVICE must be cpu or cuda, not '$DEVICE'" >&2; exit 2 ;; \
    esac \
 && pip install --index-url "$index" "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"

# Dependencies first (cached while only the code changes), then the code itself.
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY engine ./engine
COPY persistence ./persistence
COPY service ./service
COPY worker ./worker
COPY torchport ./torchport
# The model libraries uploads may import (`torchport env` lists them): the `models` extra
# (transformers, diffusers, peft: peft and accelerate ask for any torch >= 2.0, which the one
# above meets), then timm without its dependencies, because pip would
# otherwise resolve timm's torchvision against PyPI, whose wheels are CUDA builds. Nothing
# here may replace the torch and torchvision installed above.
# The deployment targets (docs/targets.md): the `targets` extra (ONNX), then ExecuTorch
# without its declared dependencies (coremltools, pandas, scikit-learn, torch) and with
# what it needs; the runtime stage adds g++ for AOTInductor.
RUN pip install '.[models,targets]' \
 && pip install --no-deps "timm==${TIMM_VERSION}" \
 && pip install --no-deps executorch==1.4.1 torchao==0.18.0 \
 && pip install ruamel.yaml==0.19.1 tabulate==0.10.0 \
 && python -c "import engine, persistence, service, worker, torchport" \
 && python -c "import torch, torchvision, timm, transformers, diffusers, peft; assert torch.__version__.startswith('${TORCH_VERSION}')"

# -------------------------------------------------------------- runtime stage
FROM ${PYTHON_IMAGE} AS runtime

ARG DEVICE=cpu
ARG TORCH_VERSION=2.13.0
LABEL org.opencontainers.image.title="torchport" \
      org.opencontainers.image.description="PyTorch export as a service (API and workers)" \
      org.opencontainers.image.source="https://github.com/torchport/torchport" \
      io.torchport.device="${DEVICE}" \
      io.torchport.torch="${TORCH_VERSION}"

# bubblewrap: the sandbox's outer layer where the host allows user namespaces (it does not
# under Docker's default seccomp profile; Landlock + seccomp still apply there).
# tini: PID 1 that reaps the sandboxes' orphans and forwards signals to Celery.
# g++: the `aoti` target's compiler (a job asking for it may execute only the compiler).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bubblewrap tini ca-certificates g++ \
 && rm -rf /var/lib/apt/lists/*

# A fixed, unprivileged uid/gid (Kubernetes' runAsNonRoot checks the numeric USER).
RUN groupadd --system --gid 10001 torchport \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/torchport --create-home \
      --shell /usr/sbin/nologin torchport \
 && install -d -o 10001 -g 10001 -m 0750 /data

COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY deploy/healthcheck.py /usr/local/bin/torchport-healthcheck

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/torchport \
    XDG_CACHE_HOME=/tmp/cache \
    TORCHPORT_DATA_DIR=/data \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

WORKDIR /app
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8000

# The API answers /healthz; worker containers override this (compose: `celery inspect
# ping`; Kubernetes: probes in deploy/).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "/usr/local/bin/torchport-healthcheck"]

ENTRYPOINT ["tini", "--"]
# --no-proxy-headers: the app reads X-Forwarded-For itself, from TORCHPORT_TRUSTED_PROXIES
# only (uvicorn's own handling trusts it from loopback, or from everyone with '*').
CMD ["uvicorn", "service.app:create_app", "--factory", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers"]
