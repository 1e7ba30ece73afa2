#!/usr/bin/env python3
"""OpenMP's wait policy on an oversubscribed CPU: the regenerate stage (transformers, CPU) run
alone and two at a time, with OpenMP's default (threads spin before they sleep) and with
OMP_WAIT_POLICY=PASSIVE (they sleep at once): whether torch processes that share a few cores
(scripts/test.sh's three pytest lanes on 2 cores, a CPU sweep's slots) should wait passively.

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
POLICIES = {"default (spin)": None, "PASSIVE": "PASSIVE"}


def regenerate(args, policy: str | None, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    argv = [sys.executable, str(REPO / "remote_scripts/regenerate.py"), "--verifier", args.verifier, "--data", args.data, "--output", str(out),
            "--max-new-tokens", str(args.max_new_tokens), "--batch-size", "64", "--dtype", args.dtype, "--threads", str(args.threads)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed(args, policy: str | None, side_by_side: int) -> float:
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
        for name, policy in POLICIES.items():
            runs = [timed(args, policy, side_by_side) for _ in range(args.repeat)]
            results[f"{side_by_side} at a time, {name}"] = statistics.median(runs)
            print(f"{side_by_side} at a time, {name}: {', '.join(f'{r:.1f}' for r in runs)} s", flush=True)
    for n in (1, 2):
        spin, passive = results[f"{n} at a time, default (spin)"], results[f"{n} at a time, PASSIVE"]
        print(f"{n} at a time: passive {passive:.1f} s, spin {spin:.1f} s: passive is {spin / passive:.2f}x", flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "load_average": os.getloadavg(), "seconds": results}))


if __name__ == "__main__":
    main()
