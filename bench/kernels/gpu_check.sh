#!/usr/bin/env bash
# GPU check of trex's Triton kernel library, for a machine with an NVIDIA GPU (not runnable on the
# CPU-only development machine; `--dry-run` exercises the same code on CPU at toy shapes).
#
#   bash bench/kernels/gpu_check.sh [OUT_DIR]
#
# Needs: a CUDA build of torch (2.13), triton, and liger-kernel==0.8.5 for the comparison columns
# (`pip install liger-kernel==0.8.5` where a package index is reachable; without it those columns say
# "unavailable"). Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md (default OUT_DIR: $OUT, else
# bench/kernels/out). The figures go to bench/RESULTS.md by hand, and the expert-GEMM throughputs reach
# the H100/H200 device profiles only through `trex calibrate`-style measured tables, never by editing
# the profiles' datasheet numbers.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-bench/kernels/out}}"
mkdir -p "$out"
python - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh needs a CUDA device (torch.cuda.is_available() is False); use gpu_kernels.py --dry-run on CPU")
print(torch.__version__, torch.cuda.get_device_name(0))
PY
unset TRITON_INTERPRET  # the kernels must compile for the GPU, not run in the interpreter
python bench/kernels/gpu_kernels.py --out "$out"
