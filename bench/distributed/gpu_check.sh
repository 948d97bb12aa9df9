#!/usr/bin/env bash
# The 1-rank distributed path on one accelerator: trex train initialises a real process group
# (nccl on CUDA) through torchrun, trains tiny models under the trivial plan, and compares the
# losses with the same run on the CPU (fp32: equal within 1e-4 relative; kernels differ).
# Usage (from the repository root, with the venv active or .venv present):
#   bash bench/distributed/gpu_check.sh
set -euo pipefail
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
TORCHRUN="$PY -m torch.distributed.run"
OUT=${OUT:-$(mktemp -d)}
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device: this check needs one GPU"
print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
PY
status=0
for model in tiny-qwen3-moe tiny-deepseek-v3 tiny-deepseek-v4; do
  args=(--model "$model" --steps 3 --seq 32 --gbs 4 --mbs 2 --json)
  # CPU reference in this process (no GPU visible), then the same run as a torchrun rank on the GPU.
  CUDA_VISIBLE_DEVICES="" "$PY" -m trex train "${args[@]}" > "$OUT/$model.cpu.json"
  $TORCHRUN --standalone --nproc-per-node 1 -m trex train "${args[@]}" > "$OUT/$model.gpu.out"
  tail -n 1 "$OUT/$model.gpu.out" > "$OUT/$model.gpu.json"
  "$PY" - "$OUT/$model.cpu.json" "$OUT/$model.gpu.json" "$model" <<'PY' || status=1
import json, math, sys
cpu, gpu = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
ok = all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(cpu["losses"], gpu["losses"]))
print(f"{sys.argv[3]}: cpu {cpu['losses']} gpu {gpu['losses']} step {gpu['step_time_s']*1e3:.1f} ms "
      f"peak/rank {gpu['peak_memory_per_rank_bytes']/2**20:.1f} MiB -> {'OK' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
done
exit $status
