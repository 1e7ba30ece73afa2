"""`harness exec` in the container, timed with and without the watcher that removes the container
when the session ends under it (harness.runtime.docker, issue 54): what the watcher (a python3
beside the docker client on the box) costs each exec.

    python bench/exec_container.py [-n 10] [--record]

This machine as the box (runtime = "docker", local), the job tests' image (INSTALL_ML=0, built
if missing); each round runs `harness.remote_exec.exec_on_host(host, ["true"])` once with the
watcher and once without (the foreground script before it: the docker client exec'd), alternately,
and prints each one's median. --record appends the figures to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results_file import record  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.host import Host  # noqa: E402
from harness.remote_exec import exec_on_host  # noqa: E402
from harness.runtime import base, docker  # noqa: E402
from harness.runtime.image import build  # noqa: E402
from harness.transport import connect  # noqa: E402
from tests.fixtures.docker_engine import BASE_IMAGE, container_table, ensure_base_image  # noqa: E402
from tests.fixtures.job_project import write_build_context, write_project  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    ensure_base_image()
    times: dict[str, list[float]] = {"watched": [], "exec'd": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_build_context(root)
        config = load_config(write_project(root, root / "work", {}, host_table={"runtime": "docker"}, container=container_table(BASE_IMAGE)))
        transport = connect(config.host("box"))
        host = Host(config, config.host("box"), lambda _name: transport)
        build(transport, config, config.host("box"), output=lambda _: None)
        scripts = {"watched": docker._MKDIRS_THEN_RUN_WATCHED, "exec'd": base._MKDIRS_THEN_EXEC}
        devnull = os.open(os.devnull, os.O_WRONLY)
        saved = os.dup(1)
        try:
            for i in range(args.n + 1):  # the first round warms the engine and is not counted
                for mode, script in scripts.items():
                    docker.DockerRuntime._foreground_script = script
                    os.dup2(devnull, 1)
                    t0 = time.monotonic()
                    code = exec_on_host(host, ["true"], pty=False)
                    seconds = time.monotonic() - t0
                    os.dup2(saved, 1)
                    assert code == 0
                    if i:
                        times[mode].append(seconds)
        finally:
            os.dup2(saved, 1)
            docker.DockerRuntime._foreground_script = docker._MKDIRS_THEN_RUN_WATCHED
    summary = ", ".join(f"{m} median {statistics.median(ts) * 1000:.0f} ms (min {min(ts) * 1000:.0f}, max {max(ts) * 1000:.0f})" for m, ts in times.items())
    print(summary)
    if args.record:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        record("## bench/exec_container.py (`harness exec` in the container: the watcher's cost; issue 54)",
               f"### {when}: `python bench/exec_container.py -n {args.n} --record` ({os.cpu_count()} cores, dockerd 20.10, this machine as the box)\n\n"
               f"- `exec_on_host(host, [\"true\"])`, {args.n} rounds alternating: **{summary}**.")


if __name__ == "__main__":
    main()
