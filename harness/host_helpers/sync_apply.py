"""Host side of `harness sync` (stdlib only; shipped and started by harness/helpers.py, never imported).

stdin, after this source: the request, one JSON line {"workdir": WORKDIR} (harness/helpers.py),
then sync's own stream: a JSON header line (roots, upload, delete, drop), one record per file to
write (size, permission bits, content, SHA-256), then a JSON trailer line (the new manifest's
digest). It applies deletions, writes the files and renames the new manifest into place, in an
order that leaves the host consistent wherever it is interrupted. It checks every path again:
the manifest lives on the host and may have been edited.
stdout at the end: one JSON line {"written": n, "deleted": n, "refused": [[path, reason], ...]}.

The stream's format and the order of writes: docs/architecture/sync.md, "harness sync, step by step".
"""

import json
import os
import stat
import sys

try:  # on the host: shipped ahead of this helper (harness/host_helpers/__init__.py); beside it when run by path
    import wire
except ImportError:  # exec'd on the laptop (tests)
    from harness.host_helpers import wire

MANIFEST = wire.MANIFEST_PATH
RECORD = wire.SYNC_RECORD
GONE = wire.SYNC_GONE
BLOCK = 1 << 20
OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def safe_rel(path, roots):
    """A normalized relative path (wire.clean_rel, no `\\` as sync's scan) under one of the
    synced roots, outside .harness/, or None."""
    if wire.clean_rel(path) is None or "\\" in path or path.split("/")[0] == ".harness":
        return None
    if not any(path == r or path.startswith(r + "/") for r in roots):
        return None
    return path


_REAL_DIRS = set()  # parents already checked in this run (a sync touches the same few often)


def parents_are_real_dirs(workdir, rel):
    """True when no directory between workdir and rel is a symlink (nothing escapes the tree)."""
    parent = os.path.dirname(rel)
    if parent in _REAL_DIRS:
        return True
    full = os.path.normpath(os.path.join(workdir, parent))
    if os.path.realpath(full) != full:
        return False
    _REAL_DIRS.add(parent)
    return True


def make_parents(workdir, rel, owned):
    """Create rel's parent directories. A parent that is a file or link sync put there earlier
    (it is in the old manifest) is replaced by a directory; anything else is refused."""
    if os.path.dirname(rel) in _REAL_DIRS:
        return
    parts = rel.split("/")[:-1]
    current = ""
    for part in parts:
        current = part if not current else current + "/" + part
        full = os.path.join(workdir, current)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            os.mkdir(full)
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if current in owned:
            os.unlink(full)
            os.mkdir(full)
            continue
        raise OSError("%s is not a directory and sync did not create it" % current)


def write_json(workdir, rel, data):
    path = os.path.join(workdir, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp-%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, separators=(",", ":")))
    os.replace(tmp, path)


def read_exact(stream, n):
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("the laptop's stream ended early (the sync was interrupted)")
    return data


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def copy_content(stream, size, fd):
    """Move `size` bytes from the stream to fd (None: drop them). They are always consumed, so
    the next record stays in step; returns the first write error instead of raising it."""
    error = None
    left = size
    while left:
        chunk = read_exact(stream, min(left, BLOCK))
        left -= len(chunk)
        if fd is not None and error is None:
            try:
                write_all(fd, chunk)
            except OSError as e:
                error = e
    return error


TMP_PREFIX = ".harness-sync-tmp-"


def create(workdir, rel, owned, make):
    """make(path) creates a file or link under a temporary name in its directory, which the caller
    renames over rel: nothing at the final path is ever half-written (not for a running job, nor
    after this helper is killed mid-file; a symlink there is replaced, never followed). Returns
    (what make returned, the temporary path)."""
    make_parents(workdir, rel, owned)
    if not parents_are_real_dirs(workdir, rel):
        raise OSError("a parent directory is a symlink")
    target = os.path.join(workdir, rel)
    if os.path.isdir(target) and not os.path.islink(target):
        raise OSError("a directory is in the way")
    tmp = os.path.join(os.path.dirname(target), TMP_PREFIX + str(os.getpid()))
    if os.path.lexists(tmp):
        os.unlink(tmp)
    return make(tmp), tmp


