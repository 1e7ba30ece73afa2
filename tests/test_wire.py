"""The wire contract (harness/host_helpers/wire.py) is the one place both sides of the seam read
what they must agree on. Walls, as checks over the source failing with the file and line of each
offence (each checker tested on planted offences, so it cannot pass by matching nothing):
a host helper imports nothing from harness but what ships with it (the wire module, its
companions); the wire module imports only the standard library; a wire constant's value is
written nowhere else in harness/ or remote_scripts/, and a wire rule is defined nowhere else in
harness/. Stage code cannot import harness (only remote_scripts/ reaches the box): its two copies
of wire rules are held equal to them here."""

from __future__ import annotations

import ast
import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

from harness import host_helpers
from harness.host_helpers import wire

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "harness"
REMOTE_SCRIPTS = REPO / "remote_scripts"
# (clean_rel is not here: sync and pull wrap it under that name, each adding its own condition)
WIRE_RULES = ("run_names", "newest_run", "is_hub_id", "looks_like_hub_id", "default_target_layers")


def _imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) of every import in tree (relative ones as '.')."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module if node.level == 0 and node.module else ".", [a.name for a in node.names]))
    return found


def registered_ahead(name: str, companions: dict[str, tuple[str, ...]]) -> set[str]:
    """What file `name` may import from its directory besides the wire module: a helper, its
    companions; a companion, those listed ahead of it (registered before it) wherever it travels."""
    if name in companions:
        return set(companions[name])
    ahead = [set(listed[: listed.index(name)]) for listed in companions.values() if name in listed]
    return set.intersection(*ahead) if ahead else set()


def helper_offences(directory: Path, companions: dict[str, tuple[str, ...]]) -> list[str]:
    """Each import of a helper in directory that reaches harness or a sibling module other than
    the wire module and the helper's own companions (what the loader ships with it); of a
    companion, a sibling not registered ahead of it (the loader runs each companion as it
    registers it: what it imports must be there already)."""
    siblings = {p.stem for p in directory.glob("*.py")}
    found = []
    for path in sorted(directory.glob("*.py")):
        if path.name in ("__init__.py", "wire.py"):
            continue
        shipped = {"wire", *(c.removesuffix(".py") for c in registered_ahead(path.name, companions))}
        for line, module, names in sorted(_imports(ast.parse(path.read_text(encoding="utf-8")))):
            if module == "harness.host_helpers" and set(names) <= shipped:
                continue
            if module.split(".")[0] == "harness" or module == "." or (module in siblings and module not in shipped):
                found.append(f"{path.name}:{line}: imports {module} {names or ''}".rstrip() + " (a helper ships with wire.py and its COMPANIONS only, each after what it imports)")
    return found


def stdlib_offences(path: Path) -> list[str]:
    return [f"{path.name}:{line}: imports {module} (not the standard library)"
            for line, module, _ in _imports(ast.parse(path.read_text(encoding="utf-8")))
            if module.split(".")[0] not in sys.stdlib_module_names]


