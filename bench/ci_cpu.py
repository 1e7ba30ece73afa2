"""Where a command's CPU goes on this machine: the CPU's idle share over time (/proc/stat, every 5 s)
and the CPU seconds of every process that ended meanwhile, by name (Linux process accounting).

    sudo python3 bench/ci_cpu.py [--every 5] [--window 180] -- CI=true bash .ci/run

Needs root and the `acct` package (`apt-get install acct`: accton, dump-acct). It prints the command's
wall time, the idle share per window, and a table of processes by the name they had when they ended
(pyarrow's `jemalloc_bg_thd` for most torch processes: its thread ends last). A process still running
when the command ends is not counted. bench/RESULTS.md (the .ci/run section) says what it found.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def cpu_times() -> tuple[int, int]:
    """(busy, idle) jiffies since boot, all CPUs (idle counts iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, idle


def sample(every: float, samples: list, stop: threading.Event) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), *cpu_times()))
        stop.wait(every)


def by_name(pacct: Path) -> list[tuple[str, int, float]]:
    """(name, processes, CPU seconds), most CPU first, from dump-acct's records."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    count, cpu = collections.Counter(), collections.Counter()
    for line in out.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 5:
            continue
        count[f[0]] += 1
        cpu[f[0]] += (float(f[2]) + float(f[3])) / 100  # user + system, in ticks of 1/100 s
    return sorted(((name, count[name], cpu[name]) for name in cpu), key=lambda r: -r[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=5.0, help="seconds between /proc/stat samples")
    parser.add_argument("--window", type=float, default=180.0, help="seconds per line of the idle table")
    parser.add_argument("--top", type=int, default=12, help="process names shown")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    missing = [tool for tool in ("accton", "dump-acct") if not shutil.which(tool)]
    if missing:
        sys.exit(f"ci_cpu: {' and '.join(missing)} not found: apt-get install acct, as root")

    with tempfile.TemporaryDirectory(prefix="ci-cpu-") as tmp:
        pacct = Path(tmp) / "pacct"
        pacct.touch()
        subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample, args=(args.every, samples, stop), daemon=True)
        sampler.start()
        started = time.monotonic()
        try:
            rc = subprocess.run(" ".join(command), shell=True).returncode
        finally:
            stop.set()
            sampler.join()
            subprocess.run(["accton", "off"], check=True, capture_output=True)
        wall = time.monotonic() - started
        rows = by_name(pacct)

    print(f"\n{' '.join(command)}: exit {rc}, {wall:.0f} s")
    print("idle share of the CPU:")
    for i in range(0, len(samples) - 1, max(1, int(args.window / args.every))):
        first, last = samples[i], samples[min(len(samples) - 1, i + int(args.window / args.every))]
        busy, idle = last[1] - first[1], last[2] - first[2]
        print(f"  from {first[0] - started:6.0f} s: {100 * idle / max(1, busy + idle):3.0f}%")
    total = sum(r[2] for r in rows) or 1
    print(f"CPU of the processes that ended ({total:,.0f} s):")
    for name, n, cpu in rows[: args.top]:
        print(f"  {name:18} {n:6d} processes {cpu:9,.0f} s {100 * cpu / total:4.0f}%")
    return rc


if __name__ == "__main__":
    sys.exit(main())
