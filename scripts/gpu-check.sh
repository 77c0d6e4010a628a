#!/usr/bin/env bash
# The GPU path, on a machine with CUDA (CI never runs it): one short live RL run — one
# vLLM server and the trainer on one GPU, the weight group over gloo (NCCL refuses two
# ranks on one GPU) — then `tandem profile` there. The model has random weights in
# Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, MLP 4864; full multi-head KV)
# with the tiny model's character tokenizer, so the live tasks run unchanged (rewards
# stay near zero).
# Usage: bash scripts/gpu-check.sh [OUT_DIR]   (default runs/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "gpu-check: no nvidia-smi here: run it on a GPU machine"; exit 2; }
bash scripts/setup.sh --live
OUT=${1:-runs/gpu-check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.csv"
[ -f "$OUT/model/config.json" ] || .venv/bin/python - "$OUT/model" <<'PY'
import sys
from pathlib import Path

from runtime.model import TinyModelConfig, build_tiny_model

shape = TinyModelConfig(
    hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, sft_steps=0
)
build_tiny_model(shape, Path(sys.argv[1]))
PY
# vLLM's share of the GPU; the trainer (weights, AdamW, activations) takes the rest
export TANDEM_GPU_MEMORY_UTILIZATION=${TANDEM_GPU_MEMORY_UTILIZATION:-0.5}
SETS=(--set live.device=cuda --set "model.path=$OUT/model")
time .venv/bin/tandem --log-level INFO run live-tiny --live "${SETS[@]}" \
  --set run.iterations=4 --set pipeline.mode=stream-async --out "$OUT/run"
time .venv/bin/tandem --log-level INFO profile live-tiny "${SETS[@]}" --out "$OUT/profile"
echo "gpu-check: results in $OUT (run/metrics.json, profile/)"
