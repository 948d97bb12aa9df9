"""Planner search time of two commits, side by side in one run (alternating, same machine and load).

    python bench/planner/compare_commits.py --old 834d846 [--rounds 2] [--models deepseek-v3,qwen3-235b-a22b]

Checks the old commit out into a temporary git worktree, then alternates old / new (this checkout)
`plan_parallel` searches with one worker, each in a fresh process whose `trex` imports come from that
tree. Prints each search's seconds with its best plan and predicted step time, so a speed-up that
changes the answer shows. Needs trex installed editable (`pip install -e .`): the old tree is loaded
through the editable finder's package mapping.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = {
    "deepseek-v4-pro": ("cloudmatrix384", 1024, 4096, 1024),
    "deepseek-v4-flash": ("cloudmatrix384", 256, 4096, 512),
    "deepseek-v3": ("h100", 1024, 4096, 8192),
    "qwen3-235b-a22b": ("h100", 256, 4096, 2048),
}

# Runs in a child process: point the editable install's package mapping at `root`, then search.
_CHILD = r"""
import json, sys, time
root, here, model, cluster_name, devices, seq, gbs = sys.argv[1:8]
finder = next((m for n, m in sys.modules.items() if n.startswith("__editable__") and "trex" in n and hasattr(m, "MAPPING")), None)
if finder is None:
    sys.exit("trex is not installed editable: pip install -e .")
for name in list(finder.MAPPING):
    finder.MAPPING[name] = finder.MAPPING[name].replace(here, root, 1)
from trex.cost_model import get_cluster, get_model_spec
from trex.planner import plan_parallel
import trex.planner as loaded
assert loaded.__file__.startswith(root), (loaded.__file__, root)
spec, cluster = get_model_spec(model), get_cluster(cluster_name, int(devices))
started = time.perf_counter()
result = plan_parallel(spec, cluster, seq=int(seq), gbs=int(gbs), workers=1)
print(json.dumps({"seconds": time.perf_counter() - started, "best": result.best.parallel.label(),
                  "step_s": result.best.prediction.step_time_s}))
"""


def _run(root: Path, here: Path, model: str) -> dict:
    cluster, devices, seq, gbs = CASES[model]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(here), model, cluster, str(devices), str(seq), str(gbs)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"{model} in {root}: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the commit to compare this checkout against")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--models", default="deepseek-v3,qwen3-235b-a22b", help=f"comma-separated, of {', '.join(CASES)}"
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in CASES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    here = Path(
        subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    with tempfile.TemporaryDirectory(prefix="trex-old-") as tmp:
        old = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(here), "worktree", "add", "--detach", "-q", str(old), args.old], check=True)
        try:
            times: dict[tuple[str, str], list[float]] = {}
            for model in models:
                for _ in range(args.rounds):
                    for label, root in (("old", old), ("new", here)):
                        r = _run(root, here, model)
                        times.setdefault((model, label), []).append(r["seconds"])
                        print(
                            f"{model:18s} {label}: {r['seconds']:6.1f} s  best {r['best']}  step {r['step_s']:.6f} s",
                            flush=True,
                        )
        finally:
            subprocess.run(["git", "-C", str(here), "worktree", "remove", "--force", str(old)], check=False)
    print()
    for model in models:
        old_s, new_s = statistics.median(times[(model, "old")]), statistics.median(times[(model, "new")])
        print(f"{model}: old {old_s:.1f} s, new {new_s:.1f} s (medians of {args.rounds}): {old_s / new_s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
