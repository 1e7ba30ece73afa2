"""What harness left on a host's engine that nothing uses any more: `harness gc HOST`'s part on the
engine (harness.cleanup is its part in the workdir): containers a crash left, and old image tags.

A container a crash left: one labelled with this host's workdir (every container harness starts
is) whose command is gone: a foreground one (exec, shell, a server: label harness.client, the pid
of its client's shell on the host) whose client no longer runs, or a stage's (label harness.run)
whose run is neither queued nor running (its supervisor removes it otherwise).

An old tag is one of the configured image's repository that harness built (it carries the
`harness.content-hash` label every build puts on), other than the tag the configuration builds
now (of every host of the config naming the same image), the image `:latest` names (jobs, shells
and exec start from it) and an image a container was made from (a running or queued stage's:
the engine would refuse anyway). Never an image harness did not build, never another repository.
Removal is `docker rmi` without force, by tag: an image that keeps another tag is only untagged.

The bytes are what the engine would free: the layers of the removed images that no image left on
the engine holds, each layer's size read from the classic builder's intermediate images (an image
per step, each `Size` the sum of its layers).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.config import Config, HostConfig
from harness.errors import RemoteCommandError, UsageError
from harness.runtime.image import current_inputs, current_ref, image_ref

if TYPE_CHECKING:
    from harness.transport.base import Transport

_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # docker's tag grammar: the box's answer is checked
_ID = re.compile(r"sha256:[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")  # a container's name, a run id
BUILT_LABEL = "harness.content-hash"  # every build of harness.runtime.image carries it

# One round trip: the repository's tags harness built, the image :latest names, the images
# containers were made from, then every image on the engine, one line each (for the layers
# others still hold); each part after a line of its own name
_IMAGE_LINE = "[{{json .Id}},{{json .Parent}},{{json .Size}},{{json .RepoTags}},{{json .RootFS.Layers}}]"
_SURVEY = (
    'echo "#tags"; docker images --no-trunc --filter "label=$3" --format "{{.Repository}}:{{.Tag}} {{.ID}}" "$1" || exit; '
    'echo "#latest"; docker image inspect --format "{{.Id}}" "$2" 2>/dev/null; '
    'echo "#used"; docker ps -aq --no-trunc | xargs -r docker inspect --format "{{.Image}}" || exit; '
    f'echo "#images"; docker images -aq --no-trunc | sort -u | xargs -r docker image inspect --format \'{_IMAGE_LINE}\' || exit'
)
# the refs of $@ the engine still has
_STILL_THERE = 'for r do docker image inspect --format x "$r" >/dev/null 2>&1 && echo "$r"; done; exit 0'


@dataclass(frozen=True)
class OldTag:
    ref: str  # repository:tag
    image_id: str
    bytes: int  # what its removal frees (0: the image keeps another tag, or others hold its layers)


def old_tags(transport: "Transport", config: Config, host: HostConfig) -> list[OldTag]:
    """The configured image's tags harness built that no configuration or container uses."""
    repo = host.container.image
    try:
        keep = {image_ref(host.container, current_inputs(transport, config, host).content_hash)}
    except UsageError:  # no build context here (no container/): the current tag is unknown, so none is old
        return []
    for other in config.hosts.values():  # another host of the config with the same image: its current tag too
        if other.name != host.name and other.uses_image and other.container.image == repo:
            try:
                keep.add(image_ref(other.container, current_inputs(transport, config, other).content_hash))
            except (UsageError, OSError):  # e.g. its CA bundle is not on this box: not this box's image
                pass
    result = transport.run(["sh", "-c", _SURVEY, "sh", repo, current_ref(host.container), BUILT_LABEL])
    if result.exit_code != 0:
        raise RemoteCommandError("docker images", result.exit_code, result.stderr.decode("utf-8", "replace").strip())
    parts: dict[str, list[str]] = {}
    for line in result.text.splitlines():
        if line.startswith("#"):
            parts[line[1:]] = []
        elif parts:
            parts[list(parts)[-1]].append(line)
    latest = "".join(parts.get("latest", [])).strip()
    used = set(parts.get("used", []))
    tags = [(ref, iid) for ref, iid in (line.split(" ", 1) for line in parts.get("tags", []) if " " in line)
            if ref.startswith(repo + ":") and _TAG.fullmatch(ref[len(repo) + 1:]) and _ID.fullmatch(iid)]
    stale = [(ref, iid) for ref, iid in tags if ref not in keep and iid != latest and iid not in used]
    images = {}
    for line in parts.get("images", []):
        iid, parent, size, repo_tags, layers = json.loads(line)
        images[iid] = {"Parent": parent, "Size": size, "RepoTags": repo_tags, "Layers": layers}
    return [OldTag(ref, iid, freed) for (ref, iid), freed in zip(stale, _freed_bytes(images, {r for r, _ in stale}, [i for _, i in stale]))]


