"""harness.toml -> a typed, validated `Config`.

Every problem is one `ConfigError` naming the file, the dotted key and what was expected, e.g.
`harness.toml: hosts.gpu.container.shm_size: expected a string like "16g", got 16`.

The schema lives in the dataclasses below: each field's type annotation is what the TOML value
must be, so adding an option is adding a field (with a default and a comment).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

from harness.config_discovery import ConfigNotFound, discover
from harness.errors import ConfigError, UsageError, did_you_mean
from harness.stages import STAGES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG_NAME = "harness.toml"
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SIZE_RE = re.compile(r"^\d+[bkmgBKMG]?$")
# Other spellings a [hosts.NAME] table accepts, each for the documented key it stands for.
HOST_KEY_ALIASES = {"keepalive_s": "keepalive"}


@dataclass(frozen=True)
class ContainerConfig:
    """How stages run inside Docker on a host whose runtime is "docker"."""

    image: str = "harness-eagle3"  # repository name; the tag is a content hash of container/
    base_image: str = "vllm/vllm-openai:v0.33.0"  # build argument BASE_IMAGE
    dockerfile: str = "container/Dockerfile"
    gpus: Union[str, int, list[int]] = "all"  # "all", a count, or a list of device indices
    shm_size: str = "16g"  # the container's own /dev/shm (with ipc = "private": void under "host")
    # "private": the container's own IPC namespace, so no other uid's shared memory is in reach;
    # "host" only where containers must share memory with the host (docs/security.md)
    ipc: str = "private"
    build_network: str = "default"  # docker build --network: "host" for a proxy on the box's loopback
    mounts: list[str] = field(default_factory=list)  # "host_path:container_path[:ro]"
    ca_bundle: str = ""  # host path of an extra CA bundle (TLS-inspecting proxies); "" for none
    build_args: dict[str, str] = field(default_factory=dict)
    python: str = "python3"  # interpreter inside the image
    # docker --ulimit NAME=VALUE (-1: unlimited), merged over these defaults: memlock unlimited
    # (NCCL/RDMA), 64 MiB stack. An engine that may not raise the host's hard limit (unprivileged)
    # needs a value within it.
    ulimits: dict[str, int] = field(default_factory=lambda: {"memlock": -1, "stack": 67108864})


@dataclass(frozen=True)
class HostConfig:
    """One machine. Exactly one of `ssh` or `local = true`."""

    name: str = ""
    ssh: str = ""  # "user@host:port", "host", or an alias from ~/.ssh/config
    local: bool = False
    workdir: str = "~/harness"  # where synced code, runs and outputs live on the host
    runtime: Literal["docker", "host"] = "host"
    python: str = "python3"  # interpreter on the host (runtime = "host")
    env: list[str] = field(default_factory=list)  # names passed through; values never stored
    identity_file: str = ""  # extra key file (in addition to ~/.ssh/config and the agent)
    connect_timeout: float = 10.0
    # seconds between keepalives on a silent link; 3 unanswered: the link is declared dead (a
    # stalled link, a box that vanished) and the command says so instead of waiting forever
    keepalive: int = 15
    data_dir: str = ""  # where large outputs go if not under workdir
    # runtime = "host": the GPU indices everything the harness runs there may use (its
    # CUDA_VISIBLE_DEVICES), e.g. one node per GPU of a shared box; []: what the host's own
    # environment allows. Containers take theirs from container.gpus.
    gpus: list[int] = field(default_factory=list)
    container: ContainerConfig = field(default_factory=ContainerConfig)

    @property
    def is_local(self) -> bool:
        return self.local

    @property
    def uses_image(self) -> bool:
        """The stages run in an image `harness build` makes, on the host's container engine."""
        return self.runtime == "docker"

    def pinned_gpus(self) -> list[int]:
        """The GPU indices the stages are pinned to ([] when not pinned to a list): the run
        queue's set. Containers take theirs from container.gpus."""
        if self.uses_image:
            return list(self.container.gpus) if isinstance(self.container.gpus, list) else []
        return list(self.gpus)

    def pinned_to(self, gpu: int) -> "HostConfig":
        """This host with its stages pinned to one GPU (the run queue's set), by its runtime's
        setting (a sweep's trial)."""
        if self.uses_image:
            return dataclasses.replace(self, container=dataclasses.replace(self.container, gpus=[gpu]))
        return dataclasses.replace(self, gpus=[gpu])

    def runtime_label(self) -> str:
        """The runtime in one cell (`harness hosts`)."""
        return f"docker ({self.container.image})" if self.uses_image else self.runtime

    def env_values(self) -> dict[str, str]:
        """Values of the `env` names from this process's environment: held in memory, handed to
        the transport, never written to a file or a command line."""
        return {name: os.environ[name] for name in self.env if name in os.environ}

    def to_record(self) -> dict[str, Any]:
        """The resolved host for a run record or `harness hosts --json`. Build-argument values
        may carry tokens (a private index URL), so only their names are kept; `env` holds names."""
        record = dataclasses.asdict(self)
        record["container"]["build_args"] = sorted(self.container.build_args)
        return record


