"""Host side of `harness pull` (stdlib only; shipped and started by harness/helpers.py, never imported).

Names travel as JSON (never parsed from shell output); symlinks are reported, never followed.
stdin, after this source: the request, one JSON line (harness/helpers.py), {"mode": MODE, ...}:
  "hash"  the whole-file SHA-256 of the files given, one JSON line per file as it is done.
  "send"  frames on stdout: the laptop's questions (a listing, a small file, which paths exist,
          the newest run, a listener for more streams, a ping) answered in order, then the byte
          ranges it asks for, each piece ended by its CRC-32 (computed while sending) or by a
          frame saying the file changed. A listener on the host's loopback, behind a random
          token, serves the laptop's further streams (`ssh -W` channels) the same way.

The frames and requests in detail: docs/architecture/pull.md, "harness pull, step by step".
"""

import hashlib
import json
import os
import stat
import sys
import zlib

try:  # on the host: shipped ahead of this helper (harness/host_helpers/__init__.py); beside it when run by path
    import wire
except ImportError:  # exec'd on the laptop (tests)
    from harness.host_helpers import wire

FRAME = 1 << 20
TOKEN_BYTES = 32
MOST_CONNECTIONS = 64  # served at once (a pull opens at most its --jobs); more are closed unanswered
TOKEN_TIMEOUT_S = 10  # a connection that sends no token in this time is dropped (ours send it at once)


class FdWriter:
    """Whole writes to a file descriptor (a pipe to sshd, or a forwarded stream's socket)."""

    def __init__(self, fd):
        self.fd = fd
        self.sendfile = hasattr(os, "sendfile")

    def fileno(self):
        return self.fd

    def write(self, data):
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def write_from_file(self, data, src_fd, position):
        """Write data, just read from src_fd at position: through sendfile (the kernel moves the
        file's pages; no copy through this process) while it can, the rest from data (the file
        shrank, or no sendfile here). Bytes that changed since the read fail the piece's hash."""
        done = 0
        while self.sendfile and done < len(data):
            try:
                n = os.sendfile(self.fd, src_fd, position + done, len(data) - done)
            except OSError:
                self.sendfile = False  # e.g. EINVAL where the kernel cannot; a broken pipe fails the write below
                break
            if n == 0:
                break
            done += n
        self.write(memoryview(data)[done:])

    def flush(self):
        pass


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
    header = wire.FRAME_HEADER
    write_all = out.write

    for line in segments:
        rel, piece_start, offset, end, size, mtime_ns = json.loads(line)
        try:
            fd, st = open_regular(root, rel)
        except OSError:
            write_all(header.pack(wire.FRAME_CHANGED, 0))
            continue
        try:
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                write_all(header.pack(wire.FRAME_CHANGED, 0))
                continue
            crc = 0  # CRC-32, not SHA-256: SSH authenticates the bytes in flight; this catches a bad piece (see partfile.py)
            position, short = piece_start, False
            while position < end:
                data = os.pread(fd, min(FRAME, end - position), position)
                if not data:  # the file shrank under us
                    short = True
                    break
                crc = zlib.crc32(data, crc)
                if position + len(data) > offset:
                    skip = max(0, offset - position)
                    sent = memoryview(data)[skip:]
                    write_all(header.pack(wire.FRAME_PIECE, len(sent)))
                    out.write_from_file(sent, fd, position + skip)
                position += len(data)
            after = os.fstat(fd)
            if short or (after.st_size, after.st_mtime_ns) != (size, mtime_ns):
                write_all(header.pack(wire.FRAME_CHANGED, 0))
            else:
                write_all(header.pack(wire.FRAME_CRC, wire.PIECE_CRC.size) + wire.PIECE_CRC.pack(crc))
        finally:
            os.close(fd)


def start_listener():
    """A loopback listener behind a random token, served by a forked process that ends with
    this one; returns the FRAME_LISTENER frame's document ({} where it cannot listen)."""
    import socket  # here, not at the top: most helpers never listen (start-up time)

    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        token = os.urandom(TOKEN_BYTES)
        alive_r, alive_w = os.pipe()  # EOF on alive_r: this helper has ended
        child = os.fork()
    except OSError:
        return {}
    if child == 0:
        try:
            os.close(alive_w)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # the first stream's channel must not wait for the listener
                os.dup2(devnull, fd)
            serve_listener(listener, token, alive_r)
        finally:
            os._exit(0)
    listener.close()
    os.close(alive_r)  # alive_w stays open until this helper exits
    return {"port": port, "token": token.hex()}


