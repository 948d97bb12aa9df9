"""SFT on tiny DeepSeek-V4: does the loss fall (a real learning signal), and is it the same on 1 and 2 ranks?

    python bench/or_train/sft_learning.py --data DIR [--steps 60] [--seq 1024] [--gbs 8]

DIR is what `trex data synth --n 200 --seed 1 --out DIR` writes. Samples longer than --seq + 1 byte
tokens keep their first tokens (--overlength truncate: the system and user turns and the start of the
answer). Each plan runs as `trex train sft` (its own ranks, gloo); the script prints the first and last
losses, last/first, the largest relative difference between the plans' losses, and step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def run(data: str, plan: list[str], args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "trex", "train", "sft", "--model", "tiny-deepseek-v4", "--data", data]
    command += ["--steps", str(args.steps), "--seq", str(args.seq), "--gbs", str(args.gbs), "--mbs", str(args.mbs)]
    command += ["--lr", str(args.lr), "--warmup", "5", "--overlength", "truncate", "--json", *plan]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TREX_BACKENDS": args.backends}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["wall_s"] = time.perf_counter() - start
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--gbs", type=int, default=8)
    parser.add_argument("--mbs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--backends", default="eager", help="TREX_BACKENDS for trex.compile (default eager)")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    results = {
        "1 rank": run(args.data, [], args),
        "2 ranks, ep=2": run(args.data, ["--nproc", "2", "--plan", "ep=2"], args),
    }
    print(
        "| plan | samples | rejected | truncated | first loss | last loss | last / first | median step (s) | wall (s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, s in results.items():
        first, last = s["losses"][0], s["losses"][-1]
        print(
            f"| {name} | {s['samples']} | {s['rejected_summary']} | {s['truncated']} | {first:.4f} | {last:.4f} | "
            f"{last / first:.3f} | {s['step_time_s']:.2f} | {s['wall_s']:.0f} |"
        )
    a, b = (r["losses"] for r in results.values())
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    print(f"largest relative loss difference between the plans over {len(a)} steps: {worst:.2e}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
