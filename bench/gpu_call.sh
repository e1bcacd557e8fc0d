#!/usr/bin/env bash
# One measurement run on the GPU host: install the prebuilt wheels (.whl/, from prepare_wheels.sh), build the local
# models/data, then run bench plans within a budget.
#   bash bench/gpu_call.sh BUDGET_SECONDS "PLAN_ARGS" [MODELS]      e.g.  bash bench/gpu_call.sh 560 "--plan perf" 8b
# MODELS: comma list of 8b, small70b (a 70B-shaped model with few layers), ln360 (documents of lognormal lengths,
# median 360 tokens), arith (learnable rows of additions + a test split), 70b-fp8 (the 70B shape stored in fp8, with
# a 32k-vocabulary dataset), 70b-nf4 (the 70B shape stored 4-bit as the seed recipe's QLoRA quantizes it, 37 GB,
# with the 32k-vocabulary dataset), none - built on the last GPU in the background
# while the matmul ceiling and versions are taken on GPU 0. Everything lands in $OUT.
set -u
T0=$(date +%s)
BUDGET=${1:-560}; PLAN_ARGS=${2:---plan perf}; MODELS=${3:-8b}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1} NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1}
OUT=${OUT:-/tmp/bench_out}; AUX=/tmp/bench/aux; mkdir -p "$OUT" $AUX
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$AUX/pip.log" 2>&1 || { tail -20 "$AUX/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site
# the same set without transformers: the host's preinstalled 5.17 under our other pins (plan "release")
mkdir -p /tmp/site517 && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site517 $(ls .whl/*.whl | grep -v '/transformers-') > "$AUX/pip517.log" 2>&1
NG=$(nvidia-smi -L | grep -c '^GPU ')
LAST=$((NG - 1))
(
  for m in ${MODELS//,/ }; do
    case $m in
      8b) CUDA_VISIBLE_DEVICES=$LAST python3 bench/make_models.py model --shape llama3-8b --out /tmp/bench/models/llama3-8b --device cuda:0 ;;
      small70b) CUDA_VISIBLE_DEVICES=$LAST python3 bench/make_models.py model --shape llama2-70b --layers-override 8 --out /tmp/bench/models/llama2-70b-8l --device cuda:0 ;;
      70b-fp8) CUDA_VISIBLE_DEVICES=$LAST python3 bench/make_models.py model --shape llama2-70b --fp8-storage --out /tmp/bench/models/llama2-70b-fp8 --device cuda:0
               python3 bench/make_models.py data --out /tmp/bench/data/rand2048_v32k --rows 160 --row-len 2048 --vocab 32000 ;;
      70b-nf4) CUDA_VISIBLE_DEVICES=$LAST python3 bench/make_models.py model --shape llama2-70b --nf4-storage --out /tmp/bench/models/llama2-70b-nf4 --device cuda:0
               python3 bench/make_models.py data --out /tmp/bench/data/rand2048_v32k --rows 160 --row-len 2048 --vocab 32000 ;;
      ln360) python3 bench/make_models.py data --out /tmp/bench/data/lognormal360 --rows 6000 --row-len 2048 --lognormal-median 360 ;;
      arith) python3 bench/make_models.py data --out /tmp/bench/data/arith2048 --rows 1000 --row-len 2048 --arithmetic --eval-rows 32 ;;
    esac
  done
  python3 bench/make_models.py data --out /tmp/bench/data/rand2048 --rows 160 --row-len 2048 --vocab 128256
) > "$AUX/make_models.log" 2>&1 &
MK=$!
# optional checks beside the model build: CORRECTNESS=c_qlora_zero3,... (bench/correctness.py --only),
# GPU_TESTS=tests/gpu/x.py (pytest, both GPUs); results land in $OUT
BG=()
if [ -n "${CORRECTNESS:-}" ]; then
  python3 bench/correctness.py --out "$OUT" --only "$CORRECTNESS" --budget "${CORRECTNESS_BUDGET:-260}" > "$AUX/correctness.log" 2>&1 &
  BG+=($!)
fi
if [ -n "${GPU_TESTS:-}" ]; then
  PYTHONPATH=/tmp/site:api:trainer:operator:. python3 -m pytest -q -p no:cacheprovider -s ${GPU_TESTS} > "$OUT/gpu_tests.txt" 2>&1 &
  BG+=($!)
fi
{
  echo "===== versions ($(date -u +%FT%TZ))"
  python3 bench/seed/seed_baseline.py --mode versions 2>&1 | grep -v Warning
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv
  nvidia-smi topo -m; nproc; free -g | head -2; df -h /tmp | tail -1
} > "$OUT/versions.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 python3 bench/seed/seed_baseline.py --mode matmul --matmul-json "$OUT/matmul.json" > "$AUX/matmul.txt" 2>&1
wait $MK; cat "$AUX/make_models.log" | tail -5
for p in "${BG[@]}"; do wait "$p"; done
[ -n "${GPU_TESTS:-}" ] && tail -3 "$OUT/gpu_tests.txt"
[ -n "${CORRECTNESS:-}" ] && { tail -5 "$AUX/correctness.log"; cat "$OUT/correctness.jsonl" 2>/dev/null | cut -c1-400; }
ELAPSED=$(( $(date +%s) - T0 ))
echo "setup took ${ELAPSED}s"
python3 bench/run_bench.py $PLAN_ARGS --out "$OUT" --budget $(( BUDGET - ELAPSED ))
# every log in one archive, so a run's results stay a handful of files (no checkpoints or weights)
nvidia-smi > $AUX/nvidia-smi-end.txt 2>&1
tar czf "$OUT/logs.tgz" --exclude='checkpoints' --exclude='*.safetensors' --exclude='*.bin' -C /tmp/bench aux work 2>/dev/null
ls -la "$OUT"