def serve_listener(listener, token, alive_r):
    import select

    served = set()  # the processes serving a connection now
    while True:
        ready, _, _ = select.select([listener, alive_r], [], [])
        if alive_r in ready:
            return  # the first stream ended: so does the pull, and the listener
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        for pid in list(served):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    served.discard(pid)
            except ChildProcessError:
                served.discard(pid)
        if len(served) >= MOST_CONNECTIONS:
            conn.close()  # closed unanswered: the pull's stream runs a helper of its own instead
            continue
        try:
            pid = os.fork()
        except OSError:
            conn.close()
            continue
        if pid == 0:
            try:
                listener.close()
                os.close(alive_r)
                serve_connection(conn, token)
            finally:
                os._exit(0)
        served.add(pid)
        conn.close()


def serve_connection(conn, token):
    import hmac

    conn.settimeout(TOKEN_TIMEOUT_S)
    got = b""
    try:
        while len(got) < TOKEN_BYTES:
            chunk = conn.recv(TOKEN_BYTES - len(got))
            if not chunk:
                return
            got += chunk
    except OSError:
        return
    if not hmac.compare_digest(got, token):
        return  # closed unanswered
    conn.settimeout(None)
    serve_send(conn.makefile("rb"), FdWriter(conn.fileno()), listen=False)


READ_MAX = 16 << 20  # a `read` answer: a run record, not a checkpoint


def answer(request, listen):
    """One question before ROOT -> (status, data): wire.FRAME_ANSWER (JSON, or a file's bytes),
    FRAME_ERROR ({"error": why, "missing": bool}), or FRAME_LISTENER."""
    try:
        if "list" in request:  # [PATH, ...]: each PATH's entries, or why not
            docs = []
            for path in request["list"]:
                try:
                    docs.append(do_list(path))
                except OSError as e:
                    docs.append({"error": e.strerror or str(e)})
            return wire.FRAME_ANSWER, json.dumps(docs).encode()
        if "read" in request:
            with open(os.path.expanduser(request["read"]), "rb") as f:
                data = f.read(READ_MAX + 1)
            if len(data) > READ_MAX:
                raise OSError("larger than %d bytes" % READ_MAX)
            return wire.FRAME_ANSWER, data
        if "exists" in request:  # [PATH, ...] -> those that exist (links followed, as `test -e`)
            return wire.FRAME_ANSWER, json.dumps([p for p in request["exists"] if os.path.exists(os.path.expanduser(p))]).encode()
        if "newest_run" in request:
            return wire.FRAME_ANSWER, json.dumps(wire.newest_run(os.path.expanduser(request["newest_run"]))).encode()
        return wire.FRAME_LISTENER, json.dumps(start_listener() if listen and request.get("listen") else {}).encode()
    except OSError as e:
        return wire.FRAME_ERROR, json.dumps({"error": e.strerror or str(e), "missing": isinstance(e, FileNotFoundError)}).encode()


def serve_send(stdin, out, listen):
    """The `send` protocol over stdin/out: the ready frame, questions and pings, ROOT, segments."""
    out.write(wire.FRAME_HEADER.pack(wire.FRAME_READY, 0))  # ready: the laptop times its first request from here
    first = stdin.readline()
    while first.strip() == b"null" or first.startswith(b"{"):
        if first.startswith(b"{"):
            status, data = answer(json.loads(first), listen)
            out.write(wire.FRAME_HEADER.pack(status, len(data)) + data)
        else:  # a ping: answer at once
            out.write(wire.FRAME_HEADER.pack(wire.FRAME_READY, 0))
        first = stdin.readline()
    if first:
        do_send(os.path.realpath(os.path.expanduser(json.loads(first))), stdin, out)


def main():
    request = json.loads(sys.stdin.buffer.readline())  # the request line (harness/helpers.py); a `send` stream follows
    mode = request["mode"]
    out = sys.stdout.buffer
    if mode == "hash":
        do_hash(os.path.realpath(os.path.expanduser(request["root"])), request["rels"], out)
    elif mode == "send":
        try:  # Linux: a 1 MiB pipe to sshd takes a whole frame per write (fewer switches between us and sshd)
            import fcntl

            fcntl.fcntl(out.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), FRAME)
        except (ImportError, OSError):
            pass
        serve_send(sys.stdin.buffer, FdWriter(out.fileno()), listen=True)
    out.flush()


main()
