"""`harness sources`: a package's Python sources as installed where the stages run, mirrored over
the real sshd test bed; byte for byte, incremental (a second call moves nothing), pruned, and one
error line for an unknown package. The docker variant reads a package that lives in the image."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pathspec
import typing_extensions
from harness.config import load_config
from harness.runtime import runtime_for
from harness.sources import SOURCE_PATTERNS, mirror
from harness.transport import connect
from tests.fixtures.docker_engine import TEST_IMAGE, container_table
from tests.fixtures.job_project import write_project

pytestmark = pytest.mark.ssh


def source_tree(root: Path) -> dict[str, bytes]:
    """rel -> bytes of the files a mirror should hold (.py, .pyi, py.typed; no __pycache__)."""
    spec = pathspec.GitIgnoreSpec.from_lines(list(SOURCE_PATTERNS))
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and spec.match_file(p.relative_to(root).as_posix())}


@pytest.fixture
def venv_host(tmp_path, ssh_host):
    """A venv on the test host holding a real package (pathspec: subpackages, py.typed) and a
    single-module one (typing_extensions), installed as pip leaves them (package + dist-info);
    the host's `python` is the venv's interpreter. Returns (config, site-packages)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    installed = Path(pathspec.__file__).parent.parent
    shutil.copytree(Path(pathspec.__file__).parent, site / "pathspec", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(typing_extensions.__file__, site / "typing_extensions.py")
    for dist in ("pathspec", "typing_extensions"):
        for info in installed.glob(f"{dist}-*.dist-info"):
            shutil.copytree(info, site / info.name)
    config = write_project(tmp_path / "project", tmp_path / "work", {}, host_table={
        "local": False, "ssh": ssh_host.alias, "connect_timeout": 5, "python": str(venv / "bin" / "python")})
    return config, site


def harness(config: Path, ssh_host, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=300, env=ssh_host.env())


def test_mirror_is_byte_for_byte_incremental_and_pruned(tmp_path, ssh_host, venv_host):
    config_path, site = venv_host
    dest = tmp_path / "project" / ".harness" / "sources" / "box"
    r = harness(config_path, ssh_host, "sources", "box", "pathspec", "typing_extensions")
    assert r.returncode == 0, r.stderr
    assert source_tree(dest / "pathspec") == source_tree(site / "pathspec")
    assert "py.typed" in source_tree(dest / "pathspec") and not list(dest.rglob("*.pyc"))
    assert (dest / "typing_extensions.py").read_bytes() == (site / "typing_extensions.py").read_bytes()
    assert '"extraPaths": [".harness/sources/box"]' in r.stdout and '"python.analysis.extraPaths"' in r.stdout
    assert f"pathspec {pathspec.__version__}: {len(source_tree(site / 'pathspec'))} fetched" in r.stderr
    as_json = harness(config_path, ssh_host, "sources", "box", "pathspec", "--json")
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)  # the whole of stdout
    (package,) = report["packages"]
    assert (report["host"], report["dest"], report["ok"], package["package"], package["version"]) == ("box", str(dest), True, "pathspec", pathspec.__version__)
    assert (package["fetched"], package["removed"], sorted(package["identical"])) == ([], [], sorted(source_tree(site / "pathspec")))
    assert report["editor"]["pyright (pyrightconfig.json)"] == '{"extraPaths": [".harness/sources/box"]}'

    config = load_config(config_path)
    host = config.host("box")
    with connect(host, ssh_host.connect_options()) as transport:
        runtime = runtime_for(host, transport)
        again = mirror(transport, runtime, ["pathspec", "typing_extensions"], dest, host_python=host.python)
        assert [(m.fetched, m.bytes_received, m.removed) for m in again] == [([], 0, []), ([], 0, [])]  # nothing moved
        assert len(again[0].identical) == len(source_tree(site / "pathspec"))

        # the package changes on the host: one file edited, one added, one gone
        (site / "pathspec" / "util.py").write_bytes((site / "pathspec" / "util.py").read_bytes() + b"\n# changed on the host\n")
        (site / "pathspec" / "added.pyi").write_text("def f() -> int: ...\n")
        (site / "pathspec" / "_meta.py").unlink()
        (after,) = mirror(transport, runtime, ["pathspec"], dest, host_python=host.python)
    assert sorted(after.fetched) == ["added.pyi", "util.py"] and after.removed == ["_meta.py"]
    assert source_tree(dest / "pathspec") == source_tree(site / "pathspec")


def test_unknown_package_is_one_error_line(tmp_path, ssh_host, venv_host):
    config_path, _ = venv_host
    r = harness(config_path, ssh_host, "sources", "box", "pathspec", "pathspek", "no_such_package")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "harness: error: box: no Python package named 'pathspek' (did you mean pathspec?), 'no_such_package' where the stages run "
        f"({tmp_path / 'venv' / 'bin' / 'python'}, runtime host)"
    ]
    assert not (tmp_path / "project" / ".harness" / "sources").exists()  # nothing moved, not even pathspec


@pytest.mark.docker
def test_docker_host_mirrors_the_images_package(tmp_path, ssh_host, harness_test_image, docker_base_image):
    """The package lives in the image (here the stdlib's json: the test image has no ML
    libraries): copied to the workdir's cache by the container, then pulled; a second call moves
    nothing."""
    config_path = write_project(tmp_path / "project", tmp_path / "work", {},
                                host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5, "runtime": "docker"},
                                container=container_table(docker_base_image))
    dest = tmp_path / "mirror"
    owner = 54321  # the workdir's owner, not the container's root: the cache must be theirs
    (tmp_path / "work").mkdir(exist_ok=True)
    os.chown(tmp_path / "work", owner, owner)
    r = harness(config_path, ssh_host, "sources", "box", "json", "--dest", str(dest))
    assert r.returncode == 0, r.stderr
    listing = ("import hashlib, json, os, pathlib\n"
               "root = pathlib.Path(json.__file__).parent\n"
               "print(json.dumps({p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()"
               " for p in root.rglob('*') if p.is_file() and p.suffix in ('.py', '.pyi') and '__pycache__' not in p.parts}))\n")
    image = subprocess.run(["docker", "run", "--rm", "--pull=never", f"{TEST_IMAGE}:latest", "python3", "-c", listing],
                           capture_output=True, text=True, timeout=120, check=True)
    in_image = json.loads(image.stdout)
    mirrored = {rel: hashlib.sha256(data).hexdigest() for rel, data in source_tree(dest / "json").items()}
    assert in_image and mirrored == in_image
    cache = tmp_path / "work" / ".harness" / "sources" / "json"
    assert {(p.stat().st_uid, p.stat().st_gid) for p in [cache.parent, *cache.rglob("*")]} == {(owner, owner)}
    config = load_config(config_path)
    host = config.host("box")
    with connect(host, ssh_host.connect_options()) as transport:
        (again,) = mirror(transport, runtime_for(host, transport), ["json"], dest, host_python=host.python)
    assert (again.fetched, again.bytes_received, again.removed) == ([], 0, [])
