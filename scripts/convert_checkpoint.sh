#!/usr/bin/env bash
# Consolidate the DeepSpeed ZeRO shards of a `scopebench train` checkpoint into one
# model.safetensors inside it (the upstream convert_checkpoint.sh). Usage:
#   scripts/convert_checkpoint.sh outputs/train/<name>/checkpoints/000040/
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 <checkpoint folder>" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${here}/.venv/bin/python"
[ -x "$python" ] || python=python3
exec "$python" -m scopebench.cli convert-checkpoint "$1"
