"""`harness sync GROUP` (every host at once) against syncing the hosts one after another.

Starts the network-namespace hosts of the multinode tests (tests/fixtures/netns.py: one sshd
each; needs root), puts each behind its own 100 Mbit/s link, as GPU hosts are from a laptop, so
that a sync costs link time rather than this machine's cores, and syncs the same payload of
incompressible files (a) to one host, (b) to every host one after another, (c) to every host
at once with sync_hosts, what the command runs. Prints the three and (b)/(c): with N hosts the
ideal is N.

    sudo python bench/parallel_sync.py [--size-mib 24] [--hosts 3] [--rate 100mbit] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from tests.fixtures.netns import netns_unavailable_reason, start_cluster, stop_cluster, write_cluster_config  # noqa: E402

FILES = 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=24, help="payload, in 12 files")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--rate", default="100mbit", help="each host's link (tc rate)")
    parser.add_argument("--record", action="store_true", help="append the figures to bench/RESULTS.md")
    args = parser.parse_args()
    if reason := netns_unavailable_reason():
        sys.exit(f"bench/parallel_sync.py: network namespaces unavailable: {reason}")

    from harness.config import load_config
    from harness.fanout import open_all
    from harness.sync import scan_local, sync_hosts
    from harness.sync.hashing import LOCAL_CACHE_PATH
    from harness.transport import connect

    work = Path(tempfile.mkdtemp(prefix="harness-bench-psync-"))
    cluster = start_cluster(work / "cluster", args.hosts)
    try:
        os.environ.update({k: v for k, v in cluster.env().items() if k.startswith("HARNESS_")})
        for node in cluster.nodes:
            node.limit_bandwidth(args.rate)
        payload = work / "data"
        payload.mkdir()
        for i in range(FILES):
            (payload / f"blob{i}.bin").write_bytes(os.urandom((args.size_mib << 20) // FILES))
        config = load_config(write_cluster_config(work, cluster, extra='[sync]\npaths = ["data"]\n'))
        hosts = list(config.groups["cluster"].hosts)
        transports = open_all(lambda h: connect(config.host(h)), hosts)
        scan_local(config.root, ["data"], cache_file=config.root / LOCAL_CACHE_PATH)  # hash once: every sync's scan reads the cache

        def timed(group: list[str], tag: str) -> float:
            started = time.monotonic()
            outcome = sync_hosts(config, {h: transports[h] for h in group}, ["data"], workdirs={h: str(work / f"{tag}-{h}") for h in group})
            took = time.monotonic() - started
            for h, result, error in outcome:
                if error is not None or result.files_sent != FILES:
                    sys.exit(f"bench/parallel_sync.py: sync to {h} failed: {error}")
            return took

        one = timed(hosts[:1], "one")
        sequence = sum(timed([h], f"seq{i}") for i, h in enumerate(hosts))
        parallel = timed(hosts, "par")
        for t in transports.values():
            t.close()
    finally:
        stop_cluster(cluster)
        shutil.rmtree(work, ignore_errors=True)

    table = (f"### {datetime.date.today().isoformat()}: {args.size_mib} MiB in {FILES} files, {args.hosts} hosts, each behind {args.rate}\n\n"
             f"| one host | {args.hosts} one after another | {args.hosts} at once (ours) | after another / at once |\n|---|---|---|---|\n"
             f"| {one:.2f} s | {sequence:.2f} s | {parallel:.2f} s | {sequence / parallel:.2f}x (ideal {args.hosts}x) |\n")
    print(table)
    if args.record:
        record("## bench/parallel_sync.py", table)


if __name__ == "__main__":
    main()