def remove_stale_temporaries(workdir, rels):
    """A killed helper's temporary files, in the directories this sync writes to (their writer is
    no longer running)."""
    for directory in {os.path.dirname(os.path.join(workdir, rel)) for rel in rels}:
        if os.path.realpath(directory) != directory:  # through a symlink (or not there): not ours to tidy
            continue
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            pid = name[len(TMP_PREFIX):]
            if name.startswith(TMP_PREFIX) and pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def receive_file(stream, workdir, rel, owned, umask):
    """Read one record and write it; returns its manifest entry, or None when the laptop sent
    GONE. Raises OSError (the record consumed) when the file could not be written; rel None:
    a path outside the synced tree, its record is consumed and refused."""
    size, mode = RECORD.unpack(read_exact(stream, RECORD.size))
    if size == GONE:
        return None
    try:
        if rel is None:
            raise OSError("not a path in the synced tree")
        fd, tmp = create(workdir, rel, owned, lambda path: os.open(path, OPEN_NEW, mode))
    except OSError:
        copy_content(stream, size + 32, None)
        raise
    written = tmp
    error = None
    try:
        if size <= BLOCK:  # the common case: one read for content and hash
            body = read_exact(stream, size + 32)
            try:
                write_all(fd, memoryview(body)[:size])
            except OSError as e:
                error = e
            digest = body[size:]
        else:
            error = copy_content(stream, size, fd)
            digest = read_exact(stream, 32)
        if error is None and mode & umask:
            os.fchmod(fd, mode)  # exactly, whatever the umask
    except BaseException:
        os.close(fd)
        os.unlink(written)  # the stream ended inside it: no partial file stays behind
        raise
    os.close(fd)
    if error is not None:
        os.unlink(written)
        raise error
    os.replace(tmp, os.path.join(workdir, rel))
    return {"kind": "file", "size": size, "mode": mode, "sha256": digest.hex(), "target": ""}


def place_link(workdir, rel, owned, entry):
    _, tmp = create(workdir, rel, owned, lambda path: os.symlink(entry["target"], path))
    os.replace(tmp, os.path.join(workdir, rel))
    return entry


def load_manifest(workdir):
    try:
        with open(os.path.join(workdir, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
        files = data.get("files", {})
        return files if isinstance(files, dict) else {}
    except (OSError, ValueError):
        return {}


def private_workdir(workdir):
    """The workdir, made 0700 (or made so again, when it is ours): the code, data, runs and
    artifacts in it are no other uid's to read, nor its locks to take (docs/security.md)."""
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    st = os.stat(workdir)
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(workdir, 0o700)


def manifest_doc(files, digest):
    # digest: of the canonical file table, computed by the laptop (harness.sync.manifest.manifest_digest)
    return {"version": 1, "digest": digest, "files": files}


def main():
    stream = sys.stdin.buffer
    request = json.loads(stream.readline())  # the request line (harness/helpers.py); the stream follows
    workdir = os.path.normpath(os.path.expanduser(request["workdir"]))
    line = stream.readline()
    if not line.strip():
        return  # nothing to do (a no-op or a dry run): the host is left exactly as it was
    header = json.loads(line)
    os.umask(0o077)  # what it makes (directories, the manifest) is the user's alone; files keep the laptop's bits
    private_workdir(workdir)
    workdir = os.path.realpath(workdir)
    roots = header["roots"]
    upload = header["upload"]
    refused = []

    old = load_manifest(workdir)
    pending = dict(old)
    for path, entry in upload.items():
        pending[path] = dict(entry, sha256="pending")
    write_json(workdir, MANIFEST, manifest_doc(pending, "pending"))

    deleted = 0
    for path in header["delete"]:
        rel = safe_rel(path, roots)
        if rel is None or rel not in old:
            refused.append([path, "not a path sync put on this host"])
            continue
        full = os.path.join(workdir, rel)
        if not parents_are_real_dirs(workdir, rel):
            refused.append([rel, "a parent directory is a symlink"])
            continue
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if stat.S_ISDIR(st.st_mode):
            refused.append([rel, "is a directory now; left in place"])
            continue
        try:
            os.unlink(full)
        except OSError as e:
            refused.append([rel, str(e)])
            continue
        deleted += 1
        # Tidy directories this emptied, up to (not including) the synced root.
        parent = os.path.dirname(rel)
        while parent and parent not in roots:
            try:
                os.rmdir(os.path.join(workdir, parent))
            except OSError:
                break
            parent = os.path.dirname(parent)

    _REAL_DIRS.clear()  # deletions may have removed directories they had checked
    umask = os.umask(0)
    os.umask(umask)
    written = {}
    remove_stale_temporaries(workdir, [rel for rel in (safe_rel(p, roots) for p in upload) if rel])
    for path, entry in upload.items():
        rel = safe_rel(path, roots)
        kind = entry.get("kind") if isinstance(entry, dict) else None
        try:
            if kind == "file":
                got = receive_file(stream, workdir, rel, old, umask)
            elif kind == "link" and rel:
                got = place_link(workdir, rel, old, entry)
            else:
                raise OSError("unexpected entry")
        except OSError as e:
            refused.append([path, str(e)])
            continue
        if got is not None:
            written[rel] = got
    trailer = json.loads(stream.readline())

    gone = set(header["delete"]) | set(header["drop"])
    final = {p: e for p, e in old.items() if p not in gone}
    final.update(written)
    digest = trailer["digest"] if not refused else "incomplete"
    for path, _reason in refused:
        # What was not written is not ours in its new version: keep it marked for re-sending.
        if path in final:
            final[path] = dict(final[path], sha256="pending")
    write_json(workdir, MANIFEST, manifest_doc(final, digest))
    sys.stdout.write(json.dumps({"written": len(written), "deleted": deleted, "refused": refused}) + "\n")


main()
