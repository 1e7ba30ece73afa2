#!/usr/bin/env python3
"""OpenMP on an oversubscribed CPU: the regenerate stage (transformers, CPU) run alone and two at
a time, with --threads threads and OpenMP's default wait (threads spin before they sleep), with
OMP_WAIT_POLICY=PASSIVE (they sleep at once), and with one thread: how torch processes that share
a few cores (scripts/test.sh's three pytest lanes on 2 cores, a CPU sweep's slots) should run.

    python bench/omp_wait.py --verifier DIR --data CHAT.jsonl [--threads 2] [--repeat 2]

(DIR: a verifier such as bench/quality/run.py --verifier smollm2's outputs/smollm2-verifier.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# name -> (threads: None for --threads, OMP_WAIT_POLICY)
CONFIGS = {"default (spin)": (None, None), "PASSIVE": (None, "PASSIVE"), "1 thread": (1, None)}


def regenerate(args, config: tuple[int | None, str | None], out: Path) -> subprocess.Popen:
    threads, policy = config
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    argv = [sys.executable, str(REPO / "remote_scripts/regenerate.py"), "--verifier", args.verifier, "--data", args.data, "--output", str(out),
            "--max-new-tokens", str(args.max_new_tokens), "--batch-size", "64", "--dtype", args.dtype, "--threads", str(threads or args.threads)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(args, policy: tuple[int | None, str | None], side_by_side: int) -> float:
    """Seconds until every one of `side_by_side` regenerations has ended (their mean wall time)."""
    work = Path(tempfile.mkdtemp(prefix="omp-wait-"))
    try:
        t0 = time.monotonic()
        procs = [regenerate(args, policy, work / f"r{i}.jsonl") for i in range(side_by_side)]
        ends = []
        for p in procs:
            if p.wait() != 0:
                raise SystemExit(f"regenerate exited {p.returncode} (policy {policy})")
            ends.append(time.monotonic() - t0)
        return statistics.mean(ends)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--verifier", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    results = {}
    for side_by_side in (1, 2):
        for name, policy in CONFIGS.items():
            runs = [timed(args, policy, side_by_side) for _ in range(args.repeat)]
            results[f"{side_by_side} at a time, {name}"] = statistics.median(runs)
            print(f"{side_by_side} at a time, {name}: {', '.join(f'{r:.1f}' for r in runs)} s", flush=True)
    for n in (1, 2):
        spin, passive, one = (results[f"{n} at a time, {name}"] for name in CONFIGS)
        print(f"{n} at a time: {args.threads} threads spin {spin:.1f} s, passive {passive:.1f} s ({spin / passive:.2f}x), "
              f"1 thread {one:.1f} s ({spin / one:.2f}x)", flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg(), "seconds": results}))


if __name__ == "__main__":
    main()
