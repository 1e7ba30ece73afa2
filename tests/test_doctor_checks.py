"""Doctor checks against a fake CommandRunner (pure logic: no SSH needed)."""

from __future__ import annotations

import json

from harness import helpers
from harness.config import HostConfig
from harness.doctor import CHECK_GROUPS, diagnose
from harness.doctor.base import run_checks
from harness.doctor.host_checks import check_disk, check_docker, check_gpus, check_python3
from harness.errors import ConnectError
from harness.transport.base import RunResult


class FakeRunner:
    """Answers by the first word of argv, or a host helper's name (harness.helpers); records what ran."""

    def __init__(self, answers: dict[str, RunResult]):
        self.answers, self.calls = answers, []

    def run(self, argv, **kwargs) -> RunResult:
        self.calls.append(list(argv))
        key = argv[argv.index(helpers.BOOT) + 1] if helpers.BOOT in argv else argv[0]
        return self.answers.get(key, RunResult(127, b"", b"not found"))

    def open(self) -> "FakeRunner":  # Transport.open: doctor connects first
        return self


def python_is(version: str) -> dict[str, RunResult]:
    return {"python_version.py": RunResult(0, json.dumps({"version": version, "executable": "/usr/bin/python3"}).encode())}


HOST = HostConfig(name="gpu", ssh="u@h", workdir="~/w")
DOCKER_HOST = HostConfig(name="gpu", ssh="u@h", runtime="docker")


def test_python_versions():
    assert check_python3(FakeRunner(python_is("3.11.4")), HOST).status == "ok"
    old = check_python3(FakeRunner(python_is("3.8.10")), HOST)
    assert old.status == "fail" and "3.8.10" in old.message and old.fix
    assert check_python3(FakeRunner({}), HOST).status == "fail"


def test_disk_thresholds_and_workdir_passed_as_data():
    def df(avail_kib: int) -> FakeRunner:
        return FakeRunner({"sh": RunResult(0, f"Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/x 1 1 {avail_kib} 1% /data\n".encode())})

    runner = df(100 * 2**20)
    assert check_disk(runner, HOST).status == "ok"
    assert runner.calls[0][-1] == "~/w"  # the workdir is an argument, not spliced into the script
    assert check_disk(df(5 * 2**20), HOST).status == "warn"
    assert check_disk(df(100), HOST).status == "fail"


def test_docker_needed_only_for_docker_runtime():
    assert check_docker(FakeRunner({}), HOST).status == "ok"
    assert check_docker(FakeRunner({}), DOCKER_HOST).status == "fail"
    down = FakeRunner({"docker": RunResult(1, b"", b"Cannot connect to the Docker daemon\n")})
    assert check_docker(down, DOCKER_HOST).status == "fail" and "Cannot connect" in check_docker(down, DOCKER_HOST).message
    assert check_docker(down, HOST).status == "warn"
    assert check_docker(FakeRunner({"docker": RunResult(0, b"27.1.1\n")}), DOCKER_HOST).status == "ok"


def test_gpus():
    two = FakeRunner({"nvidia-smi": RunResult(0, b"NVIDIA H200, 570.1, 143771 MiB\nNVIDIA H200, 570.1, 143771 MiB\n")})
    r = check_gpus(two, HOST)
    assert r.status == "ok" and "2 GPU(s)" in r.message and "H200" in r.message and "570.1" in r.message
    assert check_gpus(FakeRunner({}), HOST).status == "warn"
    assert check_gpus(FakeRunner({"nvidia-smi": RunResult(9, b"NVIDIA-SMI has failed\n")}), HOST).status == "fail"


def test_diagnose_stops_at_a_failed_connection_and_groups_are_extensible():
    def refuse():
        raise ConnectError("gpu (h): cannot connect: Connection refused")

    results = diagnose(HOST, refuse)
    assert [(r.name, r.status) for r in results] == [("connect", "fail")]
    names = [c.__name__ for _, checks in CHECK_GROUPS for c in checks]
    assert names == ["check_python3", "check_disk", "check_docker", "check_gpus"]
    ok = diagnose(HOST, lambda: FakeRunner(python_is("3.12.0")))
    assert [r.name for r in ok] == ["connect", "python3", "disk", "docker", "gpus"]


def test_a_crashing_check_becomes_a_fail():
    def check_boom(runner, host):
        raise ConnectError("link lost")

    (r,) = run_checks(FakeRunner({}), HOST, [check_boom])
    assert (r.name, r.status, r.message) == ("boom", "fail", "link lost")