def _literals() -> dict[str, str]:
    """value -> wire name, for each constant a copy could spell: strings and struct formats."""
    out = {}
    for name in dir(wire):
        value = getattr(wire, name)
        if name.isupper() and isinstance(value, str):
            out[value] = name
        elif name.isupper() and isinstance(value, struct.Struct):
            out[value.format] = name
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def copy_offences(roots: list[Path], wire_file: Path, literals: dict[str, str], rules: tuple[str, ...], rules_under: Path) -> list[str]:
    """A wire constant's value written as a string (not a docstring) outside wire_file, or a
    module-level function named like a wire rule defined under rules_under."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path == wire_file:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            rel = path.relative_to(root.parent)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in literals and id(node) not in docs:
                    found.append(f"{rel}:{node.lineno}: {node.value!r} is wire.{literals[node.value]}: import it")
            if rules_under in path.parents:
                found += [f"{rel}:{node.lineno}: defines {node.name}, a wire rule: call wire.py's"
                          for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in rules]
    return found


def test_host_helpers_import_nothing_from_harness_but_what_ships_with_them():
    assert host_helpers.WIRE == "wire.py" and (host_helpers.DIR / host_helpers.WIRE).is_file()
    found = helper_offences(host_helpers.DIR, host_helpers.COMPANIONS)
    assert not found, "a host helper imports what does not travel with it:\n" + "\n".join(found)


def test_the_wire_module_imports_only_the_standard_library():
    found = stdlib_offences(host_helpers.DIR / host_helpers.WIRE)
    assert not found, "\n".join(found)


def test_each_wire_constant_and_rule_is_written_once():
    literals = _literals()
    assert {"@harness-home@", "@harness-user@", ".harness/sync-manifest.json", ">BQ", ">QI", ">I"} <= set(literals)
    found = copy_offences([HARNESS, REMOTE_SCRIPTS], host_helpers.DIR / host_helpers.WIRE, literals, WIRE_RULES, HARNESS)
    assert not found, "a copy of the wire contract:\n" + "\n".join(found)


def test_the_checks_find_each_kind_of_offence(tmp_path):
    helpers_dir = tmp_path / "host_helpers"
    helpers_dir.mkdir()
    (helpers_dir / "wire.py").write_text('import os\nimport requests\nX = "@tok@"\nF = struct.Struct(">HH")\n')  # 2
    (helpers_dir / "buddy.py").write_text("import wire\nimport pal\n")  # 2: registered after it
    (helpers_dir / "pal.py").write_text("import buddy\nfrom harness.host_helpers import buddy\n")  # registered before it: fine
    (helpers_dir / "good.py").write_text("import json\nimport wire\nimport buddy\nfrom harness.host_helpers import wire, buddy\n")
    (helpers_dir / "bad.py").write_text(
        "import wire\n"
        "import buddy\n"  # 2: not its companion
        "from harness.config import load\n"  # 3
        "def f():\n"
        "    from harness.host_helpers import buddy\n"  # 5
        "from . import wire\n"  # 6
    )
    assert helper_offences(helpers_dir, {"good.py": ("buddy.py", "pal.py")}) == [
        "bad.py:2: imports buddy (a helper ships with wire.py and its COMPANIONS only, each after what it imports)",
        "bad.py:3: imports harness.config ['load'] (a helper ships with wire.py and its COMPANIONS only, each after what it imports)",
        "bad.py:5: imports harness.host_helpers ['buddy'] (a helper ships with wire.py and its COMPANIONS only, each after what it imports)",
        "bad.py:6: imports . ['wire'] (a helper ships with wire.py and its COMPANIONS only, each after what it imports)",
        "buddy.py:2: imports pal (a helper ships with wire.py and its COMPANIONS only, each after what it imports)",
    ]
    assert stdlib_offences(helpers_dir / "wire.py") == ["wire.py:2: imports requests (not the standard library)"]
    code = tmp_path / "pkg"
    code.mkdir()
    (code / "copy.py").write_text(
        '"""Mentions @tok@ in a docstring: words, not a copy."""\n'
        'A = "@tok@"\n'  # 2
        'B = struct.Struct(">HH")\n'  # 3
        "def is_hub_id(x):\n"  # 4
        '    """@tok@"""\n'
        "class C:\n"
        "    def newest_run(self): ...\n"  # a method that asks the host: no copy
    )
    found = copy_offences([code], helpers_dir / "wire.py", {"@tok@": "X", ">HH": "F"}, WIRE_RULES, code)
    assert [f.split(":")[1] for f in found] == ["2", "3", "4"], found


# The rules themselves, and the stage code's copies held to them

@pytest.mark.parametrize("text, hub", [
    ("org/name", True), ("Qwen/Qwen3-8B", True), ("a.b/c-d_e", True),
    ("~/models/x", False), ("~/x", False), ("./x", False), ("../x", False), (".cache/x", False), ("/abs/x", False),
    ("org/", False), ("/org", False), ("name", False), ("a/b/c", False), ("x/y/z", False), ("", False), ("models/x/", False),
    ("~", False), (".", False), ("C:\\models\\x", False), ("models\\x", False),  # no `/`: a path (a Windows-style name is one on the box too)
])
def test_hub_id_or_path_one_rule_on_every_side(text, hub):
    spec = importlib.util.spec_from_file_location("stage_verifier_path", REMOTE_SCRIPTS / "common" / "verifier_path.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    assert wire.is_hub_id(text) is hub
    assert stage.looks_like_hub_id(text) is hub  # the stages' copy (they cannot import harness)


def test_the_stages_default_target_layers_are_the_wires():
    """remote_scripts/common/verifier.py imports torch: its function is compiled alone."""
    tree = ast.parse((REMOTE_SCRIPTS / "common" / "verifier.py").read_text(encoding="utf-8"))
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "default_target_layers"]
    space: dict = {}
    exec(compile(ast.Module([fn], []), "verifier.py", "exec"), space)
    assert all(space["default_target_layers"](n) == wire.default_target_layers(n) for n in range(1, 200))


def test_the_ml_probe_reads_a_home_relative_verifier_as_a_directory(tmp_path, monkeypatch):
    """Before: `~/x` was taken for a hub id (not a directory as written), so a verifier there was
    'no config.json' to `harness doctor`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models" / "v").mkdir(parents=True)
    (tmp_path / "models" / "v" / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 12, "hidden_size": 64}))
    spec = importlib.util.spec_from_file_location("ml_probe", host_helpers.DIR / "ml_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    facts = probe.verifier_facts("~/models/v")
    assert facts["found"] and facts["num_hidden_layers"] == 12 and facts["path"] == "~/models/v"
    assert not probe.verifier_facts("~/models/none")["found"]


def test_every_helper_travels_with_the_wire_module_first():
    """Run as the host runs it (python -S, nothing of harness importable): the shipped source
    registers `wire` before the helper's own code imports it."""
    import subprocess

    for name in sorted(p.name for p in host_helpers.DIR.glob("*.py") if p.name not in ("__init__.py", host_helpers.WIRE)):
        text = host_helpers.source(name)
        assert text.index("_companion('wire'") < text.index(f"exec(compile({host_helpers.path(name).read_text(encoding='utf-8')!r}"), name
    loader = host_helpers.source("sync_apply.py").rstrip("\n").split("\n")[:-1]  # all but the line that runs the helper
    check = "\n".join([*loader, "import wire; print(wire.__file__, wire.MANIFEST_PATH)"])
    done = subprocess.run([sys.executable, "-S", "-I", "-c", check], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0 and done.stdout.split() == ["wire.py", wire.MANIFEST_PATH], done.stderr[-2000:]


def test_the_supervisor_travels_with_its_companions_and_answers_as_on_the_host(tmp_path):
    """supervisor.py is split by concept into companions (COMPANIONS): run as the host runs it
    (python -S -I, nothing of harness importable), each is registered before what imports it and
    a request reaches its module: `status` of a run whose supervisor is gone reads `lost`, with its
    stage's latest tau (status.py, run_files.py, stage_events.py)."""
    import subprocess

    shipped = host_helpers.COMPANIONS["supervisor.py"]
    assert len(shipped) == len(set(shipped)) and all((host_helpers.DIR / c).is_file() for c in shipped)
    run = tmp_path / "runs" / "R1"
    (run / "train").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "R1", "stages": ["train"]}))
    (run / "state.json").write_text(json.dumps({"state": "running", "pid": 1}))  # a pid, but no lock held: no supervisor
    (run / "train" / "events.jsonl").write_text(json.dumps({"t": 1.0, "stage": "train", "event": "metric", "step": 3, "metrics": {"tau": 1.5}}) + "\n")
    request = json.dumps({"cmd": "status", "runs_dir": str(tmp_path / "runs")})
    done = subprocess.run([sys.executable, "-S", "-I", "-c", host_helpers.source("supervisor.py")], input=request, capture_output=True,
                          text=True, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    (summary,) = json.loads(done.stdout)
    assert summary["state"]["state"] == "lost" and summary["stages"][0]["tau"] == {"step": 3, "tau": 1.5}
    unknown = subprocess.run([sys.executable, "-S", "-I", "-c", host_helpers.source("supervisor.py")], input='{"cmd": "nonesuch"}',
                             capture_output=True, text=True, cwd="/")
    assert unknown.returncode == 64 and "unknown command 'nonesuch'" in unknown.stderr
