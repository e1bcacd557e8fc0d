# syntax=docker/dockerfile:1.7
# Two images from one file:
#   docker build --target operator -t ghcr.io/finetune-operator/operator:0.1.0 .
#   docker build --target trainer  -t ghcr.io/finetune-operator/trainer:0.1.0  .
# `operator` is small (no torch) and runs `ftjob operator`. `trainer` is what each FineTuneJob pod runs:
# `accelerate launch ... -m finetune_trainer --config /etc/ftjob/trainer.json` (the operator supplies the
# command; the entrypoint only sets up the environment). Versions are pinned to the set measured in
# shared/research/trainer.md §7 and in pyproject.toml's `trainer` extra.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------------
# operator: pure Python (kopf, kubernetes, pydantic); no torch, no CUDA.
# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY trainer ./trainer
RUN pip install --no-compile . && rm -rf /src
RUN groupadd --gid 65532 ftjob && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin ftjob
USER 65532:65532
WORKDIR /
ENTRYPOINT ["ftjob"]
CMD ["operator"]

# ---------------------------------------------------------------------------------------------------
# trainer-build: compile what has no wheel for this CUDA/torch pair (flash-attn) and DeepSpeed's ops that
# would otherwise JIT-compile at run time (CPU Adam for optimizer offload, utils), against the exact torch.
# ---------------------------------------------------------------------------------------------------
FROM ${CUDA_DEVEL_IMAGE} AS trainer-build
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.12 python3.12-venv python3.12-dev build-essential ninja-build git \
    && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install torch==2.14.1 packaging==26.4 wheel setuptools==84.2.1 psutil ninja==1.13.2
# H100/H200 (9.0) and A100 (8.0); add "8.9" for L4/L40S. MAX_JOBS bounds the compiler's memory.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
ARG MAX_JOBS=8
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} MAX_JOBS=${MAX_JOBS}
RUN mkdir /wheels \
    && FLASH_ATTENTION_FORCE_BUILD=TRUE pip wheel --no-build-isolation --no-deps -w /wheels flash-attn==2.8.3.post2 \
    && DS_BUILD_CPU_ADAM=1 DS_BUILD_UTILS=1 pip wheel --no-build-isolation --no-deps -w /wheels deepspeed==0.19.8

# ---------------------------------------------------------------------------------------------------
# trainer: CUDA runtime + torch + the trainer stack. torch's wheels bring their own CUDA libraries; the
# base image provides the loader setup the NVIDIA container toolkit expects.
# ---------------------------------------------------------------------------------------------------
FROM ${CUDA_RUNTIME_IMAGE} AS trainer
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3.12 python3.12-venv libgomp1 tini ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN python3.12 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY --from=trainer-build /wheels /wheels
RUN pip install torch==2.14.1 /wheels/*.whl && rm -rf /wheels
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY trainer ./trainer
# The project with the trainer stack and bitsandbytes; flash-attn and deepspeed are already installed above.
RUN pip install --no-compile ".[trainer,gpu]" && rm -rf /src
RUN groupadd --gid 65532 ftjob && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/ftjob \
        --shell /usr/sbin/nologin ftjob \
    && mkdir -p /checkpoints /home/ftjob/.cache && chown -R 65532:65532 /checkpoints /home/ftjob
# Caches in a writable home; the Hub token only ever comes from the HF_TOKEN env (a Secret reference).
ENV HOME=/home/ftjob HF_HOME=/home/ftjob/.cache/huggingface FTJOB_CACHE=/home/ftjob/.cache/finetune-operator \
    TORCH_EXTENSIONS_DIR=/home/ftjob/.cache/torch_extensions
USER 65532:65532
WORKDIR /home/ftjob
# tini reaps the launcher's children and forwards SIGTERM to `accelerate launch`, whose torchrun agent passes
# it to the workers, which save a checkpoint before exiting (finetune_trainer.checkpoints).
ENTRYPOINT ["/usr/bin/tini", "-g", "--"]
CMD ["python", "-m", "finetune_trainer", "--help"]
