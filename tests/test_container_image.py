"""The image's own checks and what happens before a stage starts a container, on the real engine:
the lock covers the base's Python (container/check_lock.py), the image records its versions from
package metadata (container/record_versions.py), doctor and build name the same image with a CA
bundle, a host without the image says "not built" (never a registry pull), and an engine that
refuses the configured ulimits is one line naming them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.docker_engine import container_table
from tests.fixtures.job_project import write_build_context, write_project

REPO = Path(__file__).resolve().parents[1]
HERE_PYTHON = "%d.%d" % sys.version_info[:2]


def harness(config: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# The lock and the versions record (the scripts the Dockerfile runs)


def test_the_lock_covers_the_supported_base_pythons():
    """3.11 (Debian bookworm: the test base) and 3.12 (the default vllm/vllm-openai base)."""
    sys.path.insert(0, str(REPO / "container"))
    try:
        import check_lock
    finally:
        sys.path.pop(0)
    assert {"3.11", "3.12"} <= set(check_lock.covered(REPO / "container" / "constraints.txt"))
    r = subprocess.run([sys.executable, str(REPO / "container" / "check_lock.py"), str(REPO / "container" / "constraints.txt")], capture_output=True, text=True)
    assert r.returncode == 0 and f"Python {HERE_PYTHON} is covered" in r.stdout


def test_a_base_python_the_lock_does_not_cover_fails_with_one_line(tmp_path):
    lock = tmp_path / "constraints.txt"
    lock.write_text("# python: 3.9 3.10\nsix==1.17.0\n")
    r = subprocess.run([sys.executable, str(REPO / "container" / "check_lock.py"), str(lock)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"check_lock: the base image's Python is {HERE_PYTHON}; the lock (container/constraints.txt) covers Python 3.9, 3.10 only")
    lock.write_text("six==1.17.0\n")  # a hand-written lock without the line
    r = subprocess.run([sys.executable, str(REPO / "container" / "check_lock.py"), str(lock)], capture_output=True, text=True)
    assert r.returncode == 1 and "regenerate it with scripts/lock-container-requirements.sh" in r.stderr


@pytest.mark.docker
def test_the_build_stops_on_a_base_python_the_lock_does_not_cover(tmp_path, docker_base_image):
    """The Dockerfile runs check_lock.py before pip touches the lock: a lock for other Pythons
    than the base's fails the build there, with the one line (here the base is bookworm's 3.11)."""
    config = docker_project(tmp_path, docker_base_image, "harness-lock-check-test", build_args={"INSTALL_ML": "0", "EXTRA_PIP_PACKAGES": "six==1.17.0"})
    lock = tmp_path / "container" / "constraints.txt"
    lock.write_text("".join("# python: 3.99\n" if line.startswith("# python:") else line for line in lock.read_text().splitlines(keepends=True)))
    r = harness(config, "build", "box")
    assert r.returncode == 1
    assert "check_lock: the base image's Python is 3.11; the lock (container/constraints.txt) covers Python 3.99 only" in r.stderr
    assert "Collecting six" not in r.stderr  # stopped before pip
    assert r.stderr.strip().splitlines()[-1].startswith("harness: error: remote command failed")


@pytest.mark.pipeline
def test_record_versions_reads_package_metadata(tmp_path):
    """speculators 0.9.0 has no __version__: the versions come from package metadata."""
    import importlib.metadata as md

    out = tmp_path / "opt" / "versions.json"
    r = subprocess.run([sys.executable, str(REPO / "container" / "record_versions.py"), str(out), "--require", "torch", "transformers", "speculators"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    recorded = json.loads(out.read_text())
    assert recorded == {"torch": md.version("torch"), "transformers": md.version("transformers"), "speculators": md.version("speculators"), "vllm": None}
    assert r.stdout.strip() == f"image versions: torch {md.version('torch')}, transformers {md.version('transformers')}, speculators {md.version('speculators')}, vllm absent"
    missing = subprocess.run([sys.executable, str(REPO / "container" / "record_versions.py"), str(tmp_path / "v2.json"), "--require", "vllm"], capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and missing.stderr.strip() == "record_versions: vllm is not installed after the ML install"
    assert not (tmp_path / "v2.json").exists()


# ---------------------------------------------------------------------------------------------
# Before a stage starts a container (real engine)


def docker_project(tmp_path: Path, base_image: str, image: str, **container) -> Path:
    write_build_context(tmp_path)
    return write_project(tmp_path, tmp_path / "work", {}, host_table={"runtime": "docker"}, container=container_table(base_image, image=image, **container))


def engine_memlock(image: str) -> tuple[bool, str]:
    """What the Docker engine lets a container do with memlock: whether `--ulimit memlock=-1`
    starts, and the hard limit a container gets without the option (/proc/self/limits inside)."""
    raised = subprocess.run(["docker", "run", "--rm", "--pull=never", "--ulimit", "memlock=-1:-1", image, "true"], capture_output=True, text=True)
    limits = subprocess.run(["docker", "run", "--rm", "--pull=never", image, "cat", "/proc/self/limits"], capture_output=True, text=True, check=True)
    row = next(line for line in limits.stdout.splitlines() if line.startswith("Max locked memory"))
    return raised.returncode == 0, row[len("Max locked memory"):].split()[1]


def doctor_checks(config: Path) -> tuple[int, dict[str, dict]]:
    r = harness(config, "doctor", "box", "--json")
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)["checks"]}


@pytest.mark.docker
def test_doctor_names_the_image_build_made_with_a_ca_bundle(tmp_path, docker_base_image):
    """The tag covers the CA bundle's bytes in doctor as in build: right after a build, doctor
    reports the image ok (it used to hash without the bundle and say "not built")."""
    ca = tmp_path / "extra-ca.pem"
    ca.write_text("# an extra CA bundle for the test (comments only: the image's TLS is unchanged)\n")
    config = docker_project(tmp_path, docker_base_image, "harness-ca-doctor-test", ca_bundle=str(ca))
    built = harness(config, "build", "box")
    assert built.returncode == 0, built.stderr[-2000:]
    _, checks = doctor_checks(config)
    assert checks["image"]["status"] == "ok", checks["image"]
    assert checks["container"]["status"] == "ok", checks["container"]


@pytest.mark.docker
def test_before_the_first_build_doctor_and_run_say_not_built(tmp_path, docker_base_image):
    image = "harness-never-built-test"  # never built by any test: no :latest on the engine
    config = docker_project(tmp_path, docker_base_image, image)
    code, checks = doctor_checks(config)
    assert code == 1
    assert checks["container"]["status"] == "fail" and checks["container"]["message"] == f"box: {image}:latest not built: harness build box"
    assert checks["stage-gpus"]["fix"] == "harness build box"
    assert all("Unable to find image" not in c["message"] for c in checks.values())  # docker never went looking
    r = harness(config, "run", "box", "prepare")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"harness: error: box: {image}:latest not built: harness build box"]
    assert not (tmp_path / "work" / "runs").exists() or not any((tmp_path / "work" / "runs").iterdir())
    # exec, shell and inspect start containers too: --pull=never, docker's own error, no pull
    r = harness(config, "exec", "box", "--", "true")
    assert r.returncode == 125 and "No such image" in r.stderr and "Unable to find image" not in r.stderr


@pytest.mark.docker
def test_an_engine_that_refuses_the_ulimits_is_one_line_naming_them(tmp_path, docker_base_image, harness_test_image):
    """An engine without CAP_SYS_RESOURCE cannot start a container with memlock above its hard
    limit (the production default, -1): run and doctor say so in one line, before any stage runs.
    The engine itself is asked (a real container), not this process's own limit. An engine that
    may raise it (root dockerd with every capability) refuses nothing: there -1 must start, and the
    one line from runc's refusal is held by test_doctor_ml's recorded runc error instead."""
    write_build_context(tmp_path)
    container = {**container_table(docker_base_image), "ulimits": {"memlock": -1}}
    may_raise, hard = engine_memlock(harness_test_image)
    if may_raise:
        config = write_project(tmp_path, tmp_path / "work", {}, host_table={"runtime": "docker"}, container=container)
        _, checks = doctor_checks(config)
        assert checks["container"]["status"] == "ok", checks["container"]
        return
    config = write_project(tmp_path, tmp_path / "work", {}, host_table={"runtime": "docker"}, container=container)
    expected = f"box: the Docker engine refused container.ulimits memlock = -1: the host's hard limit for memlock is {hard}"
    fix = f"set hosts.box.container.ulimits = {{ memlock = {hard} }} or raise the engine's limit (e.g. LimitMEMLOCK= in docker.service)"
    r = harness(config, "run", "box", "prepare")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"harness: error: {expected} ({fix})"]
    _, checks = doctor_checks(config)
    assert (checks["container"]["status"], checks["container"]["message"], checks["container"]["fix"]) == ("fail", expected, fix)
    assert checks["stage-gpus"]["fix"] == "see the container check"
    # the same limit the engine allows starts: the one line's fix works
    container["ulimits"] = {"memlock": int(hard)}
    config = write_project(tmp_path, tmp_path / "work", {}, host_table={"runtime": "docker"}, container=container)
    _, checks = doctor_checks(config)
    assert checks["container"]["status"] == "ok", checks["container"]