@dataclass(frozen=True)
class GroupConfig:
    """Several hosts used as one (multi-node torchrun, parallel sync/build)."""

    name: str = ""
    hosts: list[str] = field(default_factory=list)
    rdzv_port: int = 29500  # torchrun's rendezvous port on the first host (the watchdogs use +1)
    rdzv_host: str = ""  # address the other nodes use to reach the first; default: its ssh host
    nproc_per_node: int = 0  # processes per host under torchrun; 0: the host's GPU count (at least 1)
    watchdog_timeout: float = 60.0  # a node silent this long (or failed) stops the others (see harness/multinode.py)


@dataclass(frozen=True)
class SyncConfig:
    """What `harness sync` pushes (paths relative to the config file's directory)."""

    paths: list[str] = field(default_factory=lambda: ["remote_scripts", "container", "harness.toml"])
    exclude: list[str] = field(default_factory=list)  # gitignore-style patterns


@dataclass(frozen=True)
class PipelineConfig:
    """The EAGLE-3 pipeline. Paths are on the host, relative to the workdir unless absolute.

    `stages.<name>` tables hold extra command-line options passed to that stage's script,
    e.g. `[pipeline.stages.train] epochs = 20` becomes `--epochs 20`.
    """

    verifier: str = "outputs/tiny-verifier"
    data: str = "outputs/chat.jsonl"
    output_dir: str = "outputs"
    max_seq_len: int = 256  # prepare's limit of a row's tokens; 0: sized to the data (the longest row, up to 4096)
    target_layer_ids: list[int] = field(default_factory=list)  # empty: [2, N//2, N-3]
    speculative_tokens: int = 3
    # Let transformers run code shipped with the verifier (config/tokenizer `auto_map`, e.g.
    # Kimi-K2.5's tiktoken tokenizer) in every stage that loads the verifier or its tokenizer.
    trust_remote_code: bool = False
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepConfig:
    """`harness sweep HOST` (harness/sweep.py, docs/sweep.md): train recipes tried on the same
    prepared data and hidden states, chosen by tau on the selection split."""

    # [sweep.grid.train] lr = [1e-3, 3e-4]: every combination of the values is a trial
    grid: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    split: str = "selection"  # the rows trials are measured on (the test split, "heldout", only reports)
    gpus: list[int] = field(default_factory=list)  # trials spread one per GPU over these; []: the host's
    per_gpu: int = 1  # trials at once on each GPU (small drafts leave a GPU mostly idle)


