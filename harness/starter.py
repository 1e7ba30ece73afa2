"""`harness init`: the starter harness.toml, filled in from the user's answers.

The text is harness/templates/harness.toml (commented, every section a first session needs:
the host, its container, [pipeline] verifier and data, [sync] paths) with the answers put in as
TOML values. Where each thing lives decides how it reaches the box:
- the pipeline's code (remote_scripts/, container/) sits beside harness.toml in the harness
  checkout and is synced; a config written elsewhere would sync no stage, so init refuses it;
- data given as a file on the laptop must lie under the config's directory: its top directory
  joins [sync] paths and `data` is its relative path, the same on both sides; data not found on
  the laptop is taken as a path on the box;
- the verifier never travels: a hub id or a path on the box.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from string import Template

from harness.config import HOST_NAME_RE, SyncConfig
from harness.errors import UsageError

PLACEHOLDER_SSH = "me@gpu-box.example.com"
DEMO_VERIFIER = "outputs/tiny-verifier"  # what the `verifier` stage builds
DEMO_DATA = "outputs/chat.jsonl"
CODE_DIRS = ("remote_scripts", "container")


@dataclass(frozen=True)
class Answers:
    host: str = "gpu"
    ssh: str = PLACEHOLDER_SSH
    runtime: str = "docker"
    workdir: str = "~/harness"
    verifier: str = DEMO_VERIFIER
    data: str = DEMO_DATA  # as the user gave it: a laptop file (absolute or relative to cwd) or a box path


def ssh_aliases(path: Path | None = None) -> list[str]:
    """The concrete `Host` names of ~/.ssh/config (no patterns), in file order."""
    path = path or Path.home() / ".ssh" / "config"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    names: list[str] = []
    for line in text.splitlines():
        m = re.match(r"\s*Host\s+(.+)", line, re.IGNORECASE)
        if m:
            names += [n for n in m.group(1).split() if not any(c in n for c in "*?!") and n not in names]
    return names


def checkout_root() -> Path | None:
    """The harness checkout this harness runs from (its remote_scripts/ and container/), if any."""
    root = Path(__file__).resolve().parent.parent
    return root if all((root / d).is_dir() for d in CODE_DIRS) else None


def data_setting(data: str, project: Path, cwd: Path) -> tuple[str, str | None]:
    """(`data` as written in the config, the sync path it needs or None).
    A file on the laptop must be under `project`; anything not found here is a box path."""
    local = Path(os.path.expanduser(data))
    local = local if local.is_absolute() else cwd / local
    if not local.exists():
        return data, None
    try:
        rel = local.resolve().relative_to(project.resolve())
    except ValueError:
        raise UsageError(f"--data {data}: a file outside {project} is not synced: copy it under {project} "
                         "(e.g. data/), or give its path on the box") from None
    return rel.as_posix(), rel.parts[0]


def render(answers: Answers, project: Path, cwd: Path) -> str:
    if not HOST_NAME_RE.match(answers.host) or answers.host == "local":
        raise UsageError(f"--host {answers.host!r}: a host name is letters, digits, '.', '_' and '-' (and not 'local')")
    if answers.runtime not in ("docker", "host"):
        raise UsageError(f"--runtime {answers.runtime!r}: expected docker or host")
    data, sync_path = data_setting(answers.data, project, cwd)
    paths = list(SyncConfig().paths) + ([sync_path] if sync_path and sync_path not in SyncConfig().paths else [])
    note = (f"{data} is on this laptop: it is in [sync] paths, so `harness sync`/`run` put it there." if sync_path else
            "A file of yours on the laptop: put it under this directory (data/chat.jsonl) and add \"data\" to [sync] paths.")
    template = Template(files("harness").joinpath("templates/harness.toml").read_text(encoding="utf-8"))
    return template.substitute(host=answers.host, ssh=json.dumps(answers.ssh), runtime=json.dumps(answers.runtime), workdir=json.dumps(answers.workdir),
                               verifier=json.dumps(answers.verifier), data=json.dumps(data), data_note=note,
                               sync_paths=json.dumps(paths))


def write_new(target: Path, text: str, force: bool) -> None:
    """The whole file or nothing at `target`: written beside it, then linked (never replacing one)
    or, with force, renamed over it."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if force:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)  # fails if it exists: no race, nothing replaced
    except FileExistsError:
        raise UsageError(f"{target} already exists; not overwriting it (edit it, or pass --force)") from None
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror}") from None
    finally:
        tmp.unlink(missing_ok=True)


def check_project(directory: Path) -> None:
    """harness.toml belongs beside the code it syncs (remote_scripts/, container/)."""
    missing = [d for d in CODE_DIRS if not (directory / d).is_dir()]
    if missing:
        root = checkout_root()
        where = f": run `harness init` in {root}, or pass --path {root / 'harness.toml'}" if root else ": run `harness init` in the harness checkout"
        raise UsageError(f"{directory} has no {' or '.join(m + '/' for m in missing)} (what sync sends and build builds from){where}")
