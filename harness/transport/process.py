"""RemoteProcess: a command on the host behind one local client process (`ssh` for SSH hosts,
the command itself for this machine), owned by the transport that started it
(Transport.stream / Transport.stream_to).

Callers get the command's stdin and stdout as pipes and nothing else of the client: its stderr is
read here, and `error(what)` turns an exit into the typed error the transport makes of it (an
unknown or changed host key, a refused login, an unreachable host, a refused forward: ssh's own
failures; anything else is the remote command's exit, RemoteCommandError). So no module outside
transport/ builds an ssh command line, starts one, or reads what ssh printed. (Model: dstack's
services/ssh/tunnel.py, one class that builds the command, runs it and maps its stderr.)
"""

from __future__ import annotations

import io
import os
import subprocess
import threading
import time
import weakref
from typing import Callable, Iterator, Sequence

from harness.errors import HarnessError, LinkLostError, RemoteCommandError, TransportError

# (what, exit code, stderr text) -> the typed error: Transport.argv_failure
Classify = Callable[[str, int, str], HarnessError]
StderrLine = Callable[[str], None]

TAIL_LINES = 200  # of stderr kept for the error (a chatty server's log is not all kept)


class RemoteProcess:
    """One started command. stdin/stdout: binary pipes (None where not asked for). Its stderr is
    kept (the last TAIL_LINES lines) and handed line by line to on_stderr_line when given."""

    def __init__(self, argv: Sequence[str], classify: Classify, host_name: str, *, stdin: bool = True, stdout: bool = True,
                 on_stderr_line: StderrLine | None = None, client_log: str | None = None, link_up: Callable[[], bool] | None = None):
        """client_log: a file the client writes its own diagnostics to (`ssh -E`), apart from the
        command's stderr: an exit without them is the command's, whatever its code. It is
        removed once read, or when this object goes. link_up: whether the connection the client
        rode on still stands (its SSH master): a silent 255 after it fell is the link's end, not
        the command's."""
        self.host_name = host_name
        self._classify = classify
        self._client_log = client_log
        self._link_up = link_up
        if client_log is not None:
            weakref.finalize(self, _unlink, client_log)
        self._on_line = on_stderr_line
        self._stderr: list[bytes] = []
        try:
            self._proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                          stdout=subprocess.PIPE if stdout else subprocess.DEVNULL, stderr=subprocess.PIPE, bufsize=0)
        except OSError as e:  # no ssh binary, an unreadable file
            raise TransportError(f"{host_name}: cannot start {argv[0]}: {e.strerror or e}") from None
        self.stdin = _WholeWrites(self._proc.stdin) if self._proc.stdin is not None else None
        self.stdout = self._proc.stdout
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        for raw in io.BufferedReader(self._proc.stderr):  # (the pipe itself is unbuffered: one read per byte)
            self._stderr.append(raw)
            if len(self._stderr) > TAIL_LINES:
                del self._stderr[0]
            if self._on_line is not None:
                self._on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    # -- the process ------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (subprocess.TimeoutExpired after timeout)."""
        return self._proc.wait(timeout)

    def terminate(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()

    def stdout_lines(self) -> Iterator[bytes]:
        """stdout line by line, buffered (stdout itself is an unbuffered pipe: bulk reads)."""
        yield from io.BufferedReader(self.stdout)

    def stderr_text(self, wait_s: float = 5.0) -> str:
        """What it printed on stderr (the last TAIL_LINES lines); complete once it has exited."""
        if self._proc.poll() is not None:
            self._reader.join(wait_s)
        return b"".join(self._stderr).decode("utf-8", "replace")

    def error(self, what: str) -> HarnessError:
        """The typed error for this process's end (waits for it to exit): ssh's own failure where
        the transport recognises one, else RemoteCommandError(what, exit code, stderr)."""
        try:
            code = self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        stderr = self.stderr_text()
        if self._client_log is None:
            return self._classify(what, code, stderr)
        said = self.client_said()
        if code == 255 and said.strip():
            return self._classify(what, code, said + stderr)  # (+ stderr: what the ssh of a ProxyJump hop printed)
        if code == 255 and self._link_up is not None and not self._link_answers():  # a mux client whose master went says nothing
            return LinkLostError(f"the connection ended during {what} (the link dropped, or its SSH master was stopped); "
                                 "what it ran there may still be running", "run the command again once the host answers (`harness doctor HOST`)")
        return RemoteCommandError(what, code, stderr)

    def _link_answers(self) -> bool:
        """link_up, asked again a moment later when it says yes: a master being killed ends its
        clients' sessions before the kernel has closed its listening socket."""
        if not self._link_up():
            return False
        time.sleep(0.5)
        return self._link_up()

    def client_said(self) -> str:
        """What the client process itself logged (client_log), "" where it has none."""
        if self._client_log is None:
            return ""
        try:
            with open(self._client_log, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def communicate(self, data: bytes = b"") -> tuple[int, bytes]:
        """Send data, close stdin, read stdout to the end: (exit code, stdout)."""
        if self.stdin is not None:
            try:
                if data:
                    self.stdin.write(data)
                self.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        out = self.stdout.read() if self.stdout is not None else b""
        code = self._proc.wait()
        self._reader.join()
        return code, out or b""

    # -- ending it --------------------------------------------------------------------------------

    def end_by_stdin(self, timeout_s: float) -> None:
        """Close stdin (a remote side that lives while stdin is open then ends: until_stdin_closes),
        wait, terminate if it lingers."""
        if self._proc.poll() is None:
            try:
                if self.stdin is not None:
                    self.stdin.close()
            except OSError:
                pass
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._proc.terminate()
                self._proc.wait()
        self._close_pipes()

    def stop(self) -> None:
        """End it now (terminate: a handshake may still be under way) and close the pipes."""
        self.terminate()
        self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for f in (self.stdin, self.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def __enter__(self) -> "RemoteProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _WholeWrites:
    """An unbuffered pipe whose write() writes all it is given: a raw pipe may take part of a
    write (a signal in the middle), and nothing waits in a buffer (a request is on its way at
    once: pull's streams wait for the answer)."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            n = self.raw.write(view)
            if not n:
                raise BrokenPipeError("the pipe took nothing")
            view = view[n:]
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.raw.close()

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def fileno(self) -> int:
        return self.raw.fileno()
