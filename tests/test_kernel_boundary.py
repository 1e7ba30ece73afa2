"""The floor plan of harness/: a kernel and its wings. Three rules, each a check over the source
(every import statement, also those inside functions and under TYPE_CHECKING), failing with the
file and line of each offence; each checker is tested on planted offences, so it cannot pass by
matching nothing.

- No import circle: a module never reaches itself through the imports of others (a circle that
  deferred imports keep from breaking at start-up still ties the two ends together).
- The kernel never imports a wing. KERNEL and WINGS below are the one table of which is which;
  every module of harness/ is in exactly one of them (a new one must be placed).
- One door for the runtime kind: only harness/runtime/ compares a runtime kind ("host",
  "docker") or names HostRuntime/DockerRuntime; everyone else asks the Runtime
  (harness.runtime.base) a question it answers for its kind.
"""

from __future__ import annotations

import ast
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"

# What a run needs, from the config to the pulled result: the kernel. A name covers a module or
# a package (all its modules); the longest name that matches a module places it.
KERNEL = (
    "harness",  # the package's face (__init__.py: the version)
    "config", "config_discovery", "stages", "stage_options", "pipeline",  # what is asked for
    "errors", "units", "events", "box_values", "compat", "data_cost", "fanout",  # words every floor uses
    "transport", "runtime", "helpers", "host_helpers",  # how a command reaches the box, and what runs there
    "sync", "pull", "runs", "jobs", "artifacts",  # code there, runs there, results back
    "host", "group", "group_node", "group_checks", "multinode",  # what a command works on
    "doctor", "run_start", "run_pull",  # a run's checks, its start, its pull
)
# The features that stand beside the kernel, and the CLI over both: each may import the kernel
# and other wings; the kernel imports none of them.
WINGS = (
    "serve", "tensorboard", "host_server", "relay_forward", "port_forward",  # servers on the box, forwarded
    "inspect_remote", "sources",  # what the stage interpreter sees
    "sweep", "demo", "extraction_check", "run_diff", "cleanup", "remote_exec", "starter", "completion",  # one command's library each
    "cli", "__main__",  # the `harness` command
)
# Known exceptions to "the kernel never imports a wing": (kernel module, wing module) -> why.
KERNEL_EXCEPTIONS: dict[tuple[str, str], str] = {}

RUNTIME_KINDS = {"host", "docker"}
RUNTIME_CLASSES = {"HostRuntime", "DockerRuntime"}
# Outside harness/runtime/, where a runtime kind may be named: path (relative to harness/) -> why.
KIND_EXCEPTIONS = {
    "config.py": "the setting itself: HostConfig.runtime, uses_image and their validation",
    "host_helpers": "the box side: the supervisor starts the process spec Runtime.stage_process wrote, by its `kind`",
}


# -- the import graph --------------------------------------------------------------------------