@dataclass(frozen=True)
class Config:
    path: Path
    hosts: dict[str, HostConfig]
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    sync: SyncConfig = field(default_factory=SyncConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    # `harness run --set STAGE.FLAG=VALUE`: this invocation's values over [pipeline.stages.*]
    # (already in pipeline.stages; kept here to be recorded in run.json)
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        """Directory the config lives in: sync paths are relative to it."""
        return self.path.parent

    def sync_paths(self) -> list[str]:
        """What a sync pushes: the [sync] paths, and the config file itself (it may have another
        name than harness.toml) when it is a file (the demo's config is made in memory)."""
        paths = list(self.sync.paths)
        if self.path.is_file() and self.path.name not in paths:
            paths.append(self.path.name)
        return paths

    def hosts_json(self) -> dict[str, Any]:
        """`harness hosts --json`: every host (HostConfig.to_record) and group as configured."""
        return {"config": str(self.path), "hosts": {n: h.to_record() for n, h in self.hosts.items()},
                "groups": {n: dataclasses.asdict(g) for n, g in self.groups.items()}}

    def host(self, name: str) -> HostConfig:
        if name in self.hosts:
            return self.hosts[name]
        if name in self.groups:  # a command of one host (exec, shell, inspect, pull, ...) given a group
            raise UsageError(f"{name} is a group ({', '.join(self.groups[name].hosts)}): this command takes one host; name one of them")
        raise self.unknown_host(name, list(self.hosts), or_group=False)

    def targets(self, name: str) -> list[HostConfig]:
        """A host name or a group name -> the hosts it stands for, in order."""
        if name in self.groups:
            return [self.host(h) for h in self.groups[name].hosts]
        if name in self.hosts:
            return [self.hosts[name]]
        raise self.unknown_host(name, [*self.hosts, *self.groups], or_group=True)

    def unknown_host(self, name: str, known: list[str], or_group: bool) -> UsageError:
        """A HOST that names nothing configured: the near match, else what is configured."""
        close = did_you_mean(name, known)
        what = f"{self.path}: unknown host or group {name!r}" if or_group else f"{self.path}: unknown host {name!r}"
        return UsageError(what, close or (f"configured: {', '.join(sorted(known))}" if known else "add a [hosts.NAME] table: `harness init` writes a starter"))


# ---------------------------------------------------------------------------------------------
# Loading and validation


def find_config(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The config a command uses: --config, else $HARNESS_CONFIG, else the first harness.toml
    in the current directory or above it (like git; harness.config_discovery)."""
    try:
        return Path(discover(os.fspath(explicit) if explicit else None))
    except ConfigNotFound as e:
        raise UsageError(str(e)) from None


def load_config(explicit: str | os.PathLike[str] | None = None) -> Config:
    path = find_config(explicit)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(str(path), "(syntax)", f"invalid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "(encoding)", "expected UTF-8 text") from None
    return parse_config(raw, path)


def parse_config(raw: dict[str, Any], path: Path) -> Config:
    file = str(path)
    _reject_unknown(file, "", raw, {"hosts", "groups", "sync", "pipeline", "sweep"})
    hosts_raw = raw.get("hosts", {})
    _expect(file, "hosts", hosts_raw, dict, "a table of [hosts.NAME] tables")
    hosts: dict[str, HostConfig] = {}
    for name, table in hosts_raw.items():
        key = f"hosts.{name}"
        if not HOST_NAME_RE.match(name):
            raise ConfigError(file, key, "host names are letters, digits, '.', '_' and '-'")
        _expect(file, key, table, dict, "a table")
        host = dataclasses.replace(_build(HostConfig, _unalias(file, key, table, HOST_KEY_ALIASES), file, key), name=name)
        _validate_host(file, key, host)
        hosts[name] = host

    groups: dict[str, GroupConfig] = {}
    groups_raw = raw.get("groups", {})
    _expect(file, "groups", groups_raw, dict, "a table of [groups.NAME] tables")
    for name, table in groups_raw.items():
        key = f"groups.{name}"
        _expect(file, key, table, dict, "a table")
        group = dataclasses.replace(_build(GroupConfig, table, file, key), name=name)
        if name in hosts:
            raise ConfigError(file, key, "a group cannot have the name of a host")
        if not group.hosts:
            raise ConfigError(file, f"{key}.hosts", "expected at least one host name")
        for h in group.hosts:
            if h not in hosts:
                raise ConfigError(file, f"{key}.hosts", f"unknown host {h!r} (configured: {', '.join(sorted(hosts)) or 'none'})")
        if len(set(group.hosts)) != len(group.hosts):
            raise ConfigError(file, f"{key}.hosts", "a host appears twice")
        groups[name] = group

    sync = _build(SyncConfig, raw.get("sync", {}), file, "sync")
    for p in sync.paths:
        if os.path.isabs(p) or ".." in Path(p).parts:
            raise ConfigError(file, "sync.paths", f"expected paths inside the project, got {p!r}")
    pipeline = _build(PipelineConfig, raw.get("pipeline", {}), file, "pipeline")
    if pipeline.max_seq_len < 0 or pipeline.max_seq_len == 1:
        raise ConfigError(file, "pipeline.max_seq_len", f"expected 0 (sized to the data by prepare) or at least 2 tokens, got {pipeline.max_seq_len}")
    from harness.stage_options import check_stage_tables  # deferred: start-up (argparse, hashlib: only where a config is read)

    scripts = {n: s.script for n, s in STAGES.items()}
    check_stage_tables(pipeline.stages, path, scripts)
    sweep = _build(SweepConfig, raw.get("sweep", {}), file, "sweep")
    for stage, axes in sweep.grid.items():
        if stage != "train":
            raise ConfigError(file, f"sweep.grid.{stage}", "a sweep varies train flags only: [sweep.grid.train]")
        for flag, values in axes.items():  # each value as the stage's parser takes it
            for value in values if isinstance(values, list) else [values]:
                check_stage_tables({stage: {flag.replace("-", "_"): value}}, path, scripts, table="sweep.grid")
    return Config(path=path.resolve(), hosts=hosts, groups=groups, sync=sync, pipeline=pipeline, sweep=sweep)


def with_overrides(config: Config, items: list[str]) -> Config:
    """The config with `harness run --set STAGE.FLAG=VALUE` values over its [pipeline.stages.*]
    (VALUE as TOML reads it), each checked by the stage's own parser first (one line, exit 2)."""
    if not items:
        return config
    from harness.stage_options import check_settings, parse_setting, parse_value  # deferred: start-up

    settings: dict[str, dict[str, Any]] = {}
    overrides: dict[str, Any] = {}
    for item in items:
        stage, flag, raw = parse_setting(item)
        settings.setdefault(stage, {})[flag] = overrides[f"{stage}.{flag}"] = parse_value(raw)
    check_settings(settings, config.path, {n: s.script for n, s in STAGES.items()})
    stages = {**config.pipeline.stages}
    for stage, table in settings.items():
        stages[stage] = {**stages.get(stage, {}), **table}
    pipeline = dataclasses.replace(config.pipeline, stages=stages)
    return dataclasses.replace(config, pipeline=pipeline, overrides={**config.overrides, **overrides})


def _validate_host(file: str, key: str, host: HostConfig) -> None:
    if host.local and host.ssh:
        raise ConfigError(file, key, "set either ssh = \"user@host[:port]\" or local = true, not both")
    if not host.local and not host.ssh:
        raise ConfigError(file, key, "expected ssh = \"user@host[:port]\" (or an ~/.ssh/config alias) or local = true")
    for name in host.env:
        if not ENV_NAME_RE.match(name):
            raise ConfigError(file, f"{key}.env", f"expected environment variable names, got {name!r}")
    if host.connect_timeout <= 0:
        raise ConfigError(file, f"{key}.connect_timeout", "expected a positive number of seconds")
    if isinstance(host.keepalive, bool) or not isinstance(host.keepalive, int) or host.keepalive < 1:
        raise ConfigError(file, f"{key}.keepalive", "expected a whole number of seconds >= 1")
    if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in host.gpus) or len(set(host.gpus)) != len(host.gpus):
        raise ConfigError(file, f"{key}.gpus", f"expected distinct GPU indices >= 0, got {host.gpus!r}")
    if host.gpus and host.runtime == "docker":
        raise ConfigError(file, f"{key}.gpus", "applies to runtime = \"host\"; a docker host picks its GPUs with container.gpus")
    c = host.container
    if not SIZE_RE.match(c.shm_size):
        raise ConfigError(file, f"{key}.container.shm_size", f'expected a size like "16g", got {c.shm_size!r}')
    if c.ipc not in ("private", "shareable", "host"):
        raise ConfigError(file, f"{key}.container.ipc", f'expected "private" (the default), "shareable" or "host", got {c.ipc!r}')
    if not HOST_NAME_RE.match(c.build_network):
        raise ConfigError(file, f"{key}.container.build_network", f'expected a docker network name ("default", "host"), got {c.build_network!r}')
    if isinstance(c.gpus, str) and c.gpus not in ("all", "none"):
        raise ConfigError(file, f"{key}.container.gpus", f'expected "all", "none", a count or a list of indices, got {c.gpus!r}')
    if isinstance(c.gpus, int) and c.gpus < 0:
        raise ConfigError(file, f"{key}.container.gpus", "expected a count >= 0")
    for m in c.mounts:
        parts = m.split(":")
        if len(parts) not in (2, 3) or not parts[0] or not parts[1].startswith("/") or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ConfigError(file, f"{key}.container.mounts", f'expected "host_path:/container/path[:ro]", got {m!r}')


def _unalias(file: str, prefix: str, table: dict[str, Any], aliases: dict[str, str]) -> dict[str, Any]:
    """`table` with each alias spelled as the key it stands for; both spellings at once is an error."""
    out = dict(table)
    for alias, key in aliases.items():
        if alias in out:
            if key in out:
                raise ConfigError(file, f"{prefix}.{alias}", f"the same setting as {key}: keep one of them")
            out[key] = out.pop(alias)
    return out


def _reject_unknown(file: str, prefix: str, table: dict[str, Any], allowed: set[str]) -> None:
    for k in table:
        if k not in allowed:
            where = f"{prefix}.{k}" if prefix else k
            close = did_you_mean(k, allowed)
            raise ConfigError(file, where, "unknown key", close or f"expected one of: {', '.join(sorted(allowed))}")


def _expect(file: str, key: str, value: Any, typ: type, what: str) -> None:
    if not isinstance(value, typ):
        raise ConfigError(file, key, f"expected {what}, got {_describe(value)}")


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {value}".lower()
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _build(cls: type, table: Any, file: str, prefix: str) -> Any:
    """Build dataclass `cls` from a TOML table, checking every key and type."""
    _expect(file, prefix, table, dict, "a table")
    hints = typing.get_type_hints(cls)
    # `name` comes from the table's own key ([hosts.NAME]), never from inside the table
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    _reject_unknown(file, prefix, table, set(fields))
    kwargs = {}
    for name, value in table.items():
        key = f"{prefix}.{name}"
        kwargs[name] = _coerce(hints[name], value, file, key)
    return cls(**kwargs)


def _coerce(typ: Any, value: Any, file: str, key: str) -> Any:
    origin = typing.get_origin(typ)
    if dataclasses.is_dataclass(typ):
        return _build(typ, value, file, key)
    if origin is Literal:
        choices = typing.get_args(typ)
        if value not in choices:
            raise ConfigError(file, key, f"expected one of {', '.join(repr(c) for c in choices)}, got {_describe(value)}")
        return value
    if origin is Union:
        for option in typing.get_args(typ):
            try:
                return _coerce(option, value, file, key)
            except ConfigError:
                continue
        names = " or ".join(_type_name(o) for o in typing.get_args(typ))
        raise ConfigError(file, key, f"expected {names}, got {_describe(value)}")
    if origin is list:
        (item,) = typing.get_args(typ)
        _expect(file, key, value, list, f"a list of {_type_name(item)}")
        return [_coerce(item, v, file, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(typ)
        _expect(file, key, value, dict, "a table")
        return {k: _coerce(item, v, file, f"{key}.{k}") for k, v in value.items()}
    if typ is Any:
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(file, key, f"expected a number, got {_describe(value)}")
        return float(value)
    if typ is int and isinstance(value, bool):
        raise ConfigError(file, key, f"expected an integer, got {_describe(value)}")
    if not isinstance(value, typ):
        raise ConfigError(file, key, f"expected {_type_name(typ)}, got {_describe(value)}")
    return value


def _type_name(typ: Any) -> str:
    origin = typing.get_origin(typ)
    if origin is list:
        return f"a list of {_type_name(typing.get_args(typ)[0])}"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(typ, getattr(typ, "__name__", str(typ)))
