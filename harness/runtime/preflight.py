"""Before any stage starts a container: is the image built, and does a container start?

`harness run` and doctor ask here first, so a host without the image, or an engine that refuses
the configured options, is one line before any stage runs (not docker's raw error in a stage log,
and never a registry pull: every container harness starts uses `--pull=never`).

  not built   `docker image inspect <image>:latest`: no image is "<ref> not built: harness build HOST"
  start       one throwaway container (`docker run --rm`) with the stage options except GPUs
              (ulimits, shm, ipc, mounts: doctor's stage-gpus check starts one with GPUs); it
              prints /opt/harness/versions.json, what the image recorded at build time
              (container/record_versions.py), which the run record keeps
  ulimits     an engine that may not raise a limit fails the start with runc's
              `error setting rlimit type N`; that becomes one line naming container.ulimits, the
              value asked for and the hard limit a container gets on that engine (read from a
              container started without the option)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.config import ContainerConfig
from harness.errors import HarnessError, UsageError
from harness.runtime.base import Runtime, WrapOptions
from harness.runtime.image import image_id, inspect_argv

if TYPE_CHECKING:
    from harness.transport.base import Transport

VERSIONS_FILE = "/opt/harness/versions.json"  # written by container/record_versions.py
# Linux RLIMIT_* numbers (runc names them in its error) -> docker's --ulimit names, and the rows
# of /proc/<pid>/limits that hold them.
RLIMITS: dict[int, tuple[str, str]] = {
    0: ("cpu", "Max cpu time"), 1: ("fsize", "Max file size"), 2: ("data", "Max data size"),
    3: ("stack", "Max stack size"), 4: ("core", "Max core file size"), 5: ("rss", "Max resident set"),
    6: ("nproc", "Max processes"), 7: ("nofile", "Max open files"), 8: ("memlock", "Max locked memory"),
    9: ("as", "Max address space"), 10: ("locks", "Max file locks"), 11: ("sigpending", "Max pending signals"),
    12: ("msgqueue", "Max msgqueue size"), 13: ("nice", "Max nice priority"), 14: ("rtprio", "Max realtime priority"),
    15: ("rttime", "Max realtime timeout"),
}
_RLIMIT_ERROR = re.compile(r"rlimit type (\d+)")
DEFAULT_ULIMITS = {"memlock": -1, "stack": 67108864}


def ulimits(container: ContainerConfig) -> dict[str, int | str]:
    """The --ulimit values containers get: the defaults, overridden by container.ulimits."""
    return {**DEFAULT_ULIMITS, **container.ulimits}


class ImageNotBuilt(UsageError):
    """The host has no image under the name stages run."""


class UlimitRefused(UsageError):
    """The engine may not give containers the configured ulimits."""


class ContainerStartError(HarnessError):
    """A container of the image does not start with the configured options (not a ulimit)."""


@dataclass(frozen=True)
class ImageFacts:
    ref: str
    id: str
    versions: dict[str, Any] | None  # None: an image built before it recorded them

    def to_record(self) -> dict[str, Any]:
        return {"ref": self.ref, "id": self.id, "versions": self.versions}


def not_built(ref: str, host: str) -> str:
    return f"{ref} not built: harness build {host}"


def require_image(transport: "Transport", runtime: "Runtime") -> str:
    """The ID of the image stages run, or ImageNotBuilt (one line) when the host has none."""
    found = image_id(transport, runtime.image)
    if not found:
        raise ImageNotBuilt(f"{runtime.host.name}: {not_built(runtime.image, runtime.host.name)}")
    return found


def check_argvs(runtime: "Runtime") -> list[list[str]]:
    """The host commands check_container runs, in order (harness.jobs asks them ahead, in one
    helper call with the launch's other probes)."""
    return [inspect_argv(runtime.image), versions_argv(runtime)]


def versions_argv(runtime: "Runtime") -> list[str]:
    """A throwaway container with the stage options but GPUs, printing the image's versions."""
    return runtime.foreground(["sh", "-c", f"cat {VERSIONS_FILE} 2>/dev/null || echo null"], WrapOptions(gpus=False))


def check_container(transport: "Transport", runtime: "Runtime") -> ImageFacts:
    """The image exists and a container of it starts with the configured options. `transport`:
    anything with transport.run's shape (harness.helpers.Prefetched at a run's start)."""

    found = require_image(transport, runtime)
    result = transport.run(versions_argv(runtime))
    if result.exit_code != 0:
        raise start_error(transport, runtime, result.stderr.decode("utf-8", "replace"), result.exit_code)
    try:
        versions = json.loads(result.text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        versions = None
    return ImageFacts(runtime.image, found, versions if isinstance(versions, dict) else None)


def start_error(transport: "Transport", runtime: "Runtime", stderr: str, exit_code: int) -> HarnessError:
    """The one-line error for a container that did not start."""
    host = runtime.host.name
    match = _RLIMIT_ERROR.search(stderr)
    if match and int(match.group(1)) in RLIMITS:
        name, row = RLIMITS[int(match.group(1))]
        asked = ulimits(runtime.host.container).get(name, "?")
        hard = engine_hard_limit(transport, runtime, row)
        return UlimitRefused(
            f"{host}: the Docker engine refused container.ulimits {name} = {asked}: the host's hard limit for {name} is {hard}",
            f"set hosts.{host}.container.ulimits = {{ {name} = {hard if hard.isdigit() else '...'} }} or raise the engine's limit (e.g. Limit{name.upper()}= in docker.service)",
        )
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip() and not line.startswith("Run 'docker run --help'")]
    return ContainerStartError(f"{host}: a container of {runtime.image} does not start (exit {exit_code}): {lines[-1] if lines else 'no output'}")


def engine_hard_limit(transport: "Transport", runtime: "Runtime", row: str) -> str:
    """The hard limit a container gets on this engine without --ulimit: what it inherits from
    the engine, and the most it may be given without CAP_SYS_RESOURCE."""
    argv = ["docker", "run", "--rm", "--pull=never", runtime.image, "cat", "/proc/self/limits"]
    result = transport.run(argv)
    for line in result.text.splitlines() if result.exit_code == 0 else []:
        if line.startswith(row):
            fields = line[len(row):].split()
            if len(fields) >= 2:
                return fields[1]
    return "unknown"
