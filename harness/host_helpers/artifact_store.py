"""The artifact store on the host: each stage's output kept under a key made of everything that
determines it, and reused only when all of that is the same (Nextflow's task hash, Bazel's
action key). Shipped with the supervisor (harness/host_helpers/__init__.py: COMPANIONS);
standard library only.

    <store>/<stage>/<key>/       the stage's --output directory (made by the stage)
    <store>/<stage>/<key>.json   the artifact's record, written last: the artifact is complete
    <store>/<stage>/<key>.lock   flock, held by the run making it and by its stage's process

A key is the SHA-256 of: the stage, its resolved flags, the keys of the artifacts it reads, the
identity of each input from outside the store (identify()), the code that runs (the script and
the modules of remote_scripts/ it imports), the stage environment (the image, or the library
versions), the number of processes, and a `fresh` nonce when asked. What goes in and why:
docs/architecture/artifacts.md, "Artifacts and their keys".
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat

if globals().get("__package__"):  # imported as harness.host_helpers.artifact_store (tests)
    from harness.host_helpers import wire
else:  # on the host: registered ahead of this companion (harness/host_helpers/__init__.py)
    import wire

FORMAT = 1  # of the key's parts: a change here is a change of every key
KEY_CHARS = 20  # of the SHA-256 in hex, as the artifact's name (80 bits)
KEY_RE = re.compile(r"^[0-9a-f]{%d}$" % KEY_CHARS)
STAGE_RE = re.compile(r"^[a-z][a-z_]{0,31}$")
SMALL_FILE = 1 << 20  # a file in an input directory up to this size is identified by its content
HEADER_LIMIT = 100 << 20  # a safetensors header larger than this is no header
DIGESTS_KEPT = 20000  # entries of the digest cache


def digest(data) -> str:
    """SHA-256 of canonical JSON."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_json(path: str, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def write_json(path: str, data) -> None:
    """Atomically (a temporary name, then rename), private to the user."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def private_dirs(path: str) -> None:
    """Make `path` and any missing parent, each new one 0700 (os.makedirs gives the parents the umask's mode)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass


# ---------------------------------------------------------------------------------------------
# What an input from outside the store is


class Digests:
    """File content digests, kept in <workdir>/.harness/digests.json by (device, inode, size,
    mtime): a data file of several GB is read once, not at every stage start."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, ".harness", "digests.json")
        table = read_json(self.path, {})
        self.table = table if isinstance(table, dict) else {}
        self.changed = False

    def of(self, path: str) -> str:
        path = os.path.realpath(path)
        st = os.stat(path)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]
        known = self.table.get(path)
        if isinstance(known, list) and known[:4] == stamp:
            return known[4]
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        self.table[path] = [*stamp, h.hexdigest()]
        self.changed = True
        return h.hexdigest()

    def save(self) -> None:
        if not self.changed:
            return
        if len(self.table) > DIGESTS_KEPT:
            self.table = dict(list(self.table.items())[-DIGESTS_KEPT:])
        try:
            private_dirs(os.path.dirname(self.path))
            write_json(self.path, self.table)
            self.changed = False
        except OSError:
            pass  # a cache: the next stage reads the file again


def safetensors_header(path: str) -> str:
    """SHA-256 of a safetensors file's header (its tensors' names, dtypes, shapes and offsets):
    with the size, what a shard is without reading its gigabytes."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= HEADER_LIMIT:
            raise ValueError(f"{path}: not a safetensors file")
        return hashlib.sha256(f.read(size)).hexdigest()


def tree_entry(path: str, digests: Digests) -> str:
    """One file of an input directory: small files by content, safetensors by size and header,
    other large files by size and modification time."""
    size = os.path.getsize(path)
    if size <= SMALL_FILE:
        return "sha256:" + digests.of(path)
    if path.endswith(".safetensors"):
        try:
            return f"safetensors:{size}:{safetensors_header(path)}"
        except (OSError, ValueError):
            pass
    return f"stat:{size}:{os.stat(path).st_mtime_ns}"


def hub_cache() -> str:
    """The Hugging Face hub cache the stages read (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")


def hub_revision(repo_id: str) -> str | None:
    """The commit the box's hub cache holds for `repo_id` (its refs/main), or None."""
    org, _, name = repo_id.partition("/")
    try:
        with open(os.path.join(hub_cache(), f"models--{org}--{name}", "refs", "main"), encoding="utf-8") as f:
            revision = f.read().strip()
    except OSError:
        return None
    return revision if len(revision) == 40 and all(c in "0123456789abcdef" for c in revision) else None