def module_names(package: Path) -> dict[str, Path]:
    """'harness.jobs' -> its file, for every module of `package` (a package is its __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """module -> {module of `package` it imports: the line of the first such import}.
    `from P import N` imports P.N where N is a module, else P."""
    modules = module_names(package)
    top = package.name

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == top]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == top:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name)
                if target is not None and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each set of modules that import each other in a loop (Tarjan's strongly connected
    components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def circle_offences(package: Path) -> list[str]:
    graph = import_graph(package)
    out = []
    for component in circles(graph):
        ties = [f"{a} -> {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in component]
        out.append(f"circle of {', '.join(component)}: " + "; ".join(ties))
    return out


# -- the kernel and its wings ------------------------------------------------------------------

def part_of(module: str, top: str, kernel: tuple[str, ...], wings: tuple[str, ...]) -> tuple[str | None, str | None]:
    """('kernel' or 'wing', the table's name that places it), by the longest name that matches
    the module (`top` alone is the package's face)."""
    rel = module.removeprefix(top + ".") if module != top else top
    best: tuple[str | None, str | None] = (None, None)
    for part, names in (("kernel", kernel), ("wing", wings)):
        for name in names:
            if (rel == name or rel.startswith(name + ".")) and (best[1] is None or len(name) > len(best[1])):
                best = (part, name)
    return best


def wing_offences(package: Path, kernel: tuple[str, ...], wings: tuple[str, ...], exceptions: dict[tuple[str, str], str]) -> list[str]:
    """A module in neither table, a name in both, and each import of a wing by a kernel module."""
    graph = import_graph(package)
    top = package.name
    out = [f"{name}: in KERNEL and in WINGS" for name in sorted(set(kernel) & set(wings))]
    for module in sorted(graph):
        part, _ = part_of(module, top, kernel, wings)
        if part is None:
            out.append(f"{module}: in neither KERNEL nor WINGS: place it")
        if part != "kernel":
            continue
        for target, line in sorted(graph[module].items()):
            if part_of(target, top, kernel, wings)[0] == "wing" and (module, target) not in exceptions:
                out.append(f"{module} (line {line}) imports the wing {target}: invert it (the wing registers, or the CLI composes)")
    return out


# -- one door for the runtime kind -------------------------------------------------------------

def _kind_expression(node: ast.AST) -> bool:
    """x.runtime, x.kind, runtime, kind, x["kind"], x["runtime"]."""
    if isinstance(node, ast.Attribute):
        return node.attr in ("runtime", "kind")
    if isinstance(node, ast.Name):
        return node.id in ("runtime", "kind")
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in ("runtime", "kind")
    return False


def _some_kinds(node: ast.AST) -> bool:
    """A runtime kind, or some of them but not all ("host", ("docker",)): a test of every kind
    is a check that a value is one, not a branch."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    values = {i.value for i in items if isinstance(i, ast.Constant)}
    return len(values) == len(items) and bool(values) and values < RUNTIME_KINDS


def kind_offences(package: Path, allowed: Path, exceptions: dict[str, str]) -> list[str]:
    """'file:line: ...' for each comparison of a runtime kind and each HostRuntime/DockerRuntime
    named outside `allowed` (and the exceptions, paths relative to `package`)."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if allowed in path.parents or any(rel.as_posix() == e or rel.as_posix().startswith(e + "/") for e in exceptions):
            continue
        where = path.relative_to(package.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_kind_expression(s) for s in sides) and any(_some_kinds(s) for s in sides):
                    out.append(f"{where}:{node.lineno}: compares a runtime kind: ask the Runtime (harness.runtime.base) instead")
            elif isinstance(node, (ast.Name, ast.alias)) and (node.id if isinstance(node, ast.Name) else node.name.rpartition(".")[2]) in RUNTIME_CLASSES:
                out.append(f"{where}:{node.lineno}: names a runtime class: ask the Runtime (harness.runtime.base) instead")
    return out


# -- the house ---------------------------------------------------------------------------------

def test_harness_has_no_import_circle():
    assert len(import_graph(HARNESS)) > 50
    found = circle_offences(HARNESS)
    assert not found, "harness/ imports in a circle (move what both need below both):\n" + "\n".join(found)


def test_the_kernel_never_imports_a_wing():
    assert set(KERNEL_EXCEPTIONS) <= {(a, b) for a, edges in import_graph(HARNESS).items() for b in edges}, "an exception that no longer happens"
    found = wing_offences(HARNESS, KERNEL, WINGS, KERNEL_EXCEPTIONS)
    assert not found, "\n".join(found)


def test_only_the_runtime_branches_on_its_kind():
    found = kind_offences(HARNESS, HARNESS / "runtime", KIND_EXCEPTIONS)
    assert not found, "a runtime kind outside harness/runtime/:\n" + "\n".join(found)


def test_the_checks_find_each_kind_of_offence(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import inner\n")
    (pkg / "sub" / "inner.py").write_text("import os\n")
    (pkg / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.high import Thing\n"  # 3: a circle through a type is a circle
    )
    (pkg / "high.py").write_text("import pkg.mid\n")
    (pkg / "mid.py").write_text("def f():\n    from pkg import low\n")  # 2: inside a function
    (pkg / "apart.py").write_text("from pkg.sub import inner\nimport pkg.sub.inner as alias\n")
    (pkg / "wing.py").write_text("")
    (pkg / "stray.py").write_text("")
    assert circle_offences(pkg) == ["circle of pkg.high, pkg.low, pkg.mid: pkg.high -> pkg.mid (line 1); pkg.low -> pkg.high (line 3); pkg.mid -> pkg.low (line 2)"]
    assert import_graph(pkg)["pkg.apart"] == {"pkg.sub.inner": 1}

    (pkg / "low.py").write_text("def g():\n    import pkg.wing\n")  # 2
    (pkg / "sub" / "inner.py").write_text("from pkg import wing\n")  # 1
    found = wing_offences(pkg, ("pkg", "low", "mid", "high", "sub", "apart"), ("wing", "sub.inner", "high"), {("pkg.apart", "pkg.sub.inner"): "planted"})
    assert found == [
        "high: in KERNEL and in WINGS",
        "pkg.low (line 2) imports the wing pkg.wing: invert it (the wing registers, or the CLI composes)",
        "pkg.stray: in neither KERNEL nor WINGS: place it",
        "pkg.sub (line 1) imports the wing pkg.sub.inner: invert it (the wing registers, or the CLI composes)",  # the longer name places it
    ], found

    (pkg / "runtime").mkdir()
    (pkg / "runtime" / "docker.py").write_text('if host.runtime == "docker": pass\n')  # allowed there
    (pkg / "box").mkdir()
    (pkg / "box" / "helper.py").write_text('if spec["kind"] == "docker": pass\n')  # an exception
    (pkg / "jobs.py").write_text(
        'visible = host.runtime == "host"\n'  # 1
        'if runtime.kind != "docker": pass\n'  # 2
        'if spec["kind"] in ("docker",): pass\n'  # 3
        'if kind == "host": pass\n'  # 4
        'if answers.runtime not in ("docker", "host"): pass\n'  # every kind: a check, not a branch
        'if fields[0] == "host": pass\n'  # not a runtime's kind
        'if col in ("host", "run"): pass\n'  # not kinds only
        "from pkg.runtime.docker import DockerRuntime\n"  # 8
        "ok = isinstance(r, HostRuntime)\n"  # 9
    )
    found = kind_offences(pkg, pkg / "runtime", {"box": "planted"})
    assert [f.split(":")[:2] for f in found] == [["pkg/jobs.py", str(n)] for n in (1, 2, 3, 4, 8, 9)], found
