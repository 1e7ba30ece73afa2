"""LocalTransport: the host is this machine (the embedded default, and GPU boxes driven from
themselves). Same semantics as SSHTransport, with subprocesses instead of channels."""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile
import threading
from typing import Mapping, Sequence

from harness.transport.base import Forwarding, OutputSink, PortForward, RemoteStat, RunResult, Transport
from harness.transport.remote_shell import env_payload


class LocalTransport(Transport):
    def __init__(self, name: str = "local"):
        self.name = name

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        stdout: OutputSink | None = None,
        stderr: OutputSink | None = None,
        timeout: float | None = None,
    ) -> RunResult:
        if env:
            env_payload(env)  # the same rules as SSH (no newline/NUL), so both transports agree
        full_env = {**os.environ, **(env or {})}
        workdir = self.expand(cwd) if cwd else None
        if workdir is not None and not os.path.isdir(workdir):
            return RunResult(2, b"", f"cd: {cwd}: No such file or directory\n".encode())
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=workdir,
                env=full_env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except FileNotFoundError:
            return RunResult(127, b"", f"{argv[0]}: command not found\n".encode())
        except PermissionError:
            return RunResult(126, b"", f"{argv[0]}: permission denied\n".encode())
        captured: dict[str, list[bytes]] = {"out": [], "err": []}

        def pump(stream, sink: OutputSink | None, key: str) -> None:
            # read1 returns what is available, so streamed output arrives live, not in 8 KiB blocks
            while chunk := stream.read1(65536):
                if sink is None:
                    captured[key].append(chunk)
                else:
                    sink(chunk)

        threads = [
            threading.Thread(target=pump, args=(proc.stdout, stdout, "out"), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, stderr, "err"), daemon=True),
        ]
        for t in threads:
            t.start()
        if stdin is not None:
            try:
                proc.stdin.write(stdin)
                proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for t in threads:
            t.join()
        return RunResult(code, b"".join(captured["out"]), b"".join(captured["err"]))

    def run_pty(self, argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> int:
        # This terminal already is a PTY: the child inherits it, and Ctrl-C reaches it directly.
        return subprocess.call(list(argv), cwd=self.expand(cwd) if cwd else None, env={**os.environ, **(env or {})})

    def exec_foreground(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, pty: bool = False) -> int:
        # run_pty inherits this process's stdin/stdout/stderr: exactly what exec wants, PTY or not
        return self.run_pty(argv, env=env)

    def local_argv(self, argv: Sequence[str]) -> list[str]:
        return list(argv)

    def forward(self, forwards: Sequence[PortForward]) -> Forwarding:
        return _Direct([(f.remote_host, f.remote_port) for f in forwards])

    def put_bytes(self, data: bytes, path: str, mode: int | None = None) -> None:
        path = self.expand(path)
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".harness-tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if mode is None:  # like a plainly created file (mkstemp makes 0600)
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get_bytes(self, path: str) -> bytes:
        with open(self.expand(path), "rb") as f:
            return f.read()

    def stat(self, path: str) -> RemoteStat | None:
        import stat as st

        try:
            s = os.lstat(self.expand(path))
        except FileNotFoundError:
            return None
        return RemoteStat(s.st_size, s.st_mode, s.st_mtime, st.S_ISDIR(s.st_mode), st.S_ISLNK(s.st_mode))

    def home(self) -> str:
        return os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir


class _Direct(Forwarding):
    """This machine's ports need no tunnel: the addresses are the remote ones, as they are."""

    def __init__(self, addresses: list[tuple[str, int]]):
        self.addresses = addresses

    def wait(self) -> None:
        threading.Event().wait()  # until Ctrl-C
