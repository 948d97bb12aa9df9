"""bench/kernels/gpu_check.sh is ready for a GPU: the shell script parses, refuses to run without a CUDA
device (saying why), and its Python part runs end to end on CPU (`--dry-run`: toy shapes, Triton's
interpreter), checking every kernel against its reference forward and backward before it is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trex.backends.triton.availability import triton_import_error

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "kernels" / "gpu_check.sh"


def test_gpu_check_sh_parses_and_refuses_without_a_device(tmp_path):
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script would run for real")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "needs a CUDA device" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(triton_import_error() is not None, reason=str(triton_import_error()))
def test_gpu_kernels_dry_run_checks_every_kernel_and_writes_its_tables(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "kernels" / "gpu_kernels.py"), "--dry-run", "--out", str(tmp_path)],
        check=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    kernels = {row["kernel"] for row in results["kernels"]}
    assert kernels == {
        "rms_norm",
        "swiglu",
        "rope",
        "grouped_gemm",
        "moe_permute",
        "moe_unpermute",
        "router_topk",
        "router_topk_grouped",
        "router_weights",
        "linear_cross_entropy",
    }
    assert {row["model"] for row in results["expert_gemm"]} == {"qwen3-235b", "deepseek-v4"}
    assert {"eager_host_s", "eager_device_s", "eager_sync_free_host_s"} <= set(results["moe_layer"])
    assert "| moe_permute |" in (tmp_path / "gpu_check.md").read_text()
    assert set(results["router_ties"]) == {"flat_rows_matching_torch_topk", "group_limited_rows_matching_torch_topk"}
