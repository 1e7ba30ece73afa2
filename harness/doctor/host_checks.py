"""Checks of the host itself: interpreter, disk, Docker, GPUs."""

from __future__ import annotations

import json

from harness import helpers
from harness.transport.remote_shell import sh_expand_home
from harness.config import HostConfig
from harness.doctor.base import CheckResult, CommandRunner, describe

MIN_PYTHON = (3, 10)
PYTHON_VERSION = "python_version.py"  # host_helpers/
DISK_FAIL_GIB = 1  # cannot even hold a checkpoint
DISK_WARN_GIB = 20  # hidden states and checkpoints of a real verifier need tens of GiB

# df of the workdir, or of its nearest existing parent (a fresh host has no workdir yet).
_DF_SCRIPT = f'd=$1; {sh_expand_home("d")}; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done; df -Pk -- "$d"'


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1].strip() if lines else ""


@describe("python3", "the host's python3 (>= 3.10: the helpers run with it)")
def check_python3(runner: CommandRunner, host: HostConfig) -> CheckResult:
    # Asked of the interpreter the helpers really start (harness.helpers: /usr/bin/python3 for a
    # plain `python3`), the way they start it, through the runner the checks take.
    r = runner.run(helpers.argv(PYTHON_VERSION, python=host.python), stdin=helpers.payload(PYTHON_VERSION, {}))
    if r.exit_code == 127:
        return CheckResult("python3", "fail", f"{host.python} not found on the host", "install Python >= 3.10 (harness's helpers run with it)")
    try:
        version = json.loads(r.stdout)["version"]
    except (ValueError, KeyError, TypeError):
        version = None
    if r.exit_code != 0 or version is None:
        return CheckResult("python3", "fail", f"{host.python} failed: {_last_line(r.stderr)}", "set python = \"...\" for this host in harness.toml")
    parsed = tuple(int(p) for p in version.split(".")[:2])
    if parsed < MIN_PYTHON:
        return CheckResult("python3", "fail", f"{host.python} is {version}; need >= 3.10", "install Python >= 3.10 and set python = \"...\" in harness.toml")
    return CheckResult("python3", "ok", f"{host.python} {version}")


@describe("disk", "free space under the workdir")
def check_disk(runner: CommandRunner, host: HostConfig) -> CheckResult:
    r = runner.run(["sh", "-c", _DF_SCRIPT, "sh", host.workdir])
    if r.exit_code != 0:
        return CheckResult("disk", "warn", f"cannot measure free space under {host.workdir}: {_last_line(r.stderr)}", "check that df exists on the host")
    fields = _last_line(r.stdout).split()
    try:
        free_gib = int(fields[3]) / 2**20
        mount = fields[5]
    except (IndexError, ValueError):
        return CheckResult("disk", "warn", f"unexpected df output: {_last_line(r.stdout)!r}", "")
    message = f"{free_gib:.1f} GiB free under {host.workdir} (filesystem {mount})"
    if free_gib < DISK_FAIL_GIB:
        return CheckResult("disk", "fail", message, "free space or point workdir/data_dir at a larger disk")
    if free_gib < DISK_WARN_GIB:
        return CheckResult("disk", "warn", message, f"real runs need tens of GiB: free space or set data_dir (below {DISK_WARN_GIB} GiB)")
    return CheckResult("disk", "ok", message)


@describe("docker", "the Docker engine answers (needed for runtime = docker)")
def check_docker(runner: CommandRunner, host: HostConfig) -> CheckResult:
    needed = host.uses_image  # the engine builds and runs the stages' image
    r = runner.run(["docker", "version", "--format", "{{.Server.Version}}"])
    if r.exit_code == 127:
        if not needed:
            return CheckResult("docker", "ok", f"not installed (not needed: runtime = \"{host.runtime}\")")
        return CheckResult("docker", "fail", "docker is not installed", "install Docker Engine and the NVIDIA container toolkit on the host")
    if r.exit_code != 0 or not r.text.strip():
        why = _last_line(r.stderr) or "the engine did not answer"
        fix = "start the engine (systemctl start docker) or add your user to the docker group"
        return CheckResult("docker", "fail" if needed else "warn", f"docker engine not answering: {why}", fix)
    return CheckResult("docker", "ok", f"engine {r.text.strip()} answering")


@describe("gpus", "nvidia-smi lists the GPUs")
def check_gpus(runner: CommandRunner, host: HostConfig) -> CheckResult:
    r = runner.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if r.exit_code == 127:
        return CheckResult("gpus", "warn", "nvidia-smi not found: no NVIDIA GPU visible", "install the NVIDIA driver (CPU-only hosts can run only the tiny demo)")
    if r.exit_code != 0:
        return CheckResult("gpus", "fail", f"nvidia-smi failed: {_last_line(r.stdout) or _last_line(r.stderr)}", "check the NVIDIA driver (nvidia-smi must work)")
    gpus = [[f.strip() for f in line.split(",")] for line in r.text.strip().splitlines() if line.strip()]
    if not gpus:
        return CheckResult("gpus", "warn", "nvidia-smi lists no GPU", "check the driver and that the GPUs are visible")
    names = sorted({g[0] for g in gpus})
    driver = gpus[0][1] if len(gpus[0]) > 1 else "?"
    return CheckResult("gpus", "ok", f"{len(gpus)} GPU(s): {', '.join(names)} (driver {driver})")


HOST_CHECKS = [check_python3, check_disk, check_docker, check_gpus]
