"""How a command runs on a host: directly (HostRuntime) or inside the ML container (DockerRuntime).

A runtime turns "run this argv in the stage environment" into a host-level argv that a Transport
executes. Jobs, `harness exec`, `harness shell`, `harness inspect` and doctor all go through
`wrap`, so they see exactly the interpreter, image, mounts and environment the stages see; the
foreground commands through `foreground`, which also works on a host that was never synced.

Everything that differs between the two is a method or an attribute here (the detached stage
process, the image record, the GPU count, the network, the words doctor uses): callers ask the
runtime and never compare kinds.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from harness.config import HostConfig
from harness.host_helpers import wire

if TYPE_CHECKING:
    from harness.transport.base import Transport


@dataclass(frozen=True)
class WrapOptions:
    interactive: bool = False  # keep stdin open and allocate a TTY inside (shell, exec --pty)
    env_names: tuple[str, ...] = ()  # variables passed through BY NAME (values come from the
    # transport's env, never from the command line)
    labels: tuple[tuple[str, str], ...] = ()  # docker labels (run id, stage)
    name: str | None = None  # container name (detached jobs)
    gpus: bool = True  # False: ask for no GPUs (the container start check: it needs none)
    host_network: bool = False  # listen on the host's own addresses (a group's rendezvous, NCCL)


# Create directories, then run the command: one round trip. The directories are data ($2..),
# never part of the script; they and what the command writes are the user's alone (umask 077).
# `--user USER_TOKEN` (runtime/docker.py) becomes the user's `--user uid:gid` on the way.
USER_TOKEN = wire.USER_TOKEN  # the supervisor puts it in for stage containers (host_helpers/supervisor.py)
# `--label CLIENT_LABEL=CLIENT_TOKEN` becomes the pid of the command's client on the host (this
# shell's, which the client keeps): a container whose client is gone is found by it
CLIENT_LABEL = "harness.client"
CLIENT_TOKEN = "@harness-client@"
_MKDIRS_THEN_EXEC = ('umask 077; n=$1; shift; while [ "$n" -gt 0 ]; do [ -d "$1" ] || mkdir -p -m 700 -- "$1" || exit 125; shift; n=$((n-1)); done; '
                     f'u="$(id -u):$(id -g)"; p=; for a do shift; [ "$p" = --user ] && [ "$a" = {USER_TOKEN} ] && a=$u; '
                     f'[ "$p" = --label ] && [ "$a" = {CLIENT_LABEL}={CLIENT_TOKEN} ] && a={CLIENT_LABEL}=$$; p=$a; set -- "$@" "$a"; done; '
                     'exec "$@"')

# Compilers' caches the stages write and later load code from: in the workdir (0700), not in a
# shared /tmp where another uid could make them first (torch's default /tmp/torchinductor_USER),
# and kept across containers: vLLM's (its torch.compile cache) makes each later server start of
# serve_check's table, and of the next run, skip the compile.
CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "torchinductor", "TRITON_CACHE_DIR": "triton", "VLLM_CACHE_ROOT": "vllm"}

# What the stages see as their GPUs: CUDA_VISIBLE_DEVICES (or all) and nvidia-smi's list.
_VISIBLE_GPUS_PROBE = 'printf "%s\\n" "${CUDA_VISIBLE_DEVICES-all}"; exec nvidia-smi -L'


class Runtime(abc.ABC):
    #: recorded in run.json and shown by status; never compared by callers
    kind: str
    #: where doctor says the stages' GPUs are looked for
    where: str = "to the stage interpreter"
    #: the image the stages run in (harness build makes it); None: no image
    image: str | None = None
    #: whether the stages see the host's absolute paths as they are (a container sees only its
    #: mounts, so a path there is not checked from the host)
    sees_host_paths: bool = True

    def __init__(self, host: HostConfig, workdir: str | None = None, *, transport: "Transport | None" = None):
        self.host = host
        self._workdir = workdir
        self._transport = transport  # asked for the workdir's expansion on first use only

    @property
    def workdir(self) -> str:
        """Absolute, expanded on the host (one round trip, on first use: `exec` on a host
        runtime never asks)."""
        if self._workdir is None:
            if self._transport is None:
                raise ValueError(f"{self.host.name}: a runtime without a transport has no workdir")
            self._workdir = self._transport.expand(self.host.workdir).rstrip("/") or "/"
        return self._workdir

    def home_on_host(self, token: str) -> None:
        """Let `token` stand for the home directory in what this runtime builds from now on,
        where it does not know it yet (a configured ~): the host helper that receives it puts in
        the real one (the supervisor's launch), and home_is(home) then tells this runtime."""
        if self._workdir is None:
            self._workdir = _with_home(self.host.workdir, token).rstrip("/") or "/"

    def home_is(self, home: str, token: str) -> None:
        """The home directory the host put in for `token` (after home_on_host)."""
        if self._workdir is not None:
            self._workdir = self._workdir.replace(token, home)

    @property
    def workdir_as_given(self) -> str:
        """The workdir expanded once known, else as configured: a leading ~ that the host
        expands where the path is used (the host helpers expand it), so no round trip asks."""
        return self._workdir if self._workdir is not None else self.host.workdir.rstrip("/") or "/"

    @property
    @abc.abstractmethod
    def python(self) -> str:
        """The interpreter the stages use, as named inside the runtime."""

    @abc.abstractmethod
    def wrap(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        """Host-level argv that runs `argv` in the stage environment with cwd = workdir."""

    def host_dirs(self) -> list[str]:
        """Host directories that must exist before a command runs in this runtime."""
        return [self.workdir]

    def cache_env(self) -> dict[str, str]:
        """The compile caches' variables for the stages (CACHE_DIRS), under the workdir's .harness/
        (a value the host's env sets is theirs: these are defaults)."""
        return {name: f"{self.workdir}/.harness/cache/{sub}" for name, sub in CACHE_DIRS.items()}

    def foreground(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        """wrap(argv), creating host_dirs() first: a fresh host has no workdir until the first
        sync, yet exec, shell, inspect and doctor are the first things run on a new box (and
        docker would create a missing mount source itself, owned by root)."""
        dirs = self.host_dirs()
        return ["sh", "-c", self._foreground_script, "sh", str(len(dirs)), *dirs, *self.wrap(argv, options)]

    _foreground_script = _MKDIRS_THEN_EXEC  # DockerRuntime's: the container goes with its client

    def exec_in(self, container: str, argv: Sequence[str]) -> list[str]:
        """Host argv that runs `argv`, its stdin kept, in `container`: one this runtime started
        and named (a HostServer's), whose file system and loopback only it reaches."""
        raise ValueError(f"{self.host.name}: the {self.kind} runtime starts no containers")

    # -- detached runs (harness.jobs) --------------------------------------------------------------

    @abc.abstractmethod
    def stage_process(self, argv: Sequence[str], *, run_id: str, stage: str, log_path: str, options: WrapOptions = WrapOptions()) -> dict[str, Any]:
        """How the supervisor (harness/host_helpers/supervisor.py) starts one stage: its spec's
        "kind" and "argv" (and what else that kind needs). Output goes to log_path."""

    def image_probes(self) -> list[list[str]]:
        """The host commands image_record runs, in order (none: no image)."""
        return []

    def image_record(self, transport: "Transport") -> dict[str, Any]:
        """The image the stages run, for the run record (all None: no image)."""
        return {"ref": None, "id": None, "versions": None}

    def configured_gpu_count(self) -> int | None:
        """GPUs the configuration gives the stages, or None when the host decides."""
        return None

    @property
    def uses_image(self) -> bool:
        """The stages run in an image that `harness build` makes (HostConfig.uses_image)."""
        return self.host.uses_image

    def gpu_count(self, transport: "Transport") -> int:
        """GPUs a distributed stage spreads over (torchrun's --nproc-per-node): the configured
        count, else what the stages see on the host (nvidia-smi, limited by the same
        CUDA_VISIBLE_DEVICES as the stages; torchrun must start no more ranks than that)."""
        configured = self.configured_gpu_count()
        if configured is not None:
            return configured
        result = transport.run(self.gpu_probe())
        return visible_gpu_count(result.text) if result.ok else 0

    def gpu_probe(self) -> list[str] | None:
        """The host command gpu_count runs (None: the configured count needs none)."""
        if self.configured_gpu_count() is not None:
            return None
        return self.visible_gpus_probe(["sh", "-c", _VISIBLE_GPUS_PROBE])

    def visible_gpus_probe(self, argv: Sequence[str]) -> list[str]:
        """argv on the host under the GPU limit the stages run with (none by default)."""
        return list(argv)

    # -- words ------------------------------------------------------------------------------------

    def install_fix(self) -> str:
        """How to get the pinned library versions where the stages run (doctor's fix)."""
        return "install the pinned versions (container/requirements.txt) in the host's python"

    def no_gpu_verdict(self, nvidia_smi_found: bool) -> tuple[str, str]:
        """(status, note) when the probe sees no GPU where the stages run."""
        return "warn", ""


def _with_home(path: str, home: str) -> str:
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def visible_gpu_count(probe_output: str) -> int:
    """GPUs the stages can use, from the probe's output: a CUDA_VISIBLE_DEVICES line ("all" when
    unset), then `nvidia-smi -L`."""
    first, _, rest = probe_output.partition("\n")
    listed = sum(1 for line in rest.splitlines() if line.startswith("GPU "))
    if first.strip() == "all":
        return listed
    visible = [d for d in first.split(",") if d.strip() and d.strip() != "-1"]
    return min(listed, len(visible))
