#!/usr/bin/env python3
"""Measure the two ways `harness build` could talk to a host's Docker engine over SSH:

  cli  the docker CLI on the host, run through the harness's SSHTransport (one kept paramiko
       connection; `docker build -` with the context tar on stdin)
  sdk  the docker SDK on the laptop over ssh://alias:port (its own paramiko connection; the port
       must be in the URL: docker-py turns ssh://alias into ssh://alias:22;
       API version pinned: negotiation over ssh failed here)

against the real sshd test bed (tests/fixtures/sshd.py) and the local engine. The SDK reads only
~/.ssh/config and ~/.ssh/known_hosts, so it runs with HOME pointed at a temporary directory
holding the test bed's files (the user's real ~/.ssh is never touched).

usage: python scripts/measure-docker-channels.py [BASE_IMAGE]   (prints a table; ~1 min)
"""

from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

API_VERSION = "1.41"  # the engine here is 20.10; pinned because negotiation over ssh failed


def timed(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def fmt(samples: list[float]) -> str:
    return f"median {statistics.median(samples) * 1000:8.1f} ms   min {min(samples) * 1000:8.1f} ms   (n={len(samples)})"


def main() -> int:
    base = sys.argv[1] if len(sys.argv) > 1 else "harness-test-base:bookworm"
    from harness.config import load_config
    from harness.runtime.image import gather_inputs
    from harness.transport import connect
    from tests.fixtures.job_project import write_build_context, write_project
    from tests.fixtures.sshd import start_testbed, stop_testbed

    root = Path(tempfile.mkdtemp(prefix="measure-docker-"))
    bed = start_testbed(root / "sshd")
    try:
        write_build_context(root / "project")
        config = load_config(
            write_project(
                root / "project", root / "work", {},
                host_table={"local": False, "ssh": bed.alias, "runtime": "docker"},
                container={"image": "harness-measure", "base_image": base, "build_args": {"INSTALL_ML": "0"}},
            )
        )
        host = config.host("box")
        inputs = gather_inputs(config, host)
        context = inputs.context_tar()
        build_args = inputs.build_args
        results: dict[str, str] = {}

        # -- cli through the transport ------------------------------------------------------------
        t0 = time.perf_counter()
        transport = connect(host, bed.connect_options())
        transport.run(["true"])
        results["cli: connect (paramiko, once)"] = f"{(time.perf_counter() - t0) * 1000:8.1f} ms"
        results["cli: docker version"] = fmt(timed(lambda: transport.check(["docker", "version", "--format", "{{.Server.Version}}"]), 10))
        results["cli: docker image inspect"] = fmt(timed(lambda: transport.run(["docker", "image", "inspect", "--format", "{{.Id}}", base]), 10))

        def cli_build() -> None:
            argv = ["docker", "build", "-q", "-f", inputs.dockerfile, "-t", "harness-measure:cli"]
            for k, v in build_args.items():
                argv += ["--build-arg", f"{k}={v}"]
            transport.check([*argv, "-"], stdin=context)

        results["cli: build (layers cached)"] = fmt(timed(cli_build, 3))

        # -- sdk over ssh:// ----------------------------------------------------------------------
        home = root / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(bed.ssh_config.read_text())
        (home / ".ssh" / "known_hosts").write_text(bed.known_hosts.read_text())
        os.environ["HOME"] = str(home)
        import docker

        t0 = time.perf_counter()
        client = docker.DockerClient(base_url=f"ssh://{bed.user}@{bed.alias}:{bed.port}", version=API_VERSION, use_ssh_client=False)
        client.ping()
        results["sdk: connect + first ping"] = f"{(time.perf_counter() - t0) * 1000:8.1f} ms"
        results["sdk: version"] = fmt(timed(client.version, 10))
        results["sdk: images.get"] = fmt(timed(lambda: client.images.get(base), 10))

        def sdk_build() -> None:
            for _ in client.api.build(fileobj=io.BytesIO(context), custom_context=True, dockerfile=inputs.dockerfile, tag="harness-measure:sdk", buildargs=build_args, decode=True):
                pass

        results["sdk: build (layers cached)"] = fmt(timed(sdk_build, 3))
        client.close()
        transport.close()
        width = max(map(len, results))
        for k, v in results.items():
            print(f"{k:<{width}}  {v}")
    finally:
        stop_testbed(bed)
        os.system("docker rmi -f harness-measure:cli harness-measure:sdk >/dev/null 2>&1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
