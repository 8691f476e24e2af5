#!/usr/bin/env bash
# GPU code paths that CPU CI cannot run: profiler memory/CUDA time/NVTX, pi05 and PnP on
# CUDA, the policy's training run (accelerate, fused AdamW, bf16) and compiled inference
# (reduce-overhead / CUDA graphs), one FSDP2 step in bf16 on one GPU, user policies (examples/ and
# PaliGemma) training and sampling on CUDA, with two GPUs `scopebench train` under ZeRO-2 and under
# FSDP2 (bf16, NCCL), and bench-inference's control-rate figures, cold start and a stateful
# policy's episodes on CUDA, and the ledger on GPUs (the torch backend's per-region ledger
# columns from its own kernels; `scopebench trace-ledger` on a cycle folder, against HTA).
# Under five minutes. Prints one JSON line per check (scripts/gpu_check.py), then runs the
# tests marked `gpu` (the ones pytest skips on a machine without CUDA).
# Usage: bash scripts/gpu_check.sh   (installs into .venv first if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install -q -e '.[dev]'
fi
status=0
timeout 300 .venv/bin/python scripts/gpu_check.py || status=$?
timeout 600 .venv/bin/python -m pytest -m gpu -q tests || status=$?
exit $status