def remove_tags(transport: "Transport", tags: list[OldTag]) -> list[OldTag]:
    """`docker rmi` each tag (no force: the engine keeps an image a container was made from since);
    returns the ones removed."""
    if not tags:
        return []
    refs = [t.ref for t in tags]
    transport.run(["docker", "rmi", *refs])  # one refused leaves the others going
    still = set(transport.run(["sh", "-c", _STILL_THERE, "sh", *refs]).text.split())
    return [t for t in tags if t.ref not in still]


@dataclass(frozen=True)
class LeftContainer:
    container_id: str
    name: str
    why: str  # what shows its command is gone


# Every container labelled with the workdir ($1): id, name, client pid, run, and whether that
# client pid still runs on the host (a zombie no parent reaped yet does not)
_CONTAINERS = ('docker ps -a --no-trunc --filter "label=harness.workdir=$1" '
               '--format "{{.ID}} {{.Names}} {{.Label \\"harness.client\\"}}- {{.Label \\"harness.run\\"}}-" | '
               'while read -r id name client run; do c=${client%-}; a=-; '
               'case $c in ""|*[!0-9]*) ;; *) case $(ps -o stat= -p "$c" 2>/dev/null) in ""|Z*) a=gone;; *) a=alive;; esac;; esac; echo "$id $name $c- $run $a"; done')


def left_containers(transport: "Transport", workdir: str, live_runs: set[str]) -> list[LeftContainer]:
    """The containers labelled with `workdir` whose command is gone (`live_runs`: the runs
    queued or running there, whose stage containers stay)."""
    result = transport.run(["sh", "-c", _CONTAINERS, "sh", workdir])
    if result.exit_code != 0:
        raise RemoteCommandError("docker ps", result.exit_code, result.stderr.decode("utf-8", "replace").strip())
    left = []
    for line in result.text.splitlines():
        words = line.split()
        if len(words) != 5 or not re.fullmatch(r"[0-9a-f]{64}", words[0]):
            continue
        cid, name, client, run, alive = words[0], words[1], words[2].removesuffix("-"), words[3].removesuffix("-"), words[4]
        if not _NAME.fullmatch(name) or not (run == "" or _NAME.fullmatch(run)):
            continue  # not what harness names (the box's answer is checked)
        if client and alive == "gone":
            left.append(LeftContainer(cid, name, f"its command's client (pid {client} on the host) is gone"))
        elif run and not client and run not in live_runs:
            left.append(LeftContainer(cid, name, f"its run {run} is neither queued nor running"))
    return left


def remove_containers(transport: "Transport", containers: list[LeftContainer]) -> list[LeftContainer]:
    """`docker rm -f` each (a running one is killed: its command is gone); returns the ones removed."""
    if not containers:
        return []
    transport.run(["docker", "rm", "-f", *[c.container_id for c in containers]])
    still = set(transport.run(["docker", "ps", "-aq", "--no-trunc", *[a for c in containers for a in ("--filter", f"id={c.container_id}")]]).text.split())
    return [c for c in containers if c.container_id not in still]


def _freed_bytes(images: dict[str, dict[str, Any]], removed_refs: set[str], ids: list[str]) -> list[int]:
    """Per removed tag, the bytes of the layers it alone frees (each layer counted once: under
    the first tag that frees it)."""
    def tags(i: dict[str, Any]) -> set[str]:
        return set(i.get("RepoTags") or [])

    gone = {iid for iid in ids if iid in images and tags(images[iid]) <= removed_refs}
    ancestors: set[str] = set()
    for iid in gone:  # untagged parents `docker rmi` prunes with them
        parent = images[iid].get("Parent")
        while parent and parent in images and not tags(images[parent]):
            ancestors.add(parent)
            parent = images[parent].get("Parent")

    def chain(i: dict[str, Any]) -> tuple[str, ...]:
        return tuple(i.get("Layers") or [])

    held = set()
    for iid, i in images.items():
        if iid not in gone and iid not in ancestors:
            layers = chain(i)
            held.update(layers[:k] for k in range(1, len(layers) + 1))
    size_of = {chain(i): int(i.get("Size") or 0) for i in images.values()}
    counted: set[tuple[str, ...]] = set()
    out = []
    for iid in ids:
        total = 0
        if iid in gone:
            layers = chain(images[iid])
            below = 0  # the size of the last prefix an image of its own names (intermediates)
            for k in range(1, len(layers) + 1):
                prefix = layers[:k]
                if prefix not in size_of:
                    continue  # its bytes are counted with the next prefix that has a size
                if prefix not in held and prefix not in counted:
                    total += max(0, size_of[prefix] - below)
                    counted.add(prefix)
                below = size_of[prefix]
        out.append(total)
    return out
