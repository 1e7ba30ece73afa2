"""transport/ owns every SSH process: no module outside harness/transport/ builds an ssh command
line, starts one, or reads what ssh printed. A check over the source, failing
with the file and line of each offence; the checker itself is tested on planted offences, so it
cannot pass by matching nothing."""

from __future__ import annotations

import re
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
TRANSPORT = HARNESS / "transport"

# What only transport/ may do, each with why it is an offence elsewhere.
RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\.(local_argv|own_connection_argv|stdio_forward_argv)\s*\("),
     "builds a client command line: start it with Transport.stream / stream_to"),
    (re.compile(r"\.argv_failure\s*\(|\b(bulk_failure|map_stderr)\s*\("),
     "types a client's failure from its stderr: RemoteProcess.error does"),
    (re.compile(r"\bfrom\s+harness\.transport\s+import\s+[^\n]*\bopenssh\b|\bharness\.transport\.openssh\b|\bimport\s+openssh\b"),
     "uses the OpenSSH command-line builder"),
    (re.compile(r"""(?<![\w\])])\[\s*(?:[rbf]?["'])(?:[^"'\s]*/)?ssh["']"""),  # a list literal, not a subscript a["ssh"]
     "an argv starting with ssh"),
    (re.compile(r"""(?:Popen|run|call|check_call|check_output|execvpe?|execlp|spawnlp|which)\(\s*\[?\s*(?:[rbf]?["'])(?:[^"'\s]*/)?ssh["']"""),
     "starts or looks up ssh"),
    (re.compile(r"""["'](?:[^"'\s]*/)?ssh\s+-"""),
     "an ssh command line as a string"),
]


def offences(root: Path, skip: Path | None = None) -> list[str]:
    """'file:line: rule: text' for each offence in root's .py files (skip: a directory allowed)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if skip is not None and skip in path.parents:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith(("'", '"')) else line
            if line.lstrip().startswith("#"):
                continue
            for pattern, why in RULES:
                if pattern.search(code):
                    found.append(f"{path.relative_to(root.parent)}:{number}: {why}: {line.strip()}")
    return found


def test_no_ssh_command_line_outside_transport():
    found = offences(HARNESS, skip=TRANSPORT)
    assert not found, "SSH client work outside harness/transport/:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_offence(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "transport").mkdir(parents=True)
    (pkg / "transport" / "ok.py").write_text('subprocess.run(["ssh", "-G", host])\n')  # allowed there
    (pkg / "bad.py").write_text(
        "import subprocess\n"
        "proc = subprocess.Popen(transport.local_argv(argv))\n"  # 2
        "argv = t.own_connection_argv(x) or t.stdio_forward_argv(h, p)\n"  # 3
        "raise t.argv_failure(what, code, err)\n"  # 4
        "from harness.transport import openssh\n"  # 5
        "cmd = ['ssh', '-W', f'{h}:{p}', host]\n"  # 6
        'subprocess.run("/usr/bin/ssh", check=True)\n'  # 7
        'line = "ssh -o BatchMode=yes box true"\n'  # 8
        "# subprocess.run(['ssh', host])  a comment is no offence\n"
        'how = f"ssh {host.ssh}"  # words for a person, not a command\n'
        'asked["ssh"] = alias  # a key, not an argv\n'
        "argv = ['ssh'] + options\n"  # 12
        'cmd = ["ssh"]\n'  # 13
    )
    found = offences(pkg, skip=pkg / "transport")
    assert [f.split(":")[1] for f in found] == ["2", "3", "4", "5", "6", "7", "8", "12", "13"], found
    assert all(f.startswith("pkg/bad.py:") for f in found)
