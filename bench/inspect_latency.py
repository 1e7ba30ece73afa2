"""`harness inspect HOST speculators.models.eagle3.core.Eagle3DraftModel.forward`: wall time of the
CLI call, on the local host and over SSH (the tests' OpenSSH test bed), against `python -c
"import speculators"` alone (what an import-based lookup would cost at least). Target: under 2 s.

    python bench/inspect_latency.py [-n 5] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from tests.fixtures.sshd import start_testbed, stop_testbed  # noqa: E402

TARGET = "speculators.models.eagle3.core.Eagle3DraftModel.forward"


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each command")
    parser.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    (work / "work").mkdir()
    config = work / "harness.toml"
    testbed = start_testbed(work / "sshd")
    try:
        config.write_text(f'[hosts.local]\nlocal = true\nworkdir = "{work / "work"}"\npython = "{sys.executable}"\n\n'
                          f'[hosts.box]\nssh = "box"\nworkdir = "{work / "work"}"\npython = "{sys.executable}"\n')
        env = testbed.env()
        commands = {
            "harness inspect local": [sys.executable, "-m", "harness", "--config", str(config), "inspect", "local", TARGET],
            "harness inspect box (ssh)": [sys.executable, "-m", "harness", "--config", str(config), "inspect", "box", TARGET],
            "python -c 'import speculators'": [sys.executable, "-c", "import speculators"],
        }
        for argv in commands.values():
            timed(argv, env)  # warm the page cache (and the ssh connection)
        medians = {name: statistics.median(timed(argv, env) for _ in range(args.n)) for name, argv in commands.items()}
    finally:
        stop_testbed(testbed)
    rows = "\n".join(f"| {name} | {m:.2f} |" for name, m in medians.items())
    section = (f"### {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC: `python bench/inspect_latency.py -n {args.n}`\n\n"
               f"Median wall seconds of {args.n} runs (target for inspect: < 2 s):\n\n| command | seconds |\n| --- | ---: |\n{rows}\n")
    print(section)
    if args.record:
        record("## bench/inspect_latency.py", section)


if __name__ == "__main__":
    main()
