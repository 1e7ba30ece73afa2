"""Host side of `harness pull` (stdlib only; sent as `python3 -c SOURCE MODE ROOT`, never imported).

Names travel as JSON (never parsed from shell output); symlinks are reported, never followed.

  list ROOT   stdout: one JSON document {"root": realpath, "is_dir": bool, "entries":
              [[rel, type, size, mode, mtime_ns, link_target], ...]}; type is file|link|dir|other.
              When ROOT is a file, root is its directory and the one entry is its name.
  hash ROOT   stdin: JSON list of rel paths. stdout: one JSON line per file as it is done,
              [rel, sha256 or null, size, mtime_ns, error]; size/mtime_ns are taken before and
              checked after hashing (a file being written while hashed reports an error).
  send -      stdin: first line ROOT (JSON string: the stream can start before the listing is
              back), then one JSON segment per line, [rel, piece_start, offset, end, size,
              mtime_ns], read as they come (the laptop keeps a couple in flight). stdout: framed
              bytes, for each segment: frames of (status byte, 8-byte big-endian length, data);
              status 0 = data (the bytes offset..end), 2 = segment complete, its data the SHA-256
              of the whole piece piece_start..end (hashed while sending: no second pass), 1 = file
              changed/missing (segment aborted: its (size, mtime_ns) do not match the listing,
              before or after); one status-3 frame first, as
              soon as the helper runs, and one more for each `null` line before ROOT (a ping: the
              laptop times it, the link's round trip). A {"list": PATH} line before ROOT is
              answered with one frame: status 4 and `list`'s JSON document, or status 5 and the
              error (what `list` exits 3 for): the listing and the first bytes over one connection.
"""

import hashlib
import json
import os
import stat
import struct
import sys

FRAME = 1 << 20


def lstat_entry(full, rel):
    st = os.lstat(full)
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        kind, target = "link", os.readlink(full)
    elif stat.S_ISREG(mode):
        kind, target = "file", ""
    elif stat.S_ISDIR(mode):
        kind, target = "dir", ""
    else:
        kind, target = "other", ""
    return [rel, kind, st.st_size, stat.S_IMODE(mode), st.st_mtime_ns, target]


def do_list(root):
    root = os.path.realpath(os.path.expanduser(root))
    if not os.path.isdir(root):
        entry = lstat_entry(root, os.path.basename(root))  # raises FileNotFoundError
        return {"root": os.path.dirname(root), "is_dir": False, "entries": [entry]}
    entries = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            names = sorted(os.listdir(os.path.join(root, rel_dir) if rel_dir else root))
        except OSError:
            entries.append([rel_dir, "other", 0, 0, 0, ""])
            continue
        for name in names:
            rel = rel_dir + "/" + name if rel_dir else name
            try:
                e = lstat_entry(os.path.join(root, rel), rel)
            except OSError:
                continue  # vanished while listing
            entries.append(e)
            if e[1] == "dir":
                stack.append(rel)
    return {"root": root, "is_dir": True, "entries": entries}


def open_regular(root, rel):
    fd = os.open(os.path.join(root, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError("not a regular file")
    return fd, st


def do_hash(root, rels, out):
    for rel in rels:
        try:
            fd, st = open_regular(root, rel)
            try:
                h = hashlib.sha256()
                while True:
                    chunk = os.read(fd, FRAME)
                    if not chunk:
                        break
                    h.update(chunk)
                after = os.fstat(fd)
            finally:
                os.close(fd)
            if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
                line = [rel, None, after.st_size, after.st_mtime_ns, "changed while hashing"]
            else:
                line = [rel, h.hexdigest(), st.st_size, st.st_mtime_ns, None]
        except OSError as e:
            line = [rel, None, 0, 0, e.strerror or str(e)]
        out.write((json.dumps(line) + "\n").encode())
        out.flush()


def do_send(root, segments, out):
    out_fd = out.fileno()
    header = struct.Struct(">BQ")

    def write_all(data):
        view = memoryview(data)
        while view:
            view = view[os.write(out_fd, view):]

    for line in segments:
        rel, piece_start, offset, end, size, mtime_ns = json.loads(line)
        try:
            fd, st = open_regular(root, rel)
        except OSError:
            write_all(header.pack(1, 0))
            continue
        try:
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                write_all(header.pack(1, 0))
                continue
            h = hashlib.sha256()
            position, short = piece_start, False
            while position < end:
                data = os.pread(fd, min(FRAME, end - position), position)
                if not data:  # the file shrank under us
                    short = True
                    break
                h.update(data)
                if position + len(data) > offset:
                    sent = memoryview(data)[max(0, offset - position):]
                    write_all(header.pack(0, len(sent)))
                    write_all(sent)
                position += len(data)
            after = os.fstat(fd)
            if short or (after.st_size, after.st_mtime_ns) != (size, mtime_ns):
                write_all(header.pack(1, 0))
            else:
                write_all(header.pack(2, 32) + h.digest())
        finally:
            os.close(fd)


def main():
    mode, root = sys.argv[1], sys.argv[2]
    out = sys.stdout.buffer
    if mode == "list":
        try:
            doc = do_list(root)
        except OSError as e:
            sys.stderr.write("%s\n" % (e.strerror or e))
            sys.exit(3)
        out.write(json.dumps(doc).encode())
    elif mode == "hash":
        do_hash(os.path.realpath(os.path.expanduser(root)), json.loads(sys.stdin.buffer.read()), out)
    elif mode == "send":
        try:  # Linux: a 1 MiB pipe to sshd takes a whole frame per write (fewer switches between us and sshd)
            import fcntl

            fcntl.fcntl(out.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), FRAME)
        except (ImportError, OSError):
            pass
        out.write(struct.pack(">BQ", 3, 0))  # ready: the laptop times its first request from here
        out.flush()
        stdin = sys.stdin.buffer
        first = stdin.readline()
        while first.strip() == b"null" or first.startswith(b"{"):
            if first.startswith(b"{"):  # {"list": PATH}: the listing over this stream (one connection, no extra command)
                try:
                    status, data = 4, json.dumps(do_list(json.loads(first)["list"])).encode()
                except OSError as e:
                    status, data = 5, (e.strerror or str(e)).encode()
                out.write(struct.pack(">BQ", status, len(data)) + data)
            else:  # a ping: answer at once
                out.write(struct.pack(">BQ", 3, 0))
            out.flush()
            first = stdin.readline()
        if first:
            do_send(os.path.realpath(os.path.expanduser(json.loads(first))), stdin, out)
    out.flush()


main()
