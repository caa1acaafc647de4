#!/usr/bin/env bash
# GPU check (issue 5) for one lent GPU (H200), < 5 minutes: bf16 LM throughput and MFU at a larger shape with
# torch.compile off and on, flash / efficient / math SDPA, then a 1-GPU Lightning run of each model family.
# Run from the repository root:  bash bench/gpu_check.sh   (output also in outputs/gpu_check.md)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=offline WANDB_SILENT=true
out=outputs/gpu_check.md
mkdir -p outputs
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  timeout 180 python bench/gpu_check.py || echo "gpu_check.py failed or timed out (exit $?)"
  echo; echo "### 1-GPU Lightning runs (debug=fast, bf16-mixed)"; echo "| model | exit | seconds |"; echo "|---|---|---|"
  for model in causal_lm "causal_lm moe=on" vit transformer_mt; do
    if [ "$model" = transformer_mt ] && [ ! -f conf/model/transformer_mt.yaml ]; then continue; fi
    t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout 60 python train.py model=${model%% *} ${model#"${model%% *}"} trainer=gpu precision=bf16-mixed debug=fast \
      logger=csv > "outputs/gpu_check_${model// /_}.log" 2>&1
    echo "| $model | $? | $(( $(date +%s) - t0 )) |"
  done
} 2>&1 | tee "$out"
