"""`harness run HOST STAGE --detach` until the run id is printed: this tree against another.

Starts the OpenSSH test bed of the tests (tests/fixtures/sshd.py) and a delay line in front of
its sshd (bench/delayline.py, --rtt-ms, default 50), then times `harness run H prepare --detach
--now` (--stage train: a distributed stage, whose start probes the GPU count) as a user runs it
(a fresh process each time) from its start until the run id is on stdout, on loopback and through the delay line, for this tree and for --base-tree (another
checkout, e.g. `git archive f7b1dfd | tar -x -C /tmp/base`), the two taking turns. Two states
of the link: warm (the OpenSSH master of the previous command still up, as between commands
within ControlPersist) and cold (every master stopped first). remote_scripts/ and container/ lie
beside the config: since `harness run` syncs first, this tree's runs include a sync (a no-op after
the warm-up); only the start is measured.

Round trips are read from the link: (median through the delay line - median on loopback) / RTT.
Prints one table (medians, ratio base/this, round trips) and appends it, dated, to
bench/RESULTS.md with --record.

    python bench/run_start.py --base-tree /tmp/base [-n 7] [--rtt-ms 50] [--stage train] [--record]
"""

from __future__ import annotations

import argparse
import compileall
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
from tests.fixtures.sshd import start_testbed, stop_testbed  # noqa: E402


def write_files(work: Path, bed, slow_port: int) -> tuple[Path, dict[str, str]]:
    """harness.toml with `box` (loopback) and `slow` (through the delay line), and the
    environment that points harness at the bed's ssh_config and known_hosts."""
    known_hosts = work / "known_hosts"
    known_hosts.write_text(bed.known_hosts_lines() + f"[127.0.0.1]:{slow_port} {bed.box.host_pub_line}\n")
    ssh_config = work / "ssh_config"
    ssh_config.write_text(bed.ssh_config.read_text() + f"""
Host slow
  HostName 127.0.0.1
  Port {slow_port}
  User {bed.user}
  IdentityFile {bed.key_path}
  IdentitiesOnly yes
  UserKnownHostsFile {known_hosts}
""")
    import shutil

    for code in ("remote_scripts", "container"):  # what a run syncs first (this tree; the base tree syncs nothing)
        shutil.copytree(ROOT / code, work / code, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    config = work / "harness.toml"
    config.write_text(f'[hosts.box]\nssh = "box"\nworkdir = "{work}/box"\n\n[hosts.slow]\nssh = "slow"\nworkdir = "{work}/slow"\n')
    env = bed.env()
    env.update(HARNESS_SSH_CONFIG=str(ssh_config), HARNESS_KNOWN_HOSTS=str(known_hosts))
    return config, env


def stop_masters(control_dir: Path) -> None:
    for sock in control_dir.iterdir():
        if sock.is_socket():
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)


def until_run_id(tree: Path, config: Path, host: str, env: dict[str, str], stage: str = "prepare") -> float:
    """Seconds from the start of `harness run` until its stdout has the run id."""
    env = {**env, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "run", host, stage, "--detach", "--now"],
                            env=env, cwd=config.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    _, err = proc.communicate(timeout=120)
    if proc.returncode != 0 or not line.strip():
        raise RuntimeError(f"{tree}: harness run {host} failed ({proc.returncode}): {err.decode(errors='replace')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-tree", type=Path, required=True, help="another checkout (the code before)")
    parser.add_argument("-n", type=int, default=7, help="runs of each command in each state")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--stage", default="prepare", help="the stage started (train: a distributed stage, so the start probes the GPU count)")
    parser.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    args = parser.parse_args()

    trees = {"before (--base-tree)": args.base_tree.resolve(), "after (this tree)": ROOT}
    for tree in trees.values():  # as pip would have: no bytecode compiled on the clock
        compileall.compile_dir(str(tree / "harness"), quiet=1)
    work = Path(tempfile.mkdtemp(prefix="harness-runstart-"))
    bed = start_testbed(work / "sshd")
    try:
        with DelayLine(("127.0.0.1", bed.port), rtt_ms=args.rtt_ms) as line:
            config, env = write_files(work, bed, line.port)
            times: dict[tuple[str, str, str], list[float]] = {}
            for name, tree in trees.items():  # warm-up: ssh's own first use, the workdirs
                for host in ("box", "slow"):
                    until_run_id(tree, config, host, env, args.stage)
            for _ in range(args.n):
                for state in ("warm", "cold"):
                    for host in ("box", "slow"):
                        for name, tree in trees.items():
                            if state == "cold":
                                stop_masters(bed.control_dir)
                            times.setdefault((name, host, state), []).append(until_run_id(tree, config, host, env, args.stage))
    finally:
        stop_testbed(bed)
    rtt = args.rtt_ms / 1000
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    rows = ["| code | link state | loopback | %g ms RTT | round trips ((RTT - loopback) / RTT) |" % args.rtt_ms, "|---|---|---|---|---|"]
    med = {k: statistics.median(v) for k, v in times.items()}
    for state in ("warm", "cold"):
        for name in trees:
            lo, hi = med[(name, "box", state)], med[(name, "slow", state)]
            rows.append(f"| {name} | {state} | {lo:.2f} s | {hi:.2f} s | {(hi - lo) / rtt:.1f} |")
    ratios = [f"{state}, {host == 'box' and 'loopback' or f'{args.rtt_ms:g} ms'}: before/after {med[('before (--base-tree)', host, state)] / med[('after (this tree)', host, state)]:.2f}x"
              for state in ("warm", "cold") for host in ("box", "slow")]
    text = "\n".join(rows) + "\n\n" + "; ".join(ratios) + f"\n\nmedians of {args.n} runs each, taking turns; load average {load} on {os.cpu_count()} CPUs"
    print(text)
    if args.record:
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        record("## bench/run_start.py", f"### {stamp}: `python bench/run_start.py --base-tree {args.base_tree} -n {args.n} --stage {args.stage} --record` (test sshd; delay line {args.rtt_ms:g} ms)\n\n" + text)


if __name__ == "__main__":
    main()
