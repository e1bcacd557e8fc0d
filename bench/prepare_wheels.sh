#!/usr/bin/env bash
# Build the wheel set the GPU host needs (it has no network; preinstalled: torch 2.11, transformers 5.17,
# accelerate 1.15, peft 0.21.0, pyarrow, xxhash, ninja, py-cpuinfo, msgpack, but not trl, datasets, deepspeed,
# bitsandbytes, liger-kernel, pydantic 2.13+). Run on a machine with PyPI access, in the repo root; writes .whl/
# (ignored through .git/info/exclude). transformers/peft are included too, at the versions pyproject.toml pins, so
# the GPU runs use the stack the CPU tests use (transformers 5.17 has no `activation_checkpointing` TrainingArguments
# field).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
mkdir -p .whl
PLAT="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
 --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64"
for p in trl==1.16.0 datasets==5.2.0 liger-kernel==0.8.5 bitsandbytes==0.50.2 pydantic==2.14.4 pydantic-core==2.50.5 \
         annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 hjson==3.1.0 dill==0.4.1 \
         multiprocess==0.70.19 transformers==5.24.0 peft==0.21.2 safetensors==0.8.0 regex==2026.11.19; do
  python3 -m pip download -q --no-deps --only-binary=:all: $PLAT -d .whl "$p"
done
# deepspeed has only an sdist: build a pure-python wheel without ops (nothing here needs a DeepSpeed op:
# the optimizer is torch's AdamW, CPU offload included, see bench/README.md).
ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1 || \
  DS_BUILD_OPS=0 DS_ACCELERATOR=cuda python3 -m pip wheel -q deepspeed==0.19.8 --no-deps --no-build-isolation -w .whl
# bitsandbytes ships one native library per CUDA/ROCm version (43 MB); the GPU host's torch is cu130, so keep
# the CUDA 13 and CPU libraries only (.whl/ is copied to the host with the working tree: keep it small).
python3 bench/slim_wheel.py .whl/bitsandbytes-0.50.2-*.whl --keep 'libbitsandbytes_cuda13' --keep 'libbitsandbytes_cpu' \
  --drop 'libbitsandbytes_'
du -sh .whl
