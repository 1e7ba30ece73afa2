"""Where the stage interpreter has packages installed (stdlib only; called through
harness/helpers.py: its source and then the request on stdin, run by `python -c BOOT` in the stage environment: inside the container on docker hosts; never imported).

Request (JSON): {"packages": [names], "cache": null | DIR}. Each name is located without importing
it (importlib.util.find_spec of a top-level name runs no package code). With "cache" (docker
hosts: a directory on the mounted workdir), the package's source files are copied there
incrementally (same size and mtime: kept; gone from the package: removed), owned by the workdir's
owner, because the host-side pull helper cannot see into the image.

Answer: one line `MARKER {"ok": true, "packages": [{"name", "kind": "package"|"module",
"roots": [...], "version", "files", "bytes"}]}`, or {"ok": false, "missing": [{"name",
"suggestions"}]} when some name is no importable Python source.
"""

import difflib
import importlib.metadata
import importlib.util
import json
import os
import pkgutil
import shutil
import sys

MARKER = "@@harness-sources@@ "
SUFFIXES = (".py", ".pyi")
MARKERS = ("py.typed",)


def wanted(name):
    return name.endswith(SUFFIXES) or name in MARKERS


def source_files(root):
    """rel -> full path of the source files under a package directory (no __pycache__)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if wanted(name):
                full = os.path.join(dirpath, name)
                if os.path.isfile(full):
                    out[os.path.relpath(full, root)] = full
    return out


def suggestions(name):
    """Import names for a distribution name (scikit-learn -> sklearn), else close module names."""
    try:
        by_module = importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - suggestions are a courtesy
        by_module = {}
    norm = name.lower().replace("_", "-")
    from_dist = sorted(m for m, dists in by_module.items() if any(d.lower().replace("_", "-") == norm for d in dists) and not m.startswith("_"))
    if from_dist:
        return from_dist
    names = {m.name for m in pkgutil.iter_modules()} | set(by_module)
    return difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.7)


def version_of(name):
    try:
        dists = importlib.metadata.packages_distributions().get(name) or []
        return importlib.metadata.version(dists[0]) if dists else None
    except Exception:  # noqa: BLE001
        return None


def locate(name):
    """(kind, [roots]) of a top-level module with Python source, or None."""
    if not name.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package (several roots: a namespace package)
        roots = [os.path.realpath(p) for p in spec.submodule_search_locations if os.path.isdir(p)]
        return ("package", roots) if roots else None
    if spec.origin and spec.origin.endswith(".py") and os.path.isfile(spec.origin):
        return "module", [os.path.realpath(spec.origin)]
    return None  # compiled or built in: no Python source to mirror


class Owner:
    """Files written into the cache belong to the workdir's owner (the container runs as root)."""

    def __init__(self, cache):
        top = os.path.dirname(os.path.dirname(cache))  # <workdir>/.harness/sources -> <workdir>
        st = os.stat(top)
        self.uid, self.gid = st.st_uid, st.st_gid

    def __call__(self, path):
        if os.geteuid() == 0 and (self.uid, self.gid) != (0, 0):
            os.lchown(path, self.uid, self.gid)

    def makedirs(self, path):
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for d in reversed(missing):
            os.mkdir(d)
            self(d)


def copy_if_changed(src, dst, own):
    s = os.stat(src)
    try:
        d = os.stat(dst)
        if (d.st_size, d.st_mtime_ns) == (s.st_size, s.st_mtime_ns):
            return
    except FileNotFoundError:
        pass
    own.makedirs(os.path.dirname(dst))
    tmp = dst + ".harness-tmp"
    shutil.copy2(src, tmp)  # keeps the mtime: the next call sees it unchanged
    own(tmp)
    os.replace(tmp, dst)


def to_cache(name, kind, files, cache, own):
    """Copy the source files (rel -> path) into cache/<name>/ (or cache/<name>.py); returns the
    cache root."""
    if kind == "module":
        dst = os.path.join(cache, name + ".py")
        copy_if_changed(next(iter(files.values())), dst, own)
        return [dst]
    dst_root = os.path.join(cache, name)
    for rel, full in files.items():
        copy_if_changed(full, os.path.join(dst_root, rel), own)
    for rel in set(source_files(dst_root)) - set(files):  # gone from the package
        os.unlink(os.path.join(dst_root, rel))
    own.makedirs(dst_root)
    return [dst_root]


def main(request):
    if "" in sys.path:
        sys.path.remove("")  # the workdir (cwd) is not where packages are installed
    found, missing = [], []
    for name in request["packages"]:
        where = locate(name)
        if where is None:
            missing.append({"name": name, "suggestions": suggestions(name)})
        else:
            found.append((name, *where))
    if missing:
        return {"ok": False, "missing": missing}
    cache = request.get("cache")
    own = None
    if cache:
        own = Owner(cache)
        own.makedirs(cache)
    out = []
    for name, kind, roots in found:
        files = {}
        for root in roots:  # several: a namespace package's portions, merged
            files.update(source_files(root) if kind == "package" else {os.path.basename(root): root})
        if cache:
            roots = to_cache(name, kind, files, cache, own)
        out.append({"name": name, "kind": kind, "roots": roots, "version": version_of(name),
                    "files": len(files), "bytes": sum(os.path.getsize(p) for p in files.values())})
    return {"ok": True, "packages": out}


if __name__ == "__main__":
    print(MARKER + json.dumps(main(json.loads(sys.stdin.read()))), flush=True)  # the request (harness/helpers.py)
