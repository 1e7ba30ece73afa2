"""`harness pull` and `harness sync` against OpenSSH's own tools, on one test sshd.

Starts the OpenSSH test bed of the tests (tests/fixtures/sshd.py) and a 50 ms round-trip delay
line in front of it (bench/delayline.py), then measures, end to end as a user runs them (each
command a fresh process):
  pull of one file (default 1 GiB): `harness pull` vs scp, rsync and `ssh host cat`, on loopback
      and through the delay line, --repeat times each, taking turns (medians); every output is
      checked against the source SHA-256. With --base-tree, another checkout's harness pull
      takes its turn beside this one (an A/B in the same minutes). On loopback scp twice:
      against the test bed's sshd (SFTP inside sshd: no login shell) and against one configured
      as Debian ships it (SFTP by a program the login shell starts, as for every command harness
      runs).
  pull of a run: `harness pull HOST last` of a finished run's 10 small files against one rsync
      command of the same paths, on loopback and through the delay line.
  sync of a 5,000-file tree: first sync (to an empty host directory, with no hash cache on the
      laptop), no-op re-sync, one changed file; `harness sync` vs `rsync -a --delete` (median of
      --repeat runs, the two tools taking turns; the load average is recorded beside them).
  resume: a pull killed (SIGKILL) at 50% and run again; bytes the host sent again, measured on
      the delay line (payload direction) against an uninterrupted pull.
Prints one table with ratios and appends it, dated, to bench/RESULTS.md with --record.

    python bench/transfer.py [--size-mib 1024] [--files 5000] [--rtt-ms 50] [--record]

harness keeps an OpenSSH ControlMaster for ControlPersist seconds (that is how it runs); pulls
are measured cold (the master stopped before each run; harness's one-time probe of the ssh
client kept, as on a laptop that has run it before), first syncs cold from a new control
directory, later syncs warm (the master of the previous harness command); the baseline tools
open their own connection each time, as users run them.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.delayline import DelayLine  # noqa: E402
from bench.results_file import record  # noqa: E402
from harness.pull import received_bytes  # noqa: E402
from tests.fixtures.sshd import start_sshd, start_testbed, stop_testbed  # noqa: E402

MiB = 1 << 20
BASE_PULL = "harness pull, --base-tree"
STOCK_SFTP = "/usr/lib/openssh/sftp-server"  # Debian's and Ubuntu's sshd_config: `Subsystem sftp` this


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


class Bench:
    def __init__(self, work: Path, rtt_ms: float, base_tree: Path | None = None):
        self.work, self.rtt_ms, self.base_tree = work, rtt_ms, base_tree
        self.testbed = start_testbed(work / "sshd")
        self.line = DelayLine(("127.0.0.1", self.testbed.port), rtt_ms=rtt_ms).start()
        tb = self.testbed
        # scp's SFTP as a stock Debian/Ubuntu sshd serves it: a program started through the login
        # shell (the test bed serves internal-sftp, which starts no shell; harness's commands do)
        self.stock = start_sshd(work / "sshd", "stock", "127.0.0.1", work / "sshd" / "authorized_keys", sftp=STOCK_SFTP) if os.path.exists(STOCK_SFTP) else None
        self.known_hosts = work / "known_hosts"
        self.known_hosts.write_text(tb.known_hosts_lines() + f"[127.0.0.1]:{self.line.port} {tb.box.host_pub_line}\n"
                                    + (f"[127.0.0.1]:{self.stock.port} {self.stock.host_pub_line}\n" if self.stock else ""))
        self.ssh_config = work / "ssh_config"
        common = f"  User {tb.user}\n  IdentityFile {tb.key_path}\n  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n  BatchMode yes\n  StrictHostKeyChecking yes\n"
        stock = f"\nHost stock\n  HostName 127.0.0.1\n  Port {self.stock.port}\n{common}" if self.stock else ""
        self.ssh_config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {tb.port}\n{common}\nHost slow\n  HostName 127.0.0.1\n  Port {self.line.port}\n{common}{stock}")
        self.host_dir = work / "host"
        self.host_dir.mkdir()
        self.config = work / "project" / "harness.toml"
        self.config.parent.mkdir()
        self.config.write_text(textwrap.dedent(f"""\
            [hosts.box]
            ssh = "box"
            workdir = "{self.host_dir}/workdir"

            [hosts.slow]
            ssh = "slow"
            workdir = "{self.host_dir}/workdir"

            [sync]
            paths = ["remote_scripts"]
            """))
        self.control_dirs: list[Path] = []
        self.fresh_control()
        self.load: list[float] = []  # 1-minute load average before and after the sync rows

    def fresh_control(self) -> None:
        d = Path(tempfile.mkdtemp(prefix="hbc-"))
        os.chmod(d, 0o700)
        self.control_dirs.append(d)
        self.control = d

    def env(self, tree: Path = ROOT) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("SSH_AUTH_SOCK", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # harness runs from bytecode, as installed (see main)
        env.update(HARNESS_SSH_CONFIG=str(self.ssh_config), HARNESS_KNOWN_HOSTS=str(self.known_hosts), HARNESS_CONTROL_DIR=str(self.control), PYTHONPATH=str(tree))
        return env

    def harness(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "harness", "--config", str(self.config), *args]

    def timed(self, argv: list[str], tree: Path = ROOT, **kw) -> float:
        """Seconds argv takes, as a whole command. `python -m harness` imports harness from its
        working directory first: run from `tree`, it is that tree's."""
        start = time.perf_counter()
        r = subprocess.run(argv, env=self.env(tree), cwd=tree, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)
        elapsed = time.perf_counter() - start
        if r.returncode != 0:
            raise RuntimeError(f"{argv[:6]}... failed ({r.returncode}): {r.stderr.decode()[-800:]}")
        return elapsed

    def close(self) -> None:
        for d in self.control_dirs:
            for sock in d.iterdir() if d.exists() else []:
                subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)
            shutil.rmtree(d, ignore_errors=True)
        self.line.stop()
        if self.stock:
            self.stock.stop()
        stop_testbed(self.testbed)

    # -- pull -------------------------------------------------------------------------------------

    def pull_commands(self, host: str, src: Path, dest: Path, streams: int) -> dict[str, list[str]]:
        ssh = ["ssh", "-F", str(self.ssh_config)]
        stock = {"scp, stock sshd": ["scp", "-q", "-F", str(self.ssh_config), f"stock:{src}", str(dest / src.name)]} if self.stock and host == "box" else {}
        pull = self.harness("pull", host, str(src), str(dest), "-j", str(streams))  # -j: --streams here, --jobs in a base tree from before the rename
        base = {BASE_PULL: pull} if self.base_tree else {}
        return {
            "harness pull": pull,
            **base,
            "scp": ["scp", "-q", "-F", str(self.ssh_config), f"{host}:{src}", str(dest / src.name)],
            **stock,
            "rsync": ["rsync", "-a", "-e", " ".join(ssh), f"{host}:{src}", str(dest / src.name)],
            "ssh cat": ["sh", "-c", 'exec "$@" > "$0"', str(dest / src.name), *ssh, host, "cat", str(src)],
        }

    def stop_masters(self) -> None:
        """End harness's master connections, so the next command connects anew. The control
        directory stays, with what harness probed of the ssh client once, as on any laptop that
        has run harness before."""
        for sock in self.control.iterdir():
            if sock.is_socket():
                subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10)

    def pull_row(self, host: str, src: Path, digest: str, streams: int, repeat: int) -> dict[str, list[float]]:
        """Every tool `repeat` times, taking turns (a different one first each round), each from a
        cold connection into an empty directory, the previous copy's write-back done."""
        dest = self.work / "dest"
        commands = self.pull_commands(host, src, dest, streams)
        tools = list(commands)
        seconds: dict[str, list[float]] = {name: [] for name in tools}
        for k in range(repeat):
            for name in tools[k % len(tools):] + tools[:k % len(tools)]:
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                self.stop_masters()
                os.sync()
                seconds[name].append(self.timed(commands[name], self.base_tree if name == BASE_PULL else ROOT))
                if sha256(dest / src.name) != digest:
                    raise RuntimeError(f"{name}: wrong content")
            print(f"  pull via {host:5s} round {k + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in seconds.items()), flush=True)
        shutil.rmtree(dest, ignore_errors=True)
        return seconds

    def run_rows(self, repeat: int) -> dict[str, dict[str, float]]:
        """`harness pull HOST last` of a finished run's records, report, plots, export and train's
        small files (10 files, tests/test_pull.py's fake_run) against one rsync command of the
        same remote paths, on loopback and through the delay line; medians of `repeat` cold runs."""
        from tests.test_pull import fake_run

        run_dir = fake_run(self.host_dir / "workdir")
        work = run_dir.parents[1]
        paths = [run_dir, work / "reports" / "k3", work / "out" / "export", *(work / "out" / "checkpoints" / n for n in ("metrics.jsonl", "best.json", "logs"))]
        dest = self.work / "run-dest"
        rows: dict[str, dict[str, float]] = {}
        for host, link in (("box", "loopback"), ("slow", f"{self.rtt_ms:.0f} ms RTT")):
            tools = {
                "harness pull HOST last": self.harness("pull", host, "last", str(dest)),
                "rsync -a (one command)": ["rsync", "-a", "-e", f"ssh -F {self.ssh_config}", *(f"{host}:{p}" for p in paths), f"{dest}/"],
            }
            times: dict[str, list[float]] = {name: [] for name in tools}
            for k in range(repeat):
                for name in list(tools)[k % 2:] + list(tools)[:k % 2]:
                    shutil.rmtree(dest, ignore_errors=True)
                    dest.mkdir()
                    self.stop_masters()
                    times[name].append(self.timed(tools[name]))
                    if sum(1 for f in dest.rglob("*") if f.is_file()) != 10:
                        raise RuntimeError(f"{name}: not the run's 10 files")
            rows[link] = {name: statistics.median(t) for name, t in times.items()}
            print(f"  run pull via {host:5s}: " + ", ".join(f"{n} {t:.2f} s" for n, t in rows[link].items()), flush=True)
        shutil.rmtree(dest, ignore_errors=True)
        return rows

    def resume_row(self, src: Path, digest: str, streams: int) -> dict[str, float]:
        """Kill a pull through the delay line at 50%, resume it; compare host->client bytes."""
        size = src.stat().st_size
        dest = self.work / "dest"

        def run_pull(kill_at: float | None) -> int:
            before = self.line.bytes_to_client
            self.fresh_control()
            argv = self.harness("pull", "slow", str(src), str(dest), "-j", str(streams))
            proc = subprocess.Popen(argv, env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            if kill_at is not None:
                while proc.poll() is None:
                    if received_bytes(dest / src.name) >= kill_at * size:
                        os.killpg(proc.pid, signal.SIGKILL)
                        break
                    time.sleep(0.002)
            proc.wait()
            time.sleep(0.5)  # let the delay line drain what was in flight
            return self.line.bytes_to_client - before

        shutil.rmtree(dest, ignore_errors=True)
        whole = run_pull(None)
        assert sha256(dest / src.name) == digest
        shutil.rmtree(dest, ignore_errors=True)
        first = run_pull(0.5)
        recorded = received_bytes(dest / src.name)
        second = run_pull(None)
        assert sha256(dest / src.name) == digest
        shutil.rmtree(dest, ignore_errors=True)
        again = first + second - whole
        print(f"  resume: killed at {recorded / size:.1%} recorded; host sent {first + second} B vs {whole} B uninterrupted", flush=True)
        return {"killed_at": recorded / size, "sent_again": again, "sent_again_pct": 100.0 * again / size}

    # -- sync -------------------------------------------------------------------------------------

    def make_tree(self, n: int) -> Path:
        tree = self.config.parent / "remote_scripts"
        per_dir = 100
        for i in range(n):
            d = tree / f"pkg{i // per_dir:03d}"
            if i % per_dir == 0:
                d.mkdir(parents=True)
            (d / f"module_{i:05d}.py").write_bytes(os.urandom(600).hex().encode() + b"\n")
        return tree

    def sync_rows(self, n: int, repeat: int) -> dict[str, dict[str, float]]:
        tree = self.make_tree(n)
        rsync_dest = self.host_dir / "rsync-dest"
        rsync = ["rsync", "-a", "--delete", "-e", f"ssh -F {self.ssh_config}", f"{tree}/", f"box:{rsync_dest}/remote_scripts/"]
        ours = self.harness("sync", "box")
        rows: dict[str, dict[str, float]] = {}
        first_rsync = ["sh", "-c", f"mkdir -p {rsync_dest} && exec \"$@\"", "sh", *rsync]
        trash = self.host_dir / "trash"
        trash.mkdir()
        os.sync()  # the tree's write-back does not land inside the first measurement
        self.load.append(os.getloadavg()[0])
        ours_t, rsync_t = [], []
        for k in range(repeat):
            # A new box: nothing on the host, a fresh connection, no hash cache on the laptop. The
            # last copies are moved aside, not deleted: ext4 makes the files created right after
            # a large deletion several times slower, which would fall on whichever tool ran next.
            for old in (self.host_dir / "workdir", rsync_dest):
                if old.exists():
                    old.rename(trash / f"{old.name}-{k}")
            shutil.rmtree(self.config.parent / ".harness", ignore_errors=True)
            self.fresh_control()
            runs = [(ours_t, ours), (rsync_t, first_rsync)]
            for times, argv in runs if k % 2 == 0 else runs[::-1]:  # each tool goes first in turn
                times.append(self.timed(argv))
        rows["first sync"] = {"harness sync": statistics.median(ours_t), "rsync -a --delete": statistics.median(rsync_t)}
        for case in ("no-op re-sync", "one changed file"):
            ours_t, rsync_t = [], []
            for k in range(repeat):
                if case == "one changed file":
                    (tree / "pkg007" / "module_00700.py").write_text(f"changed {k} {time.time()}\n")
                ours_t.append(self.timed(ours))
                rsync_t.append(self.timed(rsync))
            rows[case] = {"harness sync": statistics.median(ours_t), "rsync -a --delete": statistics.median(rsync_t)}
        # the two copies must agree
        diff = subprocess.run(["diff", "-r", str(tree), str(self.host_dir / "workdir" / "remote_scripts")], capture_output=True)
        if diff.returncode != 0:
            raise RuntimeError("harness sync copy differs: " + diff.stdout.decode()[:500])
        self.load.append(os.getloadavg()[0])
        for case, r in rows.items():
            print(f"  sync {case:17s} harness {r['harness sync']:6.3f} s   rsync {r['rsync -a --delete']:6.3f} s", flush=True)
        return rows


def tree_label(tree: Path) -> str:
    """A checkout's commit (and whether it has changes), for the record; else its path."""
    head = subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return f"{tree} at {head.stdout.strip()}" if head.returncode == 0 else str(tree)


def render(size_mib: int, rtt_ms: float, files: int, streams: int, pulls: dict, syncs: dict, resume: dict | None, skipped: list[str], sync_load: list[float] = (), repeat: int = 3,
           runs: dict | None = None, base_tree: Path | None = None) -> str:
    """The dated section for RESULTS.md; parts that were skipped are named, not shown as zeros."""
    command = (f"python bench/transfer.py --size-mib {size_mib} --files {files}" + (f" --repeat {repeat}" if repeat != 3 else "") + "".join(f" --skip {s}" for s in skipped)
               + (f" --base-tree {base_tree}" if base_tree else ""))
    lines = [
        f"### {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC: `{command}`",
        "",
        f"Machine: {os.cpu_count()} cores shared with other work, OpenSSH test sshd on loopback; delay line {rtt_ms:.0f} ms round trip. harness pull --streams {streams}."
        + (f" This tree: {tree_label(ROOT)}; --base-tree: {tree_label(base_tree)}." if base_tree else ""),
    ]
    if pulls:
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        lines += ["", f"Pull of one {size_mib} MiB file, each tool {repeat} times taking turns (median seconds, the fastest and slowest "
                  f"run, MiB/s of the median; ratio = the other's median / harness's; load average at the end: {load}; "
                  "targets: >= 3x scp at 50 ms RTT for 256 MiB, >= 1x scp on loopback for 512 MiB):", "",
                  "| link | tool | seconds | range | MiB/s | harness vs this |", "| --- | --- | ---: | ---: | ---: | ---: |"]
        for link, row in pulls.items():
            ours = statistics.median(row["harness pull"])
            for tool, times in row.items():
                s = statistics.median(times)
                lines.append(f"| {link} | {tool} | {s:.2f} | {min(times):.2f}-{max(times):.2f} | {size_mib / s:.0f} | {s / ours:.2f}x |")
    if runs:
        lines += ["", f"Pull of a finished run's 10 small files (records, report, plots, export, train's metrics; median seconds of {repeat} cold runs, "
                  "taking turns; ratio = rsync's time / harness's):", "",
                  "| link | harness pull HOST last | rsync -a, the same paths in one command | ratio |", "| --- | ---: | ---: | ---: |"]
        for link, r in runs.items():
            ours, theirs = r["harness pull HOST last"], r["rsync -a (one command)"]
            lines.append(f"| {link} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f}x |")
    if syncs:
        load = f" Load average (1 min) {sync_load[0]:.2f} before, {sync_load[-1]:.2f} after." if sync_load else ""
        lines += ["", f"Sync of a {files}-file tree (median seconds; ratio = harness time / rsync time, target <= 1.5 for the first sync, <= 1.0 for no-op and one file).{load}", "",
                  "| case | harness sync | rsync -a --delete | ratio |", "| --- | ---: | ---: | ---: |"]
        for case, r in syncs.items():
            lines.append(f"| {case} | {r['harness sync']:.3f} | {r['rsync -a --delete']:.3f} | {r['harness sync'] / r['rsync -a --delete']:.2f} |")
    if resume:
        lines += ["", f"Resume: a pull through the delay line killed (SIGKILL) at {resume['killed_at']:.1%} and run again: the host sent "
                  f"{resume['sent_again'] / MiB:.2f} MiB again ({resume['sent_again_pct']:.2f}% of the file; target <= 1%)."]
    if skipped:
        lines += ["", f"Not run this time: {', '.join(skipped)}."]
    return "\n".join(lines + [""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=["pull", "slow", "run", "sync", "resume"])
    parser.add_argument("--base-tree", type=Path, help="another harness checkout (e.g. `git worktree add /tmp/base HEAD~1`) pulled beside this one")
    parser.add_argument("--record", action="store_true", help="append the table to bench/RESULTS.md")
    args = parser.parse_args()

    # An installed harness runs from bytecode; without it every command compiles ~0.3 s of source.
    for tree in (ROOT, args.base_tree) if args.base_tree else (ROOT,):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "harness")], check=True, stdout=subprocess.DEVNULL)
        found = subprocess.run([sys.executable, "-c", "import harness; print(harness.__file__)"], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True, check=True)
        if not Path(found.stdout.strip()).resolve().is_relative_to(tree.resolve()):
            sys.exit(f"{tree}: python imports harness from {found.stdout.strip()}, not from this tree")
    work = Path(tempfile.mkdtemp(prefix="harness-bench-transfer-"))
    bench = Bench(work, args.rtt_ms, args.base_tree)
    try:
        src = bench.host_dir / "outputs" / "model.safetensors"
        src.parent.mkdir(parents=True)
        with open(src, "wb") as f:
            for _ in range(args.size_mib):
                f.write(os.urandom(MiB))
        digest = sha256(src)  # also leaves the file in the page cache, for every tool alike
        os.sync()  # no write-back of the fresh file competing with the first measurement
        pulls: dict[str, dict[str, float]] = {}
        if "pull" not in args.skip:
            pulls["loopback"] = bench.pull_row("box", src, digest, args.streams, args.repeat)
        if "slow" not in args.skip:
            pulls[f"{args.rtt_ms:.0f} ms RTT"] = bench.pull_row("slow", src, digest, args.streams, args.repeat)
        runs = bench.run_rows(args.repeat) if "run" not in args.skip else {}
        syncs = bench.sync_rows(args.files, args.repeat) if "sync" not in args.skip else {}
        resume = bench.resume_row(src, digest, args.streams) if "resume" not in args.skip else None
        table = render(args.size_mib, args.rtt_ms, args.files, args.streams, pulls, syncs, resume, args.skip, bench.load, args.repeat, runs, args.base_tree)
        print()
        print(table)
        if args.record:
            record("## bench/transfer.py", table)
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
