"""Scripts the harness ships to a host and runs there with the host's python3 (standard library
only). The laptop side never imports them: it reads their source and sends it. The one module it
imports is wire.py, the contract both sides read, which travels ahead of every helper."""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent

# sh: the default `python3` (in $py) becomes /usr/bin/python3 where there is one: a `python3`
# found first on PATH may be a version manager's shim (pyenv's starts ~40 processes, 0.1-0.3 s,
# before Python does), and the helpers need only the standard library.
SYSTEM_PYTHON_SH = 'if [ "$py" = python3 ] && [ -x /usr/bin/python3 ]; then py=/usr/bin/python3; fi'


def path(name: str) -> Path:
    """The file of one helper, e.g. path("supervisor.py")."""
    return DIR / name


# The wire contract (wire.py): shipped with every helper, ahead of its own companions.
WIRE = "wire.py"
# Other modules a helper imports from this directory, shipped with it (source()): name -> its
# companions, in the order they are registered. A companion imports only the wire contract and
# companions listed before it (tests/test_wire.py).
COMPANIONS = {
    "supervisor.py": (
        "artifact_store.py",  # the artifact store: keys, records, locks
        "run_files.py",  # a run's files: layout, atomic state files, the run's lock
        "stage_events.py",  # a stage's events.jsonl read from its tail
        "process_groups.py",  # a stage run as a process group: started, proven ours, stopped
        "stage_container.py",  # a stage run as a container, its engine lost, its OOM kill
        "run_queue.py",  # one run at a time per GPU set
        "supervise.py",  # the detached supervisor: a run's chain of stages
        "status.py",  # request `status`
        "launch.py",  # request `launch`: the plan written, the supervisor detached
        "cancel.py",  # requests `cancel`, `cancelling`
        "follow.py",  # request `follow` (harness logs)
        "cleanup.py",  # request `gc` (harness rm, harness gc)
        "preflight.py",  # request `preflight` (harness run --dry-run)
    ),
}


def source(name: str) -> str:
    """The text of one helper, as it travels to the host: a loader that registers each companion
    as a module (sys.modules; the wire contract first), then runs the helper as __main__, every
    file compiled under its own name (tracebacks name the right file and line)."""
    text = path(name).read_text(encoding="utf-8")
    companions = (WIRE, *COMPANIONS.get(name, ()))
    lines = ["import sys, types", "def _companion(name, text):",
             "    module = sys.modules[name] = types.ModuleType(name)",
             "    module.__file__ = name + '.py'",
             "    exec(compile(text, module.__file__, 'exec'), module.__dict__)"]
    lines += [f"_companion({c.removesuffix('.py')!r}, {path(c).read_text(encoding='utf-8')!r})" for c in companions]
    lines.append(f"exec(compile({text!r}, {name!r}, 'exec'), {{'__name__': '__main__', '__file__': {name!r}}})")
    return "\n".join(lines) + "\n"