def tree_files(full: str) -> list[tuple[str, str]]:
    """An input directory's files as its identity counts them, (name relative to it, path): links
    followed (a hub snapshot is links into blobs), hidden names left out, in a stable order."""
    found = []
    for root, dirs, files in os.walk(full, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [(os.path.relpath(os.path.join(root, name), full), os.path.join(root, name)) for name in sorted(files) if not name.startswith(".")]
    return found


def identify(path: str, workdir: str, digests: Digests) -> dict:
    """What an input from outside the store is: a file by its content, a directory by its files
    (tree_entry), a hub id by the revision the box's hub cache holds for it (none yet: the first
    stage that loads it downloads it, and the next key differs)."""
    full = os.path.join(workdir, os.path.expanduser(path))
    if os.path.isfile(full):
        return {"file": digests.of(full)}
    if os.path.isdir(full):
        entries = {name: tree_entry(p, digests) for name, p in tree_files(full)}
        return {"tree": digest(entries), "files": len(entries)}
    if wire.is_hub_id(path):  # a hub id, or a path that no run made yet: either is told apart once it is there
        return {"missing": path, "hub_revision": hub_revision(path)}
    return {"missing": path}


# ---------------------------------------------------------------------------------------------
# The code that runs


def module_file(scripts: str, name: str) -> str | None:
    """The file under remote_scripts/ an absolute import names, or None (a library)."""
    parts = name.split(".")
    for candidate in (os.path.join(scripts, *parts) + ".py", os.path.join(scripts, *parts, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def imported_files(path: str, scripts: str) -> list[str]:
    """The files under `scripts` that one file imports (anywhere in it, functions included)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    here = os.path.dirname(path)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from its own package
                base = here
                for _ in range(node.level - 1):
                    base = os.path.dirname(base)
                package = os.path.relpath(base, scripts).replace(os.sep, ".")
                module = ".".join(p for p in (package, node.module or "") if p and p != ".")
            else:
                module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        for name in names:
            file = module_file(scripts, name) if name else None
            if file:
                found.append(file)
                package_init = os.path.join(os.path.dirname(file), "__init__.py")
                if os.path.dirname(file) != scripts and os.path.isfile(package_init):
                    found.append(package_init)
    return found


def code_identity(workdir: str, script: str, digests: Digests) -> dict:
    """{file: SHA-256} for the stage's script and every module of remote_scripts/ it imports,
    directly or through another (not the whole synced tree: harness.toml is in that)."""
    scripts = os.path.join(workdir, os.path.dirname(script))
    todo, seen = [os.path.join(workdir, script)], {}
    while todo:
        path = todo.pop()
        rel = os.path.relpath(path, workdir)
        if rel in seen:
            continue
        seen[rel] = digests.of(path)
        todo += imported_files(path, scripts)
    return dict(sorted(seen.items()))


def environment_identity(record: dict) -> dict:
    """The stage environment as the run recorded it: the image, else the interpreter's libraries."""
    image = record.get("image") or {}
    if image.get("id"):
        return {"runtime": record.get("runtime"), "image": image["id"]}
    return {"runtime": record.get("runtime"), "versions": record.get("versions")}


# ---------------------------------------------------------------------------------------------
# Keys


class Keys:
    """One run's keys, each computed when first asked for (its inputs as they are then: the
    verifier stage may make them earlier in the same run). `recipes`: run.json's, from the
    laptop (harness/artifacts.py): stage -> {script, flags, reads, paths, processes, fresh}."""

    def __init__(self, workdir: str, record: dict):
        self.workdir = workdir
        self.recipes = record.get("recipes") or {}
        self.store = Store(workdir, record["store"])
        self.environment = environment_identity(record)
        self.digests = Digests(workdir)
        self.parts: dict[str, dict] = {}
        self.keys: dict[str, str] = {}

    def keyed(self, stage: str) -> bool:
        return stage in self.recipes

    def key(self, stage: str) -> str:
        if stage not in self.keys:
            recipe = self.recipes[stage]
            reads = {}
            for flag, upstream in sorted(recipe.get("reads", {}).items()):
                key = self.key(upstream)
                if flag in recipe.get("optional", []) and self.store.record(upstream, key) is None:
                    key = None  # not made: the stage does without it (prepare without regenerate's replies)
                reads[flag] = {"stage": upstream, "key": key}
            parts = {
                "format": FORMAT,
                "stage": stage,
                "flags": recipe.get("flags", {}),
                "reads": reads,
                "inputs": {flag: identify(path, self.workdir, self.digests) for flag, path in sorted(recipe.get("paths", {}).items())},
                "code": code_identity(self.workdir, recipe["script"], self.digests),
                "environment": self.environment,
                "processes": recipe.get("processes", 1),
            }
            if recipe.get("fresh"):
                parts["fresh"] = recipe["fresh"]  # the run's id: a key no other run has
            self.digests.save()
            self.parts[stage] = parts
            self.keys[stage] = digest(parts)[:KEY_CHARS]
        return self.keys[stage]

    def path(self, stage: str) -> str:
        """Where the stage's artifact is, as the stages' command lines name it."""
        return self.store.given(stage, self.key(stage))


class Store:
    """<store>/<stage>/<key>: the artifacts of one workdir (store: relative to it, or absolute)."""

    def __init__(self, workdir: str, root: str):
        self.root_given = root.rstrip("/")
        self.root = os.path.join(workdir, os.path.expanduser(self.root_given))

    def dir(self, stage: str, key: str) -> str:
        return os.path.join(self.root, stage, key)

    def given(self, stage: str, key: str) -> str:
        return f"{self.root_given}/{stage}/{key}"

    def record(self, stage: str, key: str) -> dict | None:
        """The artifact's record when it is complete, else None."""
        record = read_json(self.dir(stage, key) + ".json")
        return record if isinstance(record, dict) and record.get("key") == key and record.get("stage") == stage else None

    def complete(self, stage: str, key: str, record: dict) -> None:
        write_json(self.dir(stage, key) + ".json", {**record, "stage": stage, "key": key})

    def lock(self, stage: str, key: str, holder: str) -> int | None:
        """The artifact's lock, taken (its fd), or None while another holds it. The holder's
        name (a run id) is written in it for whoever waits."""
        private_dirs(os.path.join(self.root, stage))
        fd = os.open(self.dir(stage, key) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        return fd

    def artifacts(self) -> list[tuple[str, str]]:
        """(stage, key) of every artifact in the store, complete or not (its directory or its
        record is there: a lock alone is none); nothing behind a link is looked into."""
        found = set()
        for stage in _real_dirs(self.root):
            if not STAGE_RE.match(stage):
                continue
            for name in os.listdir(os.path.join(self.root, stage)):
                key = name[:-5] if name.endswith(".json") else name
                if KEY_RE.match(key):
                    found.add((stage, key))
        return sorted(found)

    def remove(self, stage: str, key: str) -> int | None:
        """Remove an artifact nobody is making (its lock is taken for the while): the record
        first, so that one removal cut short leaves nothing that claims to be complete, then its
        directory (never through a link). Its bytes, or None when a run holds its lock."""
        fd = self.lock(stage, key, "harness gc")
        if fd is None:
            return None
        try:
            freed = size_of(self.dir(stage, key)) + size_of(self.dir(stage, key) + ".json")
            for path in (self.dir(stage, key) + ".json", self.dir(stage, key)):
                remove_path(path)
            return freed
        finally:
            os.close(fd)  # the lock file stays: a run waiting on it must find the same file

    def busy(self, stage: str, key: str) -> bool:
        """A run holds the artifact's lock (it is being made)."""
        try:
            fd = os.open(self.dir(stage, key) + ".lock", os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def holder(self, stage: str, key: str) -> str:
        try:
            with open(self.dir(stage, key) + ".lock", encoding="utf-8", errors="replace") as f:
                return f.read(200).strip() or "another run"
        except OSError:
            return "another run"


def _real_dirs(path: str) -> list[str]:
    """The names of the directories in `path` (links left out), sorted; none when it is missing."""
    try:
        names = os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if stat.S_ISDIR(os.lstat(os.path.join(path, n)).st_mode))


def size_of(path: str) -> int:
    """Bytes under `path`, links not followed (a link counts as itself)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for root, dirs, files in os.walk(path):  # os.walk follows no links by default
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def remove_path(path: str) -> None:
    """A file, a link (itself) or a directory tree (shutil.rmtree: file descriptors, links never
    followed); a missing one is gone already."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
