"""DockerRuntime: stages run in the ML container, started with the docker CLI ON THE HOST.

Every container harness starts (jobs, `harness exec`, `harness shell`, inspect, the version
probe) gets the same options from `run_options`, so a shell sees exactly what a stage sees: the
box user's uid and gid (what a container writes is the user's, never root's), a private IPC
namespace and its own shared memory, the GPUs and ulimits, the workdir mounted at the SAME path
as the working directory, data_dir, the Hugging Face cache (at its host path too) and the
configured mounts, env passed BY NAME (a secret never appears on a command line), labels naming
the run and the stage, `--init`, and `--pull=never` (the image is the one `harness build` made on
the host). What runs inside starts under umask 077: what it writes is the user's alone.

Each option and why: docs/architecture/runtime.md, runtime/.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

from harness.config import HostConfig
from harness.runtime.base import _MKDIRS_THEN_EXEC, CLIENT_LABEL, CLIENT_TOKEN, USER_TOKEN, Runtime, WrapOptions
from harness.runtime.image import current_ref
from harness.runtime.preflight import check_argvs, check_container, ulimits

if TYPE_CHECKING:
    from harness.transport.base import Transport

# What runs inside starts with umask 077 (docker has no option for it)
PRIVATE = ["sh", "-c", 'umask 077; exec "$@"', "sh"]
LABEL_PREFIX = "harness"
WORKDIR_LABEL = "harness.workdir"  # on every container harness starts: whose it is (harness gc)

# A foreground container (exec, shell, inspect, a server) must not outlive its command: ssh
# signals nothing to a command without a terminal when the link drops or the laptop's ssh ends
# (Ctrl-C), and `docker run` would die only at its next write while the container went on. A
# watcher beside the docker client waits (poll) for the session's end of our stdout to close and
# then removes the container it labelled; when the command ends first, the watcher is ended
# (it must not hold the session's stdout open). $2 is the workdir (host_dirs()[0]).
_WATCH = ('import select, subprocess, sys; p = select.poll(); p.register(1, 0); p.poll(); '
          'f = ["--filter", "label=harness.client=" + sys.argv[1], "--filter", "label=harness.workdir=" + sys.argv[2]]; '
          'ids = subprocess.run(["docker", "ps", "-aq", *f], capture_output=True).stdout.split(); '
          'ids and subprocess.run(["docker", "rm", "-f", *[i.decode() for i in ids]], capture_output=True)')
_MKDIRS_THEN_RUN_WATCHED = ('wd=$2; ' + _MKDIRS_THEN_EXEC.removesuffix('exec "$@"')
                            + 'w=; if command -v python3 >/dev/null 2>&1; then python3 -c \'' + _WATCH + '\' "$$" "$wd" </dev/null 2>/dev/null & w=$!; fi; '
                            + '"$@"; rc=$?; [ -z "$w" ] || kill "$w" 2>/dev/null; exit $rc')


def gpus_flag(gpus: str | int | list[int]) -> list[str]:
    """Config `gpus` -> docker's --gpus argument ([] for none).

    A device list must reach docker's CSV parser as `"device=0,1"` (with the double quotes),
    otherwise the comma splits it into two options.
    """
    if gpus in ("none", 0, []):
        return []
    if gpus == "all":
        return ["--gpus", "all"]
    if isinstance(gpus, int):
        return ["--gpus", str(gpus)]
    return ["--gpus", '"device=' + ",".join(str(i) for i in gpus) + '"']


def gpu_count(gpus: str | int | list[int]) -> int | None:
    """How many GPUs a container gets, or None for "all" (ask the host)."""
    if gpus == "all":
        return None
    if gpus == "none":
        return 0
    return gpus if isinstance(gpus, int) else len(gpus)


class DockerRuntime(Runtime):
    kind = "docker"
    where = "inside the container"
    sees_host_paths = False

    def __init__(self, host: HostConfig, workdir: str | None = None, home: str | None = None, image: str | None = None, *, transport: "Transport | None" = None):
        super().__init__(host, workdir, transport=transport)
        self._home = home
        self.image = image or default_image_ref(host)

    def home_on_host(self, token: str) -> None:
        super().home_on_host(token)
        if self._home is None:
            self._home = token

    def home_is(self, home: str, token: str) -> None:
        super().home_is(home, token)
        if self._home is not None:
            self._home = self._home.replace(token, home)

    @property
    def home(self) -> str:
        """The host user's home: where ~ in configured mounts points (asked on first use)."""
        if self._home is None:
            if self._transport is None:
                raise ValueError(f"{self.host.name}: a runtime without a transport has no home directory")
            self._home = self._transport.home()
        return self._home

    @property
    def python(self) -> str:
        return self.host.container.python

    @property
    def hf_cache(self) -> str:
        """The host directory mounted as the container's Hugging Face cache."""
        return f"{self.home}/.cache/huggingface"

    def host_dirs(self) -> list[str]:
        """Host directories that must exist before a container starts (docker would create
        missing ones owned by root)."""
        dirs = [self.workdir, self.hf_cache, self.container_home]
        if self.host.data_dir:
            dirs.append(self._expand(self.host.data_dir))
        return dirs

    def _expand(self, path: str) -> str:
        return self.home + path[1:] if path == "~" or path.startswith("~/") else path

    def ulimits(self) -> dict[str, int | str]:
        """The --ulimit values containers get (harness.runtime.preflight.ulimits)."""
        return ulimits(self.host.container)

    def run_options(self, options: WrapOptions = WrapOptions()) -> list[str]:
        c = self.host.container
        # --pull=never: a missing image is an error, never a registry pull (harness build makes it)
        opts: list[str] = ["--network=host"] if options.host_network else []
        # --user: the box user's "uid:gid", put in on the host where the argv runs (foreground's
        # shell, runtime/base.py; the supervisor's launch), as the home directory is
        opts += ["--pull=never", "--init", "--user", USER_TOKEN, *(gpus_flag(c.gpus) if options.gpus else []), f"--ipc={c.ipc}", f"--shm-size={c.shm_size}"]
        for name, value in self.ulimits().items():
            opts += ["--ulimit", f"{name}={value}"]
        opts += ["-v", f"{self.workdir}:{self.workdir}", "-w", self.workdir]
        if self.host.data_dir:
            data = self._expand(self.host.data_dir)
            opts += ["-v", f"{data}:{data}"]
        # the cache at its host path: the box user's own files, readable by their tools outside too
        opts += ["-v", f"{self.hf_cache}:{self.hf_cache}", "-e", f"HF_HOME={self.hf_cache}"]
        for mount in c.mounts:
            opts += ["-v", self._expand(mount)]
        # the uid has no home in the image (its HOME would be `/`): one of its own in the workdir
        opts += ["-e", f"HOME={self.container_home}", "-e", "PYTHONUNBUFFERED=1"]
        passed = dict.fromkeys((*self.host.env, *options.env_names))
        opts += [a for name, value in self.cache_env().items() if name not in passed for a in ("-e", f"{name}={value}")]
        for name in passed:
            opts += ["-e", name]  # by name: the value comes from docker's environment
        opts += ["--label", f"{WORKDIR_LABEL}={self.workdir}"]
        for key, value in options.labels:
            opts += ["--label", f"{LABEL_PREFIX}.{key}={value}"]
        if options.name:
            opts += ["--name", options.name]
        return opts

    _foreground_script = _MKDIRS_THEN_RUN_WATCHED

    @property
    def container_home(self) -> str:
        """HOME inside the containers: the tools' dot-files (~/.config, ~/.cache) in the workdir."""
        return f"{self.workdir}/.harness/home"

    def wrap(self, argv: Sequence[str], options: WrapOptions = WrapOptions()) -> list[str]:
        """`docker run --rm` in the foreground: exec, shell, inspect, probes (run through
        foreground(), which puts in the user)."""
        tty = ["-i", "-t"] if options.interactive else ["-i"]
        client = ["--label", f"{CLIENT_LABEL}={CLIENT_TOKEN}"]  # the pid of its docker client, put in on the host
        return ["docker", "run", "--rm", *tty, *self.run_options(options), *client, self.image, *PRIVATE, *argv]

    def exec_in(self, container: str, argv: Sequence[str]) -> list[str]:
        return ["docker", "exec", "-i", container, *argv]

    def create_argv(self, argv: Sequence[str], options: WrapOptions) -> list[str]:
        """`docker create` for a detached job: the supervisor starts it, waits, removes it."""
        return ["docker", "create", *self.run_options(options), self.image, *argv]

    def stage_process(self, argv: Sequence[str], *, run_id: str, stage: str, log_path: str, options: WrapOptions = WrapOptions()) -> dict[str, Any]:
        """A container per stage, labelled with run and stage; the supervisor starts, waits for
        and removes it."""
        name = f"harness-{run_id}-{stage}"
        # The container appends its own output to the stage log (on the mounted workdir), so
        # the log is complete even if the supervisor dies while the container runs.
        inner = ["sh", "-c", 'umask 077; exec "$@" >>"$0" 2>&1', log_path, *argv]  # what it writes: the user's alone
        options = dataclasses.replace(options, labels=(*options.labels, ("run", run_id), ("stage", stage)), name=name)
        return {"kind": self.kind, "container": name, "argv": self.create_argv(inner, options)}

    def image_probes(self) -> list[list[str]]:
        return check_argvs(self)

    def image_record(self, transport: "Transport") -> dict[str, Any]:
        """The image and the versions it recorded at build time, after one throwaway container
        proved it starts with the configured options (one line otherwise: not built, or
        ulimits the engine refuses). Also creates the host directories it mounts."""
        return check_container(transport, self).to_record()

    def configured_gpu_count(self) -> int | None:
        return gpu_count(self.host.container.gpus)

    def install_fix(self) -> str:
        return f"pin the versions in container/requirements.txt and run harness build {self.host.name}"

    def no_gpu_verdict(self, nvidia_smi_found: bool) -> tuple[str, str]:
        # GPUs were asked for: a container without one means the NVIDIA runtime is missing.
        return "fail", "" if nvidia_smi_found else " (the NVIDIA runtime mounts nvidia-smi into GPU containers: is it configured?)"


def default_image_ref(host: HostConfig) -> str:
    """The image jobs use: the last one `harness build` produced on this host."""
    return current_ref(host.container)
