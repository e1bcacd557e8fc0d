# syntax=docker/dockerfile:1.7
# The project's images from one file (docs/development.md, "Images"):
#   docker build --target operator -t ghcr.io/finetune-operator/operator:0.1.0 .
#   docker build --target trainer  -t ghcr.io/finetune-operator/trainer:0.1.0  .
#   docker build --target trainer-flash-attn -t ghcr.io/finetune-operator/trainer:0.1.0-flash-attn .
# `make images` builds the same targets with buildah (hack/images.sh), from a Python base image made locally.
#
# `operator` is small (no torch) and runs `ftjob operator`. `trainer` is what each FineTuneJob pod runs:
# `accelerate launch ... -m finetune_trainer --config /etc/ftjob/trainer.json` (the operator supplies the command;
# the entrypoint only sets up the environment). One trainer image serves CPU and GPU nodes: torch's Linux wheels
# from PyPI carry the CUDA libraries as nvidia-* packages, and on a GPU node the NVIDIA container toolkit adds the
# driver; on a CPU node the same torch runs on the CPU. Versions are pinned in pyproject.toml's extras.
#
# Dependencies are installed before the sources are copied, from a requirements list extracted from
# pyproject.toml, so a source change rebuilds one small layer. Downloaded and built wheels stay in a build cache
# (RUN --mount=type=cache: BuildKit, and buildah >= 1.24) and never in a layer.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04

# ---------------------------------------------------------------------------------------------------
# requirements: the dependency lists from pyproject.toml. The stages below copy the lists, whose content (not
# pyproject.toml's) keys their dependency layers.
# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c 'import pathlib, tomllib; \
p = tomllib.loads(pathlib.Path("/src/pyproject.toml").read_text())["project"]; \
extra = p["optional-dependencies"]; out = pathlib.Path("/requirements"); out.mkdir(); \
(out / "operator.txt").write_text("\n".join(p["dependencies"]) + "\n"); \
(out / "trainer.txt").write_text("\n".join(p["dependencies"] + extra["trainer"] + extra["gpu"]) + "\n")'

# ---------------------------------------------------------------------------------------------------
# operator: pure Python (kopf, kubernetes, pydantic); no torch, no CUDA. Runs with a read-only root filesystem
# and writes nothing.
# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS operator
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY --from=requirements /requirements/operator.txt /tmp/requirements.txt
# pip wheel fills the cache (downloading only what it lacks); the install then reads the cache alone.
RUN --mount=type=cache,id=ftjob-wheels,target=/var/cache/ftjob-wheels,sharing=locked \
    pip wheel --quiet --no-cache-dir --wheel-dir /var/cache/ftjob-wheels --find-links /var/cache/ftjob-wheels -r /tmp/requirements.txt \
    && pip install --quiet --no-compile --no-cache-dir --no-index --find-links /var/cache/ftjob-wheels \
        -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY trainer ./trainer
RUN pip install --quiet --no-compile --no-cache-dir --no-deps . && rm -rf /src
RUN groupadd --gid 65532 ftjob && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin ftjob
USER 65532:65532
WORKDIR /
ENTRYPOINT ["ftjob"]
CMD ["operator"]

