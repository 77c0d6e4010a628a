#!/usr/bin/env bash
# Set up the simulator and run the main job on its embedded default spec
# (StreamRL 7B on 32 H800 GPUs, stream-async): prints a summary, writes runs/.../timeline.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tandem run "$@"
