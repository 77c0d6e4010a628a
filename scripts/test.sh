#!/usr/bin/env bash
# Set up everything (simulator, live runtime with real vLLM on CPU, test tools) and run
# the full test suite, live tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --live
set +e
.venv/bin/python -m pytest -q "$@"
status=$?
set -e
[ "$status" -eq 5 ] && { echo "no tests ran"; exit 1; }
exit "$status"
