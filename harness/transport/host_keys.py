"""The one host-key decision, for both SSH clients: `decide`.

A recorded key -> KNOWN; keys recorded for the name but not this one (or of no recorded type) ->
CHANGED, always refused; @revoked -> REVOKED; nothing recorded -> UNKNOWN, refused with one line
naming the key's type and SHA256 fingerprint and the flag that records it (with that flag:
appended to the first user known_hosts file, hashed where HashKnownHosts says -> RECORDED).
Nothing but this function accepts a key: paramiko (transport/ssh.py) loads no host keys and asks
`decide` from its missing-host-key policy; OpenSSH gets no known_hosts files and runs this file as
its KnownHostsCommand (`main`), so it knows only the lines the decision prints; a refusal is one
`MARK` line on ssh's stderr that the transport turns into the same HostKeyError.
docs/architecture/transport.md (transport/, "One reading, one host-key decision") says more. Standard
library only, imported lazily: ssh starts this file twice per connection.
"""

from __future__ import annotations

import binascii
import os
import sys

ACCEPT_FLAG = "--accept-new-host-key"
MARK = "harness-host-key "  # a refusal on the OpenSSH client's stderr: MARK + one JSON object

KNOWN, RECORDED, UNKNOWN, CHANGED, REVOKED, UNREADABLE = "known", "recorded", "unknown", "changed", "revoked", "unreadable"


class KnownHosts:
    """Where one host's keys are looked up (user files, then global ones, in OpenSSH's order) and
    where a key accepted once is recorded (the first user file), hashed or not."""

    __slots__ = ("files", "record_to", "hash_names")

    def __init__(self, files: list[str] | tuple[str, ...], record_to: str, hash_names: bool = False):
        self.files = tuple(files)
        self.record_to = record_to
        self.hash_names = hash_names

    def plan_line(self, name: str) -> str:
        """One line of a plan file (`main` reads it): name ("" for any other), then these fields."""
        fields = [name, "1" if self.hash_names else "0", self.record_to, *self.files]
        if any("\t" in f or "\n" in f for f in fields):
            raise ValueError(f"a known_hosts path or name with a tab or newline: {fields!r}")
        return "\t".join(["host", *fields])

    def __eq__(self, other) -> bool:
        return isinstance(other, KnownHosts) and (self.files, self.record_to, self.hash_names) == (other.files, other.record_to, other.hash_names)

    def __repr__(self) -> str:
        return f"KnownHosts({self.files!r}, {self.record_to!r}, {self.hash_names!r})"


def plan_text(accept_new: bool, default: KnownHosts, hosts: dict[str, KnownHosts]) -> str:
    """What `main` reads: whether an unknown key is recorded, and each name's KnownHosts."""
    lines = [f"accept_new\t{1 if accept_new else 0}", default.plan_line("")]
    lines += [known.plan_line(name.lower()) for name, known in sorted(hosts.items())]
    return "\n".join(lines) + "\n"


def _read_plan(path: str, name: str) -> tuple[bool, KnownHosts]:
    accept_new, default, found = False, None, None
    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            fields = line.split("\t")
            if fields[0] == "accept_new":
                accept_new = fields[1] == "1"
            elif fields[0] == "host" and len(fields) >= 4:
                known = KnownHosts(fields[4:], fields[3], fields[2] == "1")
                if fields[1] == "":
                    default = known
                elif fields[1] == name.lower():
                    found = known
    known = found or default
    if known is None:
        raise ValueError(f"{path}: no default entry")
    return accept_new, known


class Decision:
    """What `decide` says: `accepted`, and for a refusal the one line (message, hint) the
    HostKeyError carries. `lines`: the known_hosts lines the OpenSSH client is to compare with."""

    __slots__ = ("kind", "name", "message", "hint", "lines")

    def __init__(self, kind: str, name: str, message: str = "", hint: str = "", lines: tuple[str, ...] = ()):
        self.kind, self.name, self.message, self.hint, self.lines = kind, name, message, hint, lines

    @property
    def accepted(self) -> bool:
        return self.kind in (KNOWN, RECORDED)

    def error(self, where: str):
        """The HostKeyError of a refusal, for the host named `where` in messages."""
        from harness.errors import HostKeyError

        return HostKeyError(f"{where}: {self.message}", self.hint or None)

    def __repr__(self) -> str:
        return f"Decision({self.kind!r}, {self.name!r}, {self.message!r})"


