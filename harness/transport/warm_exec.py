"""A warm `harness exec`: no click, no harness.toml parsing, no `ssh -G`.

An exec on the slow path (remote_exec.exec_on_host -> openssh_exec.run, which checks everything
and starts the master when needed) leaves a recipe beside the master's socket (`save`): the ssh
command line onto that master, the command line around the user's argv, the env names it passes,
and the stamp of every file the choice was made from (`route`, `code_files`). The next exec of
the same host and config runs from it (`run`) while every stamp holds, the same env names are set
and the master answers; anything else takes the slow path again, which writes a new recipe.
A warm exec should cost little more than `ssh` through a ControlMaster, so `run` and what it
calls import os, marshal and shlex only (with env values: remote_shell.py too).

What a route watches, and which configurations get none: docs/architecture/transport.md, "The warm exec".
"""

from __future__ import annotations

import marshal
import os

from harness.transport import control_dir

FORMAT = 1
MARK = "HARNESS-WARM-EXEC-ARGV"  # stands for the user's argv in a wrapped command line
# A file changed this close to when its content was read may have changed after the read within
# the file system's timestamp granularity (git's "racy" index entries): no recipe then (the next
# exec writes it). Covers coarse kernel clocks (a jiffy) and 2-second file systems.
RACY_NS = 2_000_000_000
# What the slow path reads from the environment on its way to a master (openssh.py).
ENV_INPUTS = ("HOME", "HARNESS_SSH_CONFIG", "HARNESS_KNOWN_HOSTS")


def run(key: str, argv: list[str]) -> int | None:
    """Run argv from the recipe under `key` (the caller's name for host and config) and return
    its exit code, or become ssh and never return; None: no usable recipe, take the slow path."""
    recipe = _load(_recipe_path(key))
    if recipe is None or recipe.get("format") != FORMAT or recipe.get("key") != key:
        return None
    if recipe.get("version") != _version():
        return None  # another harness wrote it: its command line may not be ours
    if recipe["env_inputs"] != [os.environ.get(k) for k in ENV_INPUTS]:
        return None
    if any(_stamp(path) != stamp for path, stamp in recipe["stamps"]):
        return None
    names = [n for n in recipe["env_names_known"] if n in os.environ]
    if names != recipe["env_names"] or not master_answers(recipe["control_path"]):
        return None
    import shlex

    ssh_argv = [*recipe["ssh"], recipe["head"] + " ".join(shlex.quote(a) for a in argv) + recipe["tail"]]
    prefix = b""
    if names:
        from harness.errors import UsageError
        from harness.transport.remote_shell import env_payload

        try:
            prefix = env_payload({n: os.environ[n] for n in names})
        except UsageError:  # a value no line can carry: the slow path says so in one line
            return None
    # not execvp: when the connection ends under the command, ssh's mux client exits 255 without
    # a word, and this process says what happened (connection_ended)
    code = run_ssh(ssh_argv, prefix)
    if code == 255 and not master_answers(recipe["control_path"]):
        connection_ended(key.rsplit("\0", 1)[-1])
    return code


def connection_ended(host: str) -> None:
    """The one line for an exec whose connection ended under it (its master is gone)."""
    os.write(2, f"harness: error: {host}: the connection ended during the command (the link stalled or dropped, or its "
                f"SSH master was stopped); the command may still be running there\n".encode())


def run_ssh(ssh_argv: list[str], prefix: bytes) -> int:
    """Run an `ssh` command line on this terminal; `prefix` goes to its stdin ahead of ours (env
    values). Returns its exit code (killed by signal N: 128+N, like a shell). posix_spawn, not
    subprocess: the warm exec with env values pays for no import it can avoid."""
    import signal

    if not prefix:
        pid = os.posix_spawnp(ssh_argv[0], ssh_argv, os.environ)
    else:
        read_end, write_end = os.pipe()  # both close-on-exec: ssh gets only its stdin
        if read_end == 0:  # our stdin was closed: dup2(0, 0) would not clear close-on-exec
            os.set_inheritable(0, True)
        pid = os.posix_spawnp(ssh_argv[0], ssh_argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, read_end, 0)])
        os.close(read_end)
        _feed_stdin(write_end, prefix)
    # Ctrl-C: the terminal signals our whole process group, ssh included; OpenSSH then closes
    # the session. We only wait for ssh's exit code.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGINT, previous)
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _feed_stdin(fd: int, prefix: bytes) -> None:
    """Env lines first, then our own stdin as it comes (like `ssh host cmd`), then EOF."""
    try:
        _write_all(fd, prefix)
    except OSError:  # ssh ended before reading: its exit code says why
        os.close(fd)
        return
    import threading

    threading.Thread(target=_copy, args=(0, fd), daemon=True).start()


