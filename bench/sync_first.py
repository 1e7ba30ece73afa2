"""What `harness run`'s sync-first costs when nothing changed: a no-op `harness sync HOST` timed on
loopback and through a delay line (bench/delayline.py) in front of the test sshd, beside
`harness exec HOST -- true` for scale, each a fresh process with the OpenSSH master up (as
between commands). Round trips = (median through the delay line - median on loopback) / RTT.
The project is the config with this tree's remote_scripts/ and container/ beside it (what a run
syncs). `--record` appends the table to bench/RESULTS.md.

    python bench/sync_first.py [-n 7] [--rtt-ms 200] [--record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.delayline import DelayLine  # noqa: E402
from bench.results_file import record  # noqa: E402
from bench.run_start import write_files  # noqa: E402
from tests.fixtures.sshd import start_testbed, stop_testbed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=7)
    parser.add_argument("--rtt-ms", type=float, default=200.0)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    rtt = args.rtt_ms / 1000
    work = Path(tempfile.mkdtemp(prefix="harness-syncfirst-"))
    bed = start_testbed(work / "sshd")
    commands = {"sync (no-op)": ["sync"], "exec -- true": ["exec", None, "--", "true"]}
    times: dict[tuple[str, str], list[float]] = {}
    try:
        with DelayLine(("127.0.0.1", bed.port), rtt_ms=args.rtt_ms) as line:
            config, env = write_files(work, bed, line.port)
            env = {**env, "PYTHONPATH": str(ROOT)}

            def timed(argv: list[str]) -> float:
                start = time.perf_counter()
                r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *argv], env=env, capture_output=True, text=True, timeout=120)
                if r.returncode != 0:
                    raise RuntimeError(f"harness {' '.join(argv)}: {r.stderr.strip()}")
                return time.perf_counter() - start

            def argv_for(name: str, host: str) -> list[str]:
                argv = commands[name]
                return [host if a is None else a for a in argv] if None in argv else [*argv, host]

            for host in ("box", "slow"):  # the first sync sends the tree; the masters start
                for name in commands:
                    timed(argv_for(name, host))
            for _ in range(args.n):
                for host in ("box", "slow"):
                    for name in commands:
                        times.setdefault((name, host), []).append(timed(argv_for(name, host)))
    finally:
        stop_testbed(bed)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows = [f"| command | loopback | {args.rtt_ms:g} ms RTT | round trips |", "|---|---|---|---|"]
    for name in commands:
        lo, hi = statistics.median(times[(name, "box")]), statistics.median(times[(name, "slow")])
        rows.append(f"| {name} | {lo:.2f} s | {hi:.2f} s | {(hi - lo) / rtt:.1f} |")
    text = "\n".join(rows) + f"\n\nmedians of {args.n} fresh processes each, master up; load average {load} on {os.cpu_count()} CPUs"
    print(text)
    if args.record:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        record("## bench/sync_first.py", f"### {stamp}: `python bench/sync_first.py -n {args.n} --rtt-ms {args.rtt_ms:g} --record` (test sshd)\n\n" + text)


if __name__ == "__main__":
    main()
