"""Warm `harness exec HOST -- true` against `ssh -o ControlMaster=auto -o ControlPersist=60 HOST true`.

Starts the same OpenSSH test bed as the tests (tests/fixtures/sshd.py), warms every path once,
then runs them in turn N times each and prints the median of each and the ratios (target:
harness/ssh <= 1.5). Two harness paths side by side: through the master's socket with our own
mux client (transport/mux.py), and through an `ssh -S` mux client process on the same master
(what harness does without mux.py): mux.py stays only if it saves >= 20% (issue 15).

    python bench/exec_latency.py [-n 30]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from tests.fixtures.sshd import start_testbed, stop_testbed, write_harness_config  # noqa: E402


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the client process tree): CPU does not depend on load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# harness's CLI with the mux client refusing every session once a master is up: the same warm
# path through `ssh -S <socket>` (openssh_exec's fallback), i.e. harness without mux.py
WITHOUT_MUX = """
import os, sys
from harness.transport import mux
def refuse(path, *args):
    raise (mux.MuxError if os.path.exists(path) else mux.NoMaster)(path)
mux.run_session = refuse
sys.argv[0] = "harness"
from harness.cli import main
main()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="runs of each command")
    parser.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    args = parser.parse_args()

    # An installed package has its bytecode compiled (pip does it); an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile harness on every run. Compile it once, like pip.
    import compileall

    compileall.compile_dir(str(ROOT / "harness"), quiet=1)

    work = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    testbed = start_testbed(work / "sshd")
    try:
        config = write_harness_config(work, testbed)
        env = testbed.env()
        exec_args = ["--config", str(config), "exec", "box", "--", "true"]
        commands = {
            "harness exec": [sys.executable, "-m", "harness", *exec_args],
            "harness exec, ssh -S": [sys.executable, "-c", WITHOUT_MUX, *exec_args],
            "ssh (ControlMaster)": ["ssh", "-F", str(testbed.ssh_config), "-o", "ControlMaster=auto", "-o", "ControlPersist=60",
                                    "-o", f"ControlPath={testbed.control_dir}/bench-%C", "box", "true"],
        }
        for argv in commands.values():
            timed(argv, env)  # first runs open the master connections
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in commands}
        for _ in range(args.n):
            for name, argv in commands.items():
                times[name].append(timed(argv, env))
        medians = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
        with open("/proc/loadavg") as f:
            lines = [f"load average: {' '.join(f.read().split()[:3])} on {os.cpu_count()} CPUs"]
        for k, v in times.items():
            walls = [w for w, _ in v]
            cpu = statistics.median(c for _, c in v)
            lines.append(f"{k:22s} median {medians[k] * 1000:7.1f} ms   min {min(walls) * 1000:7.1f} ms   "
                         f"client CPU {cpu * 1000:6.1f} ms   (n={len(v)})")
        ratio = medians["harness exec"] / medians["ssh (ControlMaster)"]
        lines.append(f"ratio harness/ssh: {ratio:.2f} (target <= 1.5)")
        saved = 1 - medians["harness exec"] / medians["harness exec, ssh -S"]
        lines.append(f"mux client vs ssh -S: {medians['harness exec'] / medians['harness exec, ssh -S']:.2f} "
                     f"(saves {saved:.0%} of a warm exec; kept only if >= 20%)")
        print("\n".join(lines))
        if args.record:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            record("## bench/exec_latency.py", f"### {stamp}: `python bench/exec_latency.py -n {args.n} --record` (test sshd on loopback)\n\n```\n" + "\n".join(lines) + "\n```")
    finally:
        stop_testbed(testbed)


if __name__ == "__main__":
    main()