# ---------------------------------------------------------------------------------------------------
# trainer: the Python base + torch from PyPI + the trainer stack; no CUDA base image.
# - tini: PID 1; reaps the launcher's children and forwards SIGTERM to `accelerate launch`, whose torchrun agent
#   passes it to the workers, which save a checkpoint before exiting (finetune_trainer.checkpoints).
# - g++: DeepSpeed compiles its C++ ops (CPU Adam for optimizer offload, the CPU shared-memory allreduce) on first
#   use, into TORCH_EXTENSIONS_DIR. CUDA ops are not prebuilt: the trainer's optimizers are torch's.
# - flash-attn is not here (trainer-flash-attn below adds it); packed sequences already use torch's own varlen
#   flash kernel, and a job asking for flash_attention_2 in this image falls back to sdpa with a warning.
#
# Runs as uid 65532 and works with a read-only root filesystem. Writable paths the pod must mount (emptyDir):
#   /tmp                        temporary files (torch.compile/inductor caches, accelerate)
#   /home/ftjob/.cache          HOME's cache: HF_HOME (Hub models and datasets), FTJOB_CACHE (builtin models and
#                               datasets), TORCH_EXTENSIONS_DIR (DeepSpeed ops), TRITON_CACHE_DIR, CUDA_CACHE_PATH,
#                               MPLCONFIGDIR, XDG_CONFIG_HOME; nothing else under HOME is written
#   /checkpoints                checkpoints and the adapter (spec.output.checkpoints)
#   /dev/shm                    NCCL and DataLoader workers (a memory emptyDir)
# ---------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS trainer
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# The base image fixes the Debian release; within a release, apt versions only move for security fixes.
# hadolint ignore=DL3008
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini g++ \
    && rm -rf /var/lib/apt/lists/*
COPY --from=requirements /requirements/trainer.txt /tmp/requirements.txt
# Several GB (torch and its nvidia-* CUDA libraries): the cache makes a rebuild download nothing.
RUN --mount=type=cache,id=ftjob-wheels,target=/var/cache/ftjob-wheels,sharing=locked \
    pip wheel --quiet --no-cache-dir --wheel-dir /var/cache/ftjob-wheels --find-links /var/cache/ftjob-wheels -r /tmp/requirements.txt \
    && pip install --quiet --no-compile --no-cache-dir --no-index --find-links /var/cache/ftjob-wheels \
        -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY operator ./operator
COPY trainer ./trainer
RUN pip install --quiet --no-compile --no-cache-dir --no-deps . && rm -rf /src
RUN groupadd --gid 65532 ftjob && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/ftjob \
        --shell /usr/sbin/nologin ftjob \
    && mkdir -p /checkpoints /home/ftjob/.cache && chown -R 65532:65532 /checkpoints /home/ftjob
# Every cache and config below HOME's cache dir; the Hub token only ever comes from the HF_TOKEN env (a Secret).
ENV HOME=/home/ftjob XDG_CACHE_HOME=/home/ftjob/.cache XDG_CONFIG_HOME=/home/ftjob/.cache/config \
    HF_HOME=/home/ftjob/.cache/huggingface FTJOB_CACHE=/home/ftjob/.cache/finetune-operator \
    TORCH_EXTENSIONS_DIR=/home/ftjob/.cache/torch_extensions TRITON_CACHE_DIR=/home/ftjob/.cache/triton \
    CUDA_CACHE_PATH=/home/ftjob/.cache/nv MPLCONFIGDIR=/home/ftjob/.cache/matplotlib
USER 65532:65532
WORKDIR /home/ftjob
ENTRYPOINT ["/usr/bin/tini", "-g", "--"]
CMD ["python", "-m", "finetune_trainer", "--help"]

# ---------------------------------------------------------------------------------------------------
# trainer-flash-attn (optional, only built when asked: `--target trainer-flash-attn`, `make images
# FTJOB_FLASH_ATTN=1`): the trainer plus flash-attn, compiled against the image's own Python and torch with the
# CUDA toolkit copied from the CUDA devel image (a wheel built on that image's Ubuntu would not fit this Python
# or glibc). Compiling is long (kernels for each architecture in TORCH_CUDA_ARCH_LIST; not measured here);
# MAX_JOBS bounds the compiler's memory.
# ---------------------------------------------------------------------------------------------------
FROM ${CUDA_DEVEL_IMAGE} AS cuda-devel

FROM trainer AS flash-attn-build
# A build stage, never run as a container: it compiles as root and only its /wheels is used.
# hadolint ignore=DL3002
USER 0:0
# the toolkit's versioned directory (/usr/local/cuda is a symlink to it)
COPY --from=cuda-devel /usr/local/cuda-13.0 /usr/local/cuda
# H100/H200 (9.0) and A100 (8.0); add "8.9" for L4/L40S.
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
ARG MAX_JOBS=8
ENV CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    MAX_JOBS=${MAX_JOBS} FLASH_ATTENTION_FORCE_BUILD=TRUE
RUN --mount=type=cache,id=ftjob-wheels,target=/var/cache/ftjob-wheels,sharing=locked \
    pip install --quiet --no-cache-dir --find-links /var/cache/ftjob-wheels ninja==1.13.2 packaging==26.4 \
        setuptools==84.2.1 wheel==0.48.0 psutil==7.2.2 \
    && pip wheel --no-build-isolation --no-deps --wheel-dir /wheels flash-attn==2.8.3.post2

FROM trainer AS trainer-flash-attn
USER 0:0
# --no-deps: flash-attn's one other dependency, einops, came with deepspeed.
RUN --mount=type=bind,from=flash-attn-build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-deps /wheels/*.whl
USER 65532:65532