def fingerprint(key_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob (base64, as in known_hosts)."""
    import hashlib

    digest = hashlib.sha256(binascii.a2b_base64(key_b64)).digest()
    return "SHA256:" + _b64(digest).rstrip("=")


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def known_hosts_name(hostname: str, port: int, alias: str = "") -> str:
    """The name a host's keys are recorded under, as OpenSSH writes it: HostKeyAlias where set,
    else the host name, in brackets with the port where that is not 22."""
    if alias:
        return alias
    return hostname if port in (0, 22) else f"[{hostname}]:{port}"


def decide(known: KnownHosts, name: str, key_type: str, key_b64: str, *, accept_new: bool) -> Decision:
    """THE host-key decision (the module's docstring says what it decides)."""
    try:
        entries = _entries(known, name)
    except OSError as e:
        return Decision(UNREADABLE, name, f"cannot read known_hosts file {e.filename}: {e.strerror or e}; refusing to connect",
                        "make it readable, or point UserKnownHostsFile elsewhere")
    blob = _blob(key_b64)
    revoked = any(marker == "@revoked" and b == blob for marker, _, b, _ in entries)
    recorded = [(t, b, path) for marker, t, b, path in entries if marker == ""]
    if not revoked and blob is not None and any(b == blob for _, b, _ in recorded):
        return Decision(KNOWN, name, lines=(f"{name} {key_type} {key_b64}",))
    got = f"{key_type} {fingerprint(key_b64)}" if blob is not None else f"{key_type} (not a key)"
    if revoked:
        return Decision(REVOKED, name, f"the host key for {name} ({got}) is marked @revoked; refusing to connect",
                        "a revoked key is never accepted: ask the host's administrator")
    if recorded:
        t, b, path = recorded[0]
        return Decision(CHANGED, name,
                        f"the host key for {name} has CHANGED: expected {t} {fingerprint(_b64(b))}, got {got}; refusing to connect (possible man-in-the-middle)",
                        f"if the host was really reinstalled, remove its old line from {path}",
                        tuple(f"{name} {t} {_b64(b)}" for t, b, _ in recorded))
    if blob is None:
        return Decision(UNKNOWN, name, f"the host {name} presented no readable key ({key_type}); refusing to connect")
    if not accept_new:
        return Decision(UNKNOWN, name, f"unknown host key for {name}: {got}; refusing to connect",
                        f"if that fingerprint is right, re-run with {ACCEPT_FLAG} to record it in {known.record_to}")
    return _record(known, name, key_type, key_b64)


def preferred_types(known: KnownHosts, name: str) -> list[str]:
    """The key types recorded for name, to ask the host for first (as OpenSSH orders its host key
    algorithms): a host then presents the recorded key where it still has it."""
    try:
        return list(dict.fromkeys(t for marker, t, _, _ in _entries(known, name) if marker == ""))
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# known_hosts files


def _entries(known: KnownHosts, name: str) -> list[tuple[str, str, bytes, str]]:
    """(marker, key type, key blob, file) of every line whose host patterns match name."""
    found = []
    for path in known.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.filename is None:
                e.filename = path
            raise
        for line in text.splitlines():
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = fields.pop(0) if fields[0].startswith("@") else ""
            if len(fields) < 3 or marker not in ("", "@revoked"):
                continue  # (@cert-authority: host certificates are not used)
            blob = _blob(fields[2])
            if blob is not None and _matches(name, fields[0]):
                found.append((marker, fields[1], blob, path))
    return found


def _blob(key_b64: str) -> bytes | None:
    try:
        return binascii.a2b_base64(key_b64, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _matches(name: str, patterns: str) -> bool:
    """OpenSSH's match_hostname: a negated pattern that matches rules the line out; otherwise any
    pattern that matches (case-insensitive; `|1|salt|hash` hashed names; `*` and `?`)."""
    lowered = name.lower()
    positive = False
    for pattern in patterns.split(","):
        negated = pattern.startswith("!")
        pattern = pattern[1:] if negated else pattern
        if pattern.startswith("|1|"):
            import hashlib
            import hmac

            parts = pattern.split("|")
            try:
                salt, want = binascii.a2b_base64(parts[2]), binascii.a2b_base64(parts[3])
            except (IndexError, binascii.Error):
                continue
            hit = hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)
        elif "*" in pattern or "?" in pattern:
            import fnmatch

            # fnmatch's [...] classes are not OpenSSH's: only * and ? are wildcards
            hit = fnmatch.fnmatchcase(lowered, pattern.lower().replace("[", "[[]"))
        else:
            hit = lowered == pattern.lower()
        if hit and negated:
            return False
        positive = positive or hit
    return positive


def _record(known: KnownHosts, name: str, key_type: str, key_b64: str) -> Decision:
    """Append name's key to the first user known_hosts file, under a lock and unless another
    process recorded it meanwhile."""
    import fcntl

    path = known.record_to
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        again = decide(known, name, key_type, key_b64, accept_new=False)
        if again.kind != UNKNOWN:
            return again
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            needs_newline = f.read(1) != b"\n"
        else:
            needs_newline = False
        entry = _hashed(name) if known.hash_names else name
        f.write((("\n" if needs_newline else "") + f"{entry} {key_type} {key_b64}\n").encode())
    return Decision(RECORDED, name, f"recorded {key_type} {fingerprint(key_b64)} for {name} in {path}",
                    lines=(f"{name} {key_type} {key_b64}",))


def _hashed(name: str) -> str:
    import hashlib
    import hmac

    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{_b64(salt)}|{_b64(digest)}"


# ---------------------------------------------------------------------------------------------
# The OpenSSH client's side: its KnownHostsCommand, and what the transport reads back


def refusal_in(text: str) -> tuple[str, str] | None:
    """(message, hint) of the refusal `main` printed into an ssh's stderr, or None."""
    import json

    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith(MARK):
            try:
                said = json.loads(line[len(MARK):])
                return said["message"], said["hint"]
            except (ValueError, KeyError, TypeError):
                continue
    return None


def main(argv: list[str]) -> int:
    """KnownHostsCommand PLAN %I %H %t %K: print the lines ssh is to know for host %H (ORDER: the
    recorded ones, for its algorithm preference; HOSTNAME: as `decide` says for key %K); PLAN is
    the file openssh.host_key_plan wrote (plan_text): each name's KnownHosts and the accept flag."""
    plan_path, invocation, name = argv[0], argv[1], argv[2]
    accept_new, known = _read_plan(plan_path, name)
    out = sys.stdout
    if invocation == "ORDER":
        try:
            entries = _entries(known, name)
        except OSError:
            entries = []
        for marker, t, b, _ in entries:
            if marker == "":
                out.write(f"{name} {t} {_b64(b)}\n")
        return 0
    if invocation != "HOSTNAME" or len(argv) < 5 or argv[4] == "NONE":
        return 0  # (ADDRESS: CheckHostIP is off)
    decision = decide(known, name, argv[3], argv[4], accept_new=accept_new)
    for line in decision.lines:
        out.write(line + "\n")
    out.flush()
    if decision.kind == RECORDED:
        sys.stderr.write(f"harness: {decision.message}\n")
    elif not decision.accepted:
        import json

        sys.stderr.write(MARK + json.dumps({"kind": decision.kind, "message": decision.message, "hint": decision.hint}) + "\n")
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as e:  # ssh then knows no key and refuses: say why in the one line
        import json

        sys.stderr.write(MARK + json.dumps({"kind": "error", "message": f"harness's host-key check could not run: {type(e).__name__}: {e}; refusing to connect",
                                            "hint": ""}) + "\n")
        sys.exit(1)
