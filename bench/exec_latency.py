"""Warm `harness exec HOST -- true` against `ssh -o ControlMaster=auto -o ControlPersist=60 HOST true`.

Starts the same OpenSSH test bed as the tests (tests/fixtures/sshd.py), warms both paths once,
then runs them alternately N times each and prints the median of each and their ratio
(target, issue 31: ratio <= 1.3). harness's warm exec runs from the recipe an earlier exec left
(transport/warm_exec.py); "harness exec, env value" is the same with a host whose `env` names a
set variable (its value goes over stdin, so Python stays to feed it). Beside them it times
`harness --help` and the floor no change to harness's code can remove: `python -c pass` (this
interpreter's start-up with the venv's site-packages) and `python -c 'import click'`, each
added to ssh's time as a ratio.

harness's warm path is an `ssh -S` client on the master. A mux client of our own (the deleted
transport/mux.py) was measured against it by this script at commit f1e9627: it saved 1%
(bench/RESULTS.md, 2026-12-01), not the 20% issue 15 asked of it.

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
        config = write_harness_config(work, testbed, extra=f'\n[hosts.boxenv]\nssh = "box"\nworkdir = "{work}/work/box"\nenv = ["HARNESS_BENCH_TOKEN"]\n')
        env = testbed.env({**os.environ, "HARNESS_BENCH_TOKEN": "not-a-secret"})
        harness = [sys.executable, "-m", "harness", "--config", str(config), "exec", "box", "--", "true"]
        harness_env = [sys.executable, "-m", "harness", "--config", str(config), "exec", "boxenv", "--", "true"]
        time.sleep(2.2)  # the recipe is made only from files older than warm_exec.RACY_NS
        ssh = ["ssh", "-F", str(testbed.ssh_config), "-o", "ControlMaster=auto", "-o", "ControlPersist=60",
               "-o", f"ControlPath={testbed.control_dir}/bench-%C", "box", "true"]
        # What no change to harness's own code can remove: this interpreter's start-up (with the
        # venv's site-packages and .pth files), and that plus click.
        floors = {"python -c pass": [sys.executable, "-c", "pass"], "python -c 'import click'": [sys.executable, "-c", "import click"]}
        others = {"harness exec, env value": harness_env, "harness --help": [sys.executable, "-m", "harness", "--help"]}
        timed(harness, env), timed(harness_env, env), timed(ssh, env)  # first runs open the master and leave the recipes
        times: dict[str, list[tuple[float, float]]] = {"harness exec": [], "ssh (ControlMaster)": [], **{k: [] for k in others}, **{k: [] for k in floors}}
        for _ in range(args.n):
            times["harness exec"].append(timed(harness, env))
            times["ssh (ControlMaster)"].append(timed(ssh, env))
            for name, argv in {**others, **floors}.items():
                times[name].append(timed(argv, env))
        medians = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
        with open("/proc/loadavg") as f:
            lines = [f"load average: {' '.join(f.read().split()[:3])} on {os.cpu_count()} CPUs"]
        for k, v in times.items():
            walls = [w for w, _ in v]
            cpu = statistics.median(c for _, c in v)
            lines.append(f"{k:26s} median {medians[k] * 1000:7.1f} ms   min {min(walls) * 1000:7.1f} ms   "
                         f"client CPU {cpu * 1000:6.1f} ms   (n={len(v)})")
        ssh_median = medians["ssh (ControlMaster)"]
        ratio = medians["harness exec"] / ssh_median
        lines.append(f"ratio harness/ssh: {ratio:.2f} (target <= 1.3); with an env value: {medians['harness exec, env value'] / ssh_median:.2f}")
        click_floor = medians["python -c 'import click'"]
        lines.append(f"harness --help / python -c 'import click': {medians['harness --help'] / click_floor:.2f}")
        floor, floor_click = (medians[k] + ssh_median for k in floors)
        lines.append(f"floor (python -c pass + ssh)/ssh: {floor / ssh_median:.2f}; with import click: {floor_click / ssh_median:.2f}")
        print("\n".join(lines))
        if args.record:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            record("## bench/exec_latency.py", f"### {stamp}: `python bench/exec_latency.py -n {args.n} --record` (test sshd on loopback)\n\n```\n" + "\n".join(lines) + "\n```")
    finally:
        stop_testbed(testbed)


if __name__ == "__main__":
    main()
