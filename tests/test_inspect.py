"""`harness inspect`: the library API and the CLI, run for real.

Two stage environments run the same assertions: this machine through the local transport
(HostRuntime), and a container on the test Docker engine (DockerRuntime, the debootstrap base
image: python3 without torch). The inspected code is a small package, `inspectee`, written into
the workdir's remote_scripts/ (first on the stage interpreter's sys.path, like the stages') with
a dist-info so it has a distribution name and version. Then the real thing: torch, transformers
and speculators installed on this machine, through the CLI; and the CLI over the sshd test bed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.config import ContainerConfig, HostConfig
from harness.errors import UsageError
from harness.inspect_remote import RemoteImportError, UnknownNameError, grep_package, inspect_object, inspect_objects
from harness.runtime.host import HostRuntime
from harness.transport.local import LocalTransport

REPO = Path(__file__).resolve().parents[1]

INSPECTEE = {
    "__init__.py": '''\
        """A package for inspect tests."""
        from .deco import decorated
        ''',
    "deco.py": '''\
        import functools


        def logged(fn):
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapper


        def twice(fn):
            @functools.wraps(fn)
            def again(*args, **kwargs):
                return fn(*args, **kwargs)
            return again


        @logged
        @twice
        def decorated(x: int, y: int = 2) -> int:
            """Add two numbers."""
            return x + y


        class Base:
            def hello(self):
                return "base"


        class Child(Base):
            """A child."""

            @staticmethod
            def s(a):
                return a

            @classmethod
            def c(cls, b):
                return b

            @property
            def p(self):
                """A property."""
                return 1

            @logged
            def m(self):
                return 2


        def compiled_like(fn):
            """What torch.compile returns, reduced to the attribute dynamo sets on it."""
            def compile_wrapper(*args, **kwargs):
                return fn(*args, **kwargs)
            compile_wrapper._torchdynamo_orig_callable = fn
            return compile_wrapper


        @compiled_like
        def hot(x):
            return x * 2
        ''',
    # Side effects at import: proves static resolution imports nothing, and that a library
    # printing on stdout cannot corrupt the answer.
    "noisy.py": '''\
        print("hello from noisy at import time")
        open("noisy-was-imported.marker", "w").close()


        def quiet():
            return 1
        ''',
    "broken.py": '''\
        X = 1
        raise RuntimeError("boom at import")
        ''',
    "needs_dep.py": '''\
        import a_dependency_that_is_not_installed


        def f():
            return 1
        ''',
    "sub/__init__.py": "",
    "sub/leaf.py": '''\
        def leaf_function():
            return "leaf"  # fn( inside a comment counts for grep
        ''',
}


def write_inspectee(workdir: Path) -> Path:
    scripts = workdir / "remote_scripts"
    package = scripts / "inspectee"
    for name, text in INSPECTEE.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    dist = scripts / "inspectee-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: inspectee\nVersion: 1.2.3\n")
    (dist / "top_level.txt").write_text("inspectee\n")
    (dist / "RECORD").write_text("".join(f"inspectee/{n},,\n" for n in INSPECTEE))
    return package


@pytest.fixture
def workdir(tmp_path) -> Path:
    work = tmp_path / "work"
    write_inspectee(work)
    return work


@pytest.fixture(params=["local", pytest.param("container", marks=pytest.mark.docker)])
def env(request, workdir):
    """(transport, runtime) of one stage environment whose workdir holds `inspectee`."""
    transport = LocalTransport("local")
    if request.param == "local":
        host = HostConfig(name="local", local=True, python=sys.executable)
        return transport, HostRuntime(host, str(workdir))
    image = request.getfixturevalue("docker_base_image")
    from harness.runtime.docker import DockerRuntime
    from tests.fixtures.docker_engine import startable_memlock

    container = ContainerConfig(gpus="none", python="python3", ulimits={"memlock": startable_memlock()})
    host = HostConfig(name="local", local=True, runtime="docker", container=container)
    return transport, DockerRuntime(host, str(workdir), home=str(workdir), image=image)


def file_lines(path: str, first: int, last: int) -> str:
    """The lines first..last of a file as it is on disk (the workdir is the same path inside
    the container), counted like the tokenizer does."""
    lines = Path(path).read_text().split("\n")
    return "\n".join(lines[first - 1:last]) + "\n"


def line_of(path: str, text: str) -> int:
    return Path(path).read_text().split("\n").index(text) + 1


# ---------------------------------------------------------------------------------------------
# Both environments


def test_decorated_function_unwraps_the_wraps_chain(env, workdir):
    transport, runtime = env
    info = inspect_object(transport, runtime, "inspectee.deco.decorated", mode="import")
    deco = str(workdir / "remote_scripts/inspectee/deco.py")
    assert (info.kind, info.resolution, info.file) == ("function", "import", deco)
    assert [u.how for u in info.unwrapped] == ["functools.wraps (__wrapped__)"] * 2
    assert [u.wrapper for u in info.unwrapped] == ["inspectee.deco.logged.<locals>.wrapper", "inspectee.deco.twice.<locals>.again"]
    assert info.unwrapped[0].where == f"{deco}:{line_of(deco, '    @functools.wraps(fn)')}"  # the wrapper's def, decorators included
    assert info.first_line == line_of(deco, "@logged") and info.last_line == line_of(deco, "    return x + y")
    assert info.source == file_lines(deco, info.first_line, info.last_line)
    assert info.signature == "(x: int, y: int = 2) -> int" and info.doc == "Add two numbers."
    assert str(info.dist) == "inspectee==1.2.3"
    # re-exported name: resolves to the same code through the package
    again = inspect_object(transport, runtime, "inspectee.decorated")
    assert (again.resolution, again.first_line, again.source) == ("import", info.first_line, info.source)


def test_static_resolution_reads_the_file_and_imports_nothing(env, workdir):
    transport, runtime = env
    deco = str(workdir / "remote_scripts/inspectee/deco.py")
    info = inspect_object(transport, runtime, "inspectee.deco.decorated")
    assert (info.resolution, info.kind, info.decorators, info.unwrapped) == ("static", "function", ["logged", "twice"], [])
    assert (info.first_line, info.last_line) == (line_of(deco, "@logged"), line_of(deco, "    return x + y"))
    assert info.source == file_lines(deco, info.first_line, info.last_line)
    assert str(info.dist) == "inspectee==1.2.3"
    marker = workdir / "noisy-was-imported.marker"
    quiet = inspect_object(transport, runtime, "inspectee.noisy.quiet")
    assert quiet.resolution == "static" and not marker.exists()
    live = inspect_object(transport, runtime, "inspectee.noisy.quiet", mode="import")  # prints on stdout
    assert marker.exists() and live.source == quiet.source == "def quiet():\n    return 1\n"


def test_class_mro_and_class_attributes(env, workdir):
    transport, runtime = env
    deco = str(workdir / "remote_scripts/inspectee/deco.py")
    child = inspect_object(transport, runtime, "inspectee.deco.Child", mro=True)
    assert child.kind == "class" and child.class_mro == ["inspectee.deco.Child", "inspectee.deco.Base", "builtins.object"]
    assert child.first_line == line_of(deco, "class Child(Base):") and child.source == file_lines(deco, child.first_line, child.last_line)
    kinds = {}
    for name in ("s", "c", "p", "m", "hello"):
        info = inspect_object(transport, runtime, f"inspectee.deco.Child.{name}", mode="import")
        kinds[name] = (info.kind, [u.how for u in info.unwrapped])
        assert info.source == file_lines(deco, info.first_line, info.last_line)
    assert kinds == {
        "s": ("method", ["staticmethod"]),
        "c": ("method", ["classmethod"]),
        "p": ("property", ["property (fget)"]),
        "m": ("method", ["functools.wraps (__wrapped__)"]),
        "hello": ("method", []),  # inherited: found on Base
    }
    with pytest.raises(UsageError, match="--mro needs a class"):
        inspect_object(transport, runtime, "inspectee.deco.decorated", mro=True)


def test_torch_compile_style_wrapper_is_unwrapped(env, workdir):
    transport, runtime = env
    info = inspect_object(transport, runtime, "inspectee.deco.hot", mode="import")
    assert [(u.how, u.wrapper) for u in info.unwrapped] == [("torch.compile / torch._dynamo wrapper", "inspectee.deco.compiled_like.<locals>.compile_wrapper")]
    assert info.source.startswith("@compiled_like\ndef hot(x):")


def test_several_paths_in_one_round_trip(env, workdir):
    transport, runtime = env
    runs = []  # every host helper call starts one process through local_argv (harness.helpers)
    original = transport.local_argv
    transport.local_argv = lambda argv: runs.append(argv) or original(argv)
    infos = inspect_objects(transport, runtime, ["inspectee.noisy.quiet", "len", "inspectee.deco.Child"], mode="import")
    assert [i.kind for i in infos] == ["function", "builtin", "class"] and len(runs) == 1
    with pytest.raises(UnknownNameError):  # the first bad path's error, in order
        inspect_objects(transport, runtime, ["len", "inspectee.nope", "inspectee.broken.X"])


def test_builtins_say_so_with_signature_and_doc(env):
    transport, runtime = env
    length = inspect_object(transport, runtime, "len")
    assert (length.kind, length.builtin, length.source, length.signature) == ("builtin", True, None, "(obj, /)")
    assert "number of items" in length.doc
    sqrt = inspect_object(transport, runtime, "math.sqrt")
    assert (sqrt.kind, sqrt.builtin, sqrt.signature) == ("builtin", True, "(x, /)") and "square root" in sqrt.doc
    get = inspect_object(transport, runtime, "dict.get")
    assert get.builtin and get.signature.startswith("(self, key, default=None")
    # a frozen stdlib module (os, posixpath since 3.11) still has its source and real lines
    join = inspect_object(transport, runtime, "os.path.join")
    assert join.kind == "function" and join.source.startswith("def join(") and join.file.endswith("posixpath.py")


def test_unknown_names_suggest_the_nearest(env):
    transport, runtime = env
    with pytest.raises(UnknownNameError) as e:
        inspect_object(transport, runtime, "inspectee.deco.decorate")
    assert "decorated" in e.value.suggestions and e.value.exit_code == 2
    with pytest.raises(UnknownNameError) as e:
        inspect_object(transport, runtime, "inspectee.deco.Child.helo")
    assert "hello" in e.value.suggestions
    with pytest.raises(UnknownNameError) as e:
        inspect_object(transport, runtime, "inspecte.deco")
    assert "inspectee" in e.value.suggestions
    with pytest.raises(UnknownNameError) as e:  # a submodule not imported by its package
        inspect_object(transport, runtime, "inspectee.sub.leaff")
    assert e.value.suggestions == ["leaf"]
    with pytest.raises(UsageError, match="dotted Python path"):
        inspect_object(transport, runtime, "inspectee..deco")


def test_a_module_that_fails_to_import_shows_the_error(env, workdir):
    transport, runtime = env
    with pytest.raises(RemoteImportError) as e:
        inspect_object(transport, runtime, "inspectee.broken.X")
    broken = workdir / "remote_scripts/inspectee/broken.py"
    assert (e.value.module, e.value.exc_type, e.value.exc_message) == ("inspectee.broken", "RuntimeError", "boom at import")
    assert e.value.frames == [f"{broken}:2 in <module>"]
    # a missing DEPENDENCY is a failed import, not an unknown name
    with pytest.raises(RemoteImportError) as e:
        inspect_object(transport, runtime, "inspectee.needs_dep.f", mode="import")
    assert e.value.exc_type == "ModuleNotFoundError" and "a_dependency_that_is_not_installed" in e.value.exc_message


def test_grep_matches_an_independent_grep(env, workdir):
    transport, runtime = env
    result = grep_package(transport, runtime, r"fn\(", "inspectee")
    package = workdir / "remote_scripts/inspectee"
    # grep(1) in the same environment, on the same files
    out = transport.run(runtime.foreground(["grep", "-rn", "--include=*.py", r"fn(", str(package)])).text
    expected = sorted((f, int(n)) for f, n, _ in (line.split(":", 2) for line in out.splitlines()))
    assert sorted((h.file, h.line) for h in result.hits) == expected and len(expected) == 4
    leaf = next(h for h in result.hits if h.file.endswith("leaf.py"))
    assert leaf.before == ["def leaf_function():"] and leaf.after == [""]
    assert result.files_searched == len(INSPECTEE) and str(result.dist) == "inspectee==1.2.3"
    assert grep_package(transport, runtime, "nothing_matches_this", "inspectee").hits == []
    with pytest.raises(UsageError, match="invalid regular expression"):
        grep_package(transport, runtime, "(", "inspectee")


# ---------------------------------------------------------------------------------------------
# The CLI, on this machine's real libraries


def harness_cli(config: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def local_config(tmp_path, workdir) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(f'[hosts.local]\nlocal = true\nworkdir = "{workdir}"\npython = "{sys.executable}"\n')
    return path


def test_cli_plain_json_where_and_errors(local_config, workdir):
    deco = str(workdir / "remote_scripts/inspectee/deco.py")
    first = line_of(deco, "@logged")
    r = harness_cli(local_config, "inspect", "local", "inspectee.deco.decorated", "--import")
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout  # piped: plain text
    header, location = r.stdout.splitlines()[:2]
    assert header == "inspectee.deco.decorated  (function)"
    assert location == f"{deco}:{first}-{first + 4}  inspectee==1.2.3  python {sys.version.split()[0]}"
    assert "unwrapped functools.wraps (__wrapped__): inspectee.deco.logged.<locals>.wrapper" in r.stdout
    assert f"{first}  @logged\n{first + 1}  @twice\n" in r.stdout
    r = harness_cli(local_config, "inspect", "local", "inspectee.deco.Child", "--json")
    answer = json.loads(r.stdout)
    assert answer["kind"] == "class" and answer["dist"] == {"name": "inspectee", "version": "1.2.3"}
    assert harness_cli(local_config, "inspect", "local", "inspectee.deco.Child.m", "--where").stdout == f"{deco}:{line_of(deco, '    @logged')}\n"
    assert harness_cli(local_config, "inspect", "local", "math.sqrt", "--signature").stdout == "sqrt(x, /)\n"
    both = harness_cli(local_config, "inspect", "local", "inspectee.deco.Base.hello", "inspectee.deco.Child.hello", "--where").stdout
    assert both == f"{deco}:{line_of(deco, '    def hello(self):')}\n" * 2  # inherited: the same code
    assert harness_cli(local_config, "inspect", "local", "inspectee.deco.Child", "--mro").stdout.split() == ["inspectee.deco.Child", "inspectee.deco.Base", "builtins.object"]
    r = harness_cli(local_config, "inspect", "local", "inspectee.deco.decorate")
    assert r.returncode == 2 and r.stderr.strip().endswith("has no attribute or submodule 'decorate' (did you mean: decorated)")
    r = harness_cli(local_config, "inspect", "local", "inspectee.broken.X")
    assert r.returncode == 1 and "RuntimeError: boom at import" in r.stderr and f"{workdir}/remote_scripts/inspectee/broken.py:2" in r.stderr
    r = harness_cli(local_config, "inspect", "local", "--grep", "nothing_matches_this", "inspectee")
    assert r.returncode == 1 and r.stdout == ""


def installed_package_dir(name: str) -> Path:
    """Where a package is installed, found without importing it (speculators takes seconds)."""
    import importlib.util

    return Path(importlib.util.find_spec(name).submodule_search_locations[0])


def test_cli_on_real_speculators_is_exact(local_config):
    """(How fast: bench/inspect_latency.py.)"""
    core_file = installed_package_dir("speculators") / "models/eagle3/core.py"
    r = harness_cli(local_config, "inspect", "local", "speculators.models.eagle3.core.Eagle3DraftModel.forward")
    assert r.returncode == 0, r.stderr
    lines = core_file.read_text().split("\n")
    first = lines.index("    @conditional_torch_compile") + 1
    assert r.stdout.splitlines()[1].startswith(f"{core_file}:{first}-")
    assert f"{first + 1}      def forward(  # noqa: C901" in r.stdout
    assert "speculators==0.9.0" in r.stdout and "@conditional_torch_compile" in r.stdout


def test_cli_grep_finds_every_use_in_speculators(local_config):
    root = installed_package_dir("speculators")
    r = harness_cli(local_config, "inspect", "local", "--grep", "create_block_mask", "speculators", "-C", "0")
    assert r.returncode == 0, r.stderr
    ours = sorted(r.stdout.splitlines())
    grep = subprocess.run(["grep", "-rn", "--include=*.py", "create_block_mask", str(root)], capture_output=True, text=True).stdout
    theirs = sorted(line.replace(str(root.parent) + "/", "", 1) for line in grep.splitlines())
    assert ours == theirs and len(theirs) >= 2


def test_real_torch_compile_is_unwrapped(tmp_path, workdir):
    (workdir / "remote_scripts/compiled_mod.py").write_text("import torch\n\n\n@torch.compile\ndef double(x):\n    return x * 2\n")
    host = HostConfig(name="local", local=True, python=sys.executable)
    info = inspect_object(LocalTransport(), HostRuntime(host, str(workdir)), "compiled_mod.double", mode="import")
    assert [u.how for u in info.unwrapped] == ["torch.compile / torch._dynamo wrapper"]
    assert "torch/_dynamo/eval_frame.py" in info.unwrapped[0].where
    assert (info.first_line, info.source) == (4, "@torch.compile\ndef double(x):\n    return x * 2\n")


# ---------------------------------------------------------------------------------------------
# Over SSH (the sshd test bed)


@pytest.mark.ssh
def test_cli_over_ssh(tmp_path, workdir, ssh_host):
    config = tmp_path / "ssh-harness.toml"
    config.write_text(f'[hosts.box]\nssh = "{ssh_host.alias}"\nworkdir = "{workdir}"\npython = "{sys.executable}"\n')
    deco = str(workdir / "remote_scripts/inspectee/deco.py")
    r = harness_cli(config, "inspect", "box", "inspectee.deco.decorated", "--import", "--json", env=ssh_host.env())
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert (answer["file"], answer["first_line"]) == (deco, line_of(deco, "@logged"))
    assert [u["how"] for u in answer["unwrapped"]] == ["functools.wraps (__wrapped__)"] * 2
    r = harness_cli(config, "inspect", "box", "speculators.models.eagle3.core.Eagle3DraftModel.forward", env=ssh_host.env())
    assert r.returncode == 0 and "speculators==0.9.0" in r.stdout, r.stderr  # (how fast: bench/inspect_latency.py)
