"""SSHTransport.forward: local ports forwarded by one `ssh -L` process (openssh.forward_argv)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from typing import Sequence

from harness.errors import TransportError, UsageError
from harness.transport import openssh
from harness.transport.base import Forwarding, PortForward, end_by_stdin

# ssh's words when a local port is taken ("bind [127.0.0.1]:8000: Address already in use",
# "cannot listen to port: 8000") and when the remote end refuses a forwarded connection.
_TAKEN = re.compile(r"bind \[?[^\]\s]*\]?:(\d+): Address already in use|cannot listen to port: (\d+)")
_REFUSED = re.compile(r"open failed: (?:connect failed|administratively prohibited): (.*)")


class OpenSSHForwarding(Forwarding):
    def __init__(self, options: openssh.OpenSSHOptions, host_name: str, forwards: Sequence[PortForward]):
        self.host_name = host_name
        self.addresses = [("127.0.0.1", f.local_port) for f in forwards]
        self._closed = False
        self._stderr: list[str] = []
        self._ready = False
        self._proc = subprocess.Popen(openssh.forward_argv(options, forwards), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        # ssh prints nothing on stdout until the remote side says it is ready (every local port bound)
        if self._proc.stdout.readline().decode("utf-8", "replace").strip() != openssh.FORWARD_READY:
            self._proc.wait()
            self._reader.join(5)
            raise self._failure(options)
        self._ready = True

    def _read_stderr(self) -> None:
        last_refusal = None
        for raw in self._proc.stderr:
            line = raw.decode("utf-8", "replace").strip()
            self._stderr.append(line)
            refused = _REFUSED.search(line)
            if self._ready and refused and refused.group(1) != last_refusal:
                # one line per change, not one per browser retry
                last_refusal = refused.group(1)
                sys.stderr.write(f"harness: warning: {self.host_name}: a forwarded connection was refused ({last_refusal}): "
                                 "nothing listens on that port of the host (yet)\n")
                sys.stderr.flush()

    def _failure(self, options: openssh.OpenSSHOptions) -> TransportError | UsageError:
        text = "\n".join(self._stderr)
        taken = _TAKEN.search(text)
        if taken:
            port = taken.group(1) or taken.group(2)
            return UsageError(f"local port {port} is already in use on this machine (pick another: REMOTE_PORT:LOCAL_PORT)")
        return openssh.map_stderr(text, self.host_name, options)

    def wait(self) -> None:
        code = self._proc.wait()
        self._reader.join(5)
        if not self._closed and code != 0:
            text = "\n".join(self._stderr)
            if "Killed by signal 2" in text:  # Ctrl-C reached ssh (same process group) before us
                raise KeyboardInterrupt
            raise TransportError(f"the forwarding connection ended: {openssh.map_stderr(text, self.host_name)}")

    def close(self) -> None:
        self._closed = True
        end_by_stdin(self._proc, 5)  # the remote `cat` ends, then the session and ssh