def _copy(source: int, fd: int) -> None:
    try:
        while chunk := os.read(source, 65536):
            _write_all(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def master_answers(control_path: str | None) -> bool:
    """A master listens on the socket (a socket file whose master is gone refuses)."""
    if not control_path:
        return False
    # _socket, the C module under socket.py: socket.py builds four enum classes on import
    # (a measurable share of a warm exec: docs/architecture/measurements.md, "Choices made by measurement")
    import _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(control_path)
    except OSError:
        return False
    finally:
        s.close()
    return True


# ---------------------------------------------------------------------------------------------
# The slow path's side: what a route is, and writing the recipe


def route(o) -> tuple[list[str], str, list[str]] | None:
    """(ssh argv onto the master, its control path, files to watch) for OpenSSHOptions o, or
    None where no warm route is safe."""
    import re

    from harness.transport import openssh

    if o.accept_new_host_key:
        return None  # a warm exec never records a key: only strict options are reused
    dynamic = re.compile(r"^\s*(match\b.*\b(exec|localnetwork|canonical|final)\b|canonicalizehostname\s*=?\s*(yes|always)\b)|\$\{",
                         re.IGNORECASE | re.MULTILINE)
    include = re.compile(r"^\s*include\s*=?\s*(.+)$", re.IGNORECASE | re.MULTILINE)
    glob = re.compile(r"[*?\[]")
    reading = openssh.read_config(o)
    if not reading.files:
        return None  # an ssh that does not say what it read (it reads at least our `ssh -F` file)
    watched: list[str] = []
    ours = control_dir.ensure()  # recipes and logs come and go there; its `ssh -F` file is named by its content
    for path in reading.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return None
        globbed_dirs = [w for line in include.findall(text) for w in line.split() if glob.search(os.path.dirname(w))]
        if dynamic.search(text) or globbed_dirs:
            return None
        watched.append(path)
        if os.path.dirname(path) != ours:
            watched.append(os.path.dirname(path))
    for pattern in reading.unmatched_includes:
        pattern = os.path.expanduser(pattern)
        watched.append(os.path.dirname(pattern) if glob.search(pattern) else pattern)
    watched += [os.path.expanduser("~/.ssh/config"), openssh.SYSTEM_SSH_CONFIG]
    watched += [os.path.expanduser(p) for k in openssh.KNOWN_HOSTS_KEYS for p in reading.values.get(k, ())]
    opts = openssh.with_control_path(o)
    assert opts.control_path
    return openssh.command_argv(opts, None, control_master="no"), opts.control_path, list(dict.fromkeys(watched))


def save(key: str, route: tuple[list[str], str, list[str]], *, also_watch: list[str], wrapped_mark: str, env_names_known: list[str],
         env_names: list[str], started_ns: int) -> bool:
    """Write the recipe of a slow exec that just ran. wrapped_mark: the remote command line it
    would send for argv [MARK]; started_ns: when this process began reading its inputs
    (time.time_ns()). Returns whether a recipe was written (a racy input: not)."""
    ssh_argv, control_path, watched = route
    quoted = wrapped_mark.split(MARK)
    path = _recipe_path(key)
    if len(quoted) != 2 or path is None:
        return False
    stamps = [(p, _stamp(p)) for p in dict.fromkeys([*also_watch, *watched, *code_files()])]
    ours = control_dir.path() + os.sep  # the `ssh -F` file there is named by its content: no edit can go unseen
    if any(s is not None and max(s[3], s[4]) >= started_ns - RACY_NS and not p.startswith(ours) for p, s in stamps):
        forget(key)
        return False
    recipe = {"format": FORMAT, "key": key, "version": _version(), "env_inputs": [os.environ.get(k) for k in ENV_INPUTS], "stamps": stamps,
              "control_path": control_path, "ssh": ssh_argv, "head": quoted[0], "tail": quoted[1],
              "env_names_known": env_names_known, "env_names": env_names}
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            marshal.dump(recipe, f)
        os.replace(tmp, path)  # readers see the old recipe or the whole new one
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def _version() -> str:
    import harness  # (already imported: this module is harness's)

    return harness.__version__


def code_files() -> list[str]:
    """harness's own files a recipe is made by (the wrapped command line, the ssh line, the
    recipe's form): an upgrade, even one that keeps the version string, replaces or edits one of
    them, and the next exec takes the slow path. (Not their directories: Python's first
    __pycache__ there changes them.)"""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [os.path.join(package, "__init__.py"), os.path.join(package, "remote_exec.py"),
             os.path.join(package, "cli", "warm.py"), os.path.join(package, "cli", "exec_cmds.py")]
    for sub in ("transport", "runtime"):
        directory = os.path.join(package, sub)
        files += sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".py"))
    return files


def forget(key: str) -> None:
    path = _recipe_path(key)
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _recipe_path(key: str) -> str | None:
    """The recipe's file among the control sockets, or None when that directory is not private
    to us (control_dir.is_private; the slow path reports it)."""
    import zlib

    directory = control_dir.path()
    try:
        if not control_dir.is_private(os.lstat(directory)):
            return None
    except OSError:
        return None
    raw = key.encode("utf-8", "surrogateescape")
    return os.path.join(directory, f"exec-{zlib.crc32(raw):08x}-{len(raw)}")


def _load(path: str | None) -> dict | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            recipe = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):  # absent, or written by another Python
        return None
    return recipe if isinstance(recipe, dict) else None


def _stamp(path: str) -> tuple[int, int, int, int, int] | None:
    """What any edit of path changes (the ctime too: a tool that keeps the mtime cannot keep it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
