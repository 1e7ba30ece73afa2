"""`harness build`: the content-hash tag, no rebuild of an unchanged image, streamed output, and
the extra CA bundle + pip path of container/Dockerfile on a real Docker engine, through a
TLS-inspecting proxy the test runs itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.errors import UsageError
from harness.runtime.image import build, gather_inputs, image_id, refuse_secret_build_args
from harness.transport.local import LocalTransport
from tests.fixtures.docker_engine import container_table
from tests.fixtures.job_project import FAKE_STAGE, write_build_context, write_project
from tests.fixtures.tls_proxy import PROBE, PROBE_VERSION, WHEEL, TlsInspectingProxy

BUILD_TEST_IMAGE = "harness-build-test"  # not the job tests' image: these tests retag :latest


def project(tmp_path: Path, base_image: str, **container) -> Path:
    write_build_context(tmp_path)
    return write_project(tmp_path, tmp_path / "work", {}, host_table={"runtime": "docker"}, container=container_table(base_image, image=BUILD_TEST_IMAGE, **container))


def test_content_hash_covers_every_input(tmp_path):
    config = load_config(project(tmp_path, "base:1"))
    host = config.host("box")
    first = gather_inputs(config, host)
    assert gather_inputs(config, host).content_hash == first.content_hash  # deterministic
    assert gather_inputs(config, host).context_tar() == first.context_tar()
    assert "container/Dockerfile" in first.files and "remote_scripts/train_draft.py" in first.files
    assert gather_inputs(config, host, extra_ca=b"CA").content_hash != first.content_hash
    (tmp_path / "remote_scripts" / "__pycache__").mkdir()
    (tmp_path / "remote_scripts" / "__pycache__" / "x.pyc").write_bytes(b"junk")  # not an input
    assert gather_inputs(config, host).content_hash == first.content_hash
    (tmp_path / "remote_scripts" / "train_draft.py").write_text("print('changed')\n")
    assert gather_inputs(config, host).content_hash != first.content_hash
    other = load_config(project(tmp_path / "b", "base:2"))
    assert gather_inputs(other, other.host("box")).build_args["BASE_IMAGE"] == "base:2"


def test_missing_context_directory_is_one_error_before_any_build(tmp_path):
    import shutil

    from harness.errors import UsageError

    config = load_config(project(tmp_path, "base:1"))
    shutil.rmtree(tmp_path / "remote_scripts")
    with pytest.raises(UsageError, match=r"remote_scripts/ not found next to harness.toml"):
        gather_inputs(config, config.host("box"))


@pytest.mark.docker
def test_unchanged_image_is_not_rebuilt_and_a_change_is(tmp_path, docker_base_image):
    config_path = project(tmp_path, docker_base_image)
    config = load_config(config_path)
    host = config.host("box")
    transport = LocalTransport()
    out: list[bytes] = []
    first = build(transport, config, host, output=out.append)
    assert first.ref.startswith(BUILD_TEST_IMAGE + ":") and first.image_id.startswith("sha256:")
    assert image_id(transport, first.ref) == first.image_id == image_id(transport, f"{BUILD_TEST_IMAGE}:latest")
    # the CLI: same inputs -> found, not rebuilt, and no build output at all
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == first.image_id and "unchanged, not rebuilt" in r.stderr and "Step" not in r.stderr
    assert time.monotonic() - t0 < 60  # generous (loaded CI): the proof is the message and no build output
    # a changed stage script is a new input: new tag, real build, streamed output
    changed = FAKE_STAGE + f"# v2 {os.urandom(8).hex()}\n"  # unique: images persist across sessions
    (tmp_path / "remote_scripts" / "evaluate.py").write_text(changed)
    dry = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box", "--dry-run", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["hosts"]["box"]
    assert plan["would_build"] is True and plan["built"] is False and plan["image_id"] is None and plan["ref"] != first.ref
    assert image_id(transport, plan["ref"], strict=False) is None  # nothing built or tagged
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "COPY remote_scripts/" in r.stderr and "built: " in r.stderr
    second = r.stdout.strip()
    assert second != first.image_id and image_id(transport, f"{BUILD_TEST_IMAGE}:latest") == second
    baked = subprocess.run(["docker", "run", "--rm", second, "cat", "/opt/harness/remote_scripts/evaluate.py"], capture_output=True, text=True, timeout=60)
    assert baked.stdout == changed
    subprocess.run(["docker", "rmi", "-f", second], capture_output=True, timeout=60)  # one-off image


CACHE_TEST_DOCKERFILE = """ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG VARIANT=a
COPY container/requirements.txt /opt/harness/
RUN echo "$VARIANT $(cat /proc/sys/kernel/random/uuid)" > /opt/harness/expensive
COPY remote_scripts/ /opt/harness/remote_scripts/
"""


def layers(ref: str) -> list[str]:
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RootFS.Layers}}", ref], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.docker
def test_a_script_edit_reuses_the_expensive_layer_after_another_build_of_the_dockerfile(tmp_path, docker_base_image):
    """The classic builder takes the NEWEST image with an identical step: after a --no-cache build
    of the same Dockerfile with other args (the suite's INSTALL_ML=0 next to the ML image), a
    script edit re-ran the expensive step (the pip layer). Each build now names its cache
    (--cache-from the last image built from the same container/): only the layers after the
    scripts' COPY are made again. The expensive step writes a fresh uuid, so a re-run shows."""
    unique = os.urandom(8).hex()  # a COPY layer of this test's own: images persist across sessions
    configs = {}
    for variant in ("a", "b"):
        root = tmp_path / variant
        write_build_context(root)
        (root / "container" / "requirements.txt").write_text(f"# {unique}\n")
        (root / "container" / "Dockerfile.cache").write_text(CACHE_TEST_DOCKERFILE)
        path = write_project(root, root / "work", {}, host_table={"runtime": "docker"},
                             container=container_table(docker_base_image, image="harness-cache-test", dockerfile="container/Dockerfile.cache", build_args={"VARIANT": variant}))
        configs[variant] = load_config(path)
    transport = LocalTransport()
    made: list[str] = []
    try:
        first = build(transport, configs["a"], configs["a"].host("box"), output=lambda _: None)
        made.append(first.image_id)
        # another build of the same Dockerfile in between, from scratch: a newer twin of every step before the args differ
        other = build(transport, configs["b"], configs["b"].host("box"), output=lambda _: None, force=True)
        made.append(other.image_id)
        (tmp_path / "a" / "remote_scripts" / "evaluate.py").write_text(FAKE_STAGE + "# edited\n")
        out: list[bytes] = []
        again = build(transport, configs["a"], configs["a"].host("box"), output=out.append)
        made.append(again.image_id)
        assert again.built and again.image_id != first.image_id
        before, after = layers(first.image_id), layers(again.image_id)
        assert len(after) == len(before) and after[:-1] == before[:-1], b"".join(out).decode()[-2000:]  # the expensive layer reused
        assert after[-1] != before[-1]  # the scripts' layer made again
        assert layers(other.image_id)[-2] != before[-2]  # the other build's expensive layer is its own
    finally:
        subprocess.run(["docker", "rmi", "-f", *made], capture_output=True, timeout=120)  # this test's images only


@pytest.mark.docker
@pytest.mark.ssh
def test_ctrl_c_stops_the_build_on_the_box(tmp_path, ssh_host, box_user, docker_base_image):
    """Before: Ctrl-C hung up the ssh session and said "aborted", while `docker build` went on on
    the box (nothing signals a command without a terminal; it would see its closed pipe only when
    it next printed). Now the build's docker client on the box is ended, which cancels the build
    on the engine, its step's container included, and the command says so in one line."""
    import pwd
    import queue
    import signal
    import threading

    token = os.urandom(6).hex()
    root = tmp_path / "project"
    write_build_context(root)
    (root / "container" / "Dockerfile.slow").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\nRUN echo slow-{token} && sleep 300\n")
    workdir = Path(pwd.getpwnam(box_user.name).pw_dir) / f"harness-{tmp_path.name}"
    config = write_project(root, workdir, {}, host_table={"local": False, "ssh": f"{box_user.name}@{ssh_host.alias}", "connect_timeout": 5, "runtime": "docker"},
                           container=container_table(docker_base_image, image=f"harness-stop-{token}", dockerfile="container/Dockerfile.slow"))

    def step_containers() -> list[str]:  # the slow step's container on the engine, running or not
        r = subprocess.run(["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"], capture_output=True, text=True, timeout=60)
        return [line for line in r.stdout.splitlines() if f"slow-{token}" in line]

    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "build", "box"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ssh_host.env())
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in iter(proc.stderr.readline, b"")], daemon=True).start()
    said = []
    try:
        deadline = time.monotonic() + 120
        while f"slow-{token}\n".encode() not in said:  # the step's own output: it runs on the engine
            said.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        assert step_containers(), "the slow step runs in no container"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    while not lines.empty():
        said.append(lines.get())
    text = b"".join(said).decode()
    assert proc.returncode == 130, text
    assert text.strip().splitlines()[-1] == "harness: the build on box stopped: its docker build ended there", text
    deadline = time.monotonic() + 30
    while step_containers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert step_containers() == []  # the engine cancelled the build and removed its step's container
    ps = subprocess.run(["ps", "-u", box_user.name, "-o", "args="], capture_output=True, text=True, timeout=30)
    assert f"harness-stop-{token}" not in ps.stdout  # no docker build client left on the box


@pytest.mark.docker
@pytest.mark.ssh
def test_ctrl_c_stops_a_groups_builds_on_each_host(tmp_path, ssh_host, docker_base_image):
    """`harness build GROUP`: one build per host, each in a thread; Ctrl-C in the main thread ends
    each host's docker build, not only the command."""
    import signal

    from tests.fixtures.job_project import toml_value

    token = os.urandom(6).hex()
    root = tmp_path / "project"
    write_build_context(root)
    (root / "container" / "Dockerfile.slow").write_text(f"ARG BASE_IMAGE\nFROM ${{BASE_IMAGE}}\nRUN echo slow-{token} && sleep 300\n")
    lines = []
    for name in ("a", "b"):
        lines += [f"[hosts.{name}]", f"ssh = {toml_value(ssh_host.alias)}", f"workdir = {toml_value(str(tmp_path / 'work' / name))}", 'runtime = "docker"',
                  "connect_timeout = 5", f"[hosts.{name}.container]"]
        table = container_table(docker_base_image, image=f"harness-stop-{token}-{name}", dockerfile="container/Dockerfile.slow")
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    lines += ["[groups.pair]", 'hosts = ["a", "b"]', "rdzv_port = 0"]
    config = root / "harness.toml"
    config.write_text("\n".join(lines) + "\n")

    def step_containers() -> list[str]:
        r = subprocess.run(["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"], capture_output=True, text=True, timeout=60)
        return [line for line in r.stdout.splitlines() if f"slow-{token}" in line]

    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "build", "pair"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ssh_host.env())
    try:
        deadline = time.monotonic() + 120
        while len(step_containers()) < 2:  # both hosts' slow steps run on the engine
            assert time.monotonic() < deadline and proc.poll() is None, "the slow steps never ran"
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.decode()
    assert proc.returncode == 130 and text.strip().splitlines()[-1] == "harness: the build on pair stopped: its docker build ended there", text
    deadline = time.monotonic() + 30
    while step_containers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert step_containers() == []


class Recording(LocalTransport):
    """This machine, with every command line the build starts written down."""

    def __init__(self):
        super().__init__()
        self.argvs: list[list[str]] = []

    def run(self, argv, **kw):
        self.argvs.append(list(argv))
        return super().run(argv, **kw)


@pytest.mark.docker
def test_build_arg_values_stay_off_command_lines_and_secrets_are_refused(tmp_path, docker_base_image):
    value = f"six-{os.urandom(6).hex()}"  # unique: its own image
    config = load_config(project(tmp_path, docker_base_image, build_args={"INSTALL_ML": "0", "EXTRA_PIP_PACKAGES": "", "HARNESS_PROBE": value}))
    transport = Recording()
    result = build(transport, config, config.host("box"), output=lambda _: None)
    assert transport.argvs and not any(value in word for argv in transport.argvs for word in argv), transport.argvs
    assert any("HARNESS_PROBE" in argv for argv in transport.argvs)  # passed by name
    subprocess.run(["docker", "rmi", "-f", result.image_id], capture_output=True, timeout=60)
    for args in ({"PIP_TOKEN": "t0k3n"}, {"EXTRA_PIP_PACKAGES": "--index-url https://me:hunter2@pypi.example/simple x"}):
        config = load_config(project(tmp_path / str(len(args)) / next(iter(args)), docker_base_image, build_args=args))
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config.path), "build", "box"], capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and f"container.build_args.{next(iter(args))}: looks like a secret" in lines[0], r.stderr
        assert "hunter2" not in r.stderr and "t0k3n" not in r.stderr


@pytest.mark.parametrize("value, secret", [
    ("git+https://ghp_T0KEN@github.com/me/pkg.git", True),  # a bare token as the URL's user
    ("--index-url https://me:hunter2@pypi.example/simple x", True),
    ("https://files.example/pkg.whl?token=abc", True),
    ("https://blob.example/pkg.whl?sv=1&sig=abc", True),
    ("git+ssh://git@github.com/me/pkg.git", False),  # ssh's user, no credential
    ("six==1.17.0 https://files.example/pkg.whl?version=2", False),
])
def test_credentials_in_a_build_arg_url_are_refused(tmp_path, value, secret):
    config = load_config(project(tmp_path, "base:1", build_args={"EXTRA_PIP_PACKAGES": value}))
    if secret:
        with pytest.raises(UsageError, match="EXTRA_PIP_PACKAGES: looks like a secret"):
            refuse_secret_build_args(config, config.host("box"))
    else:
        refuse_secret_build_args(config, config.host("box"))


@pytest.mark.docker
def test_build_error_is_one_line_and_exit_code(tmp_path, docker_base_image):
    config_path = project(tmp_path, "harness-no-such-base:1")
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("harness: error: remote command failed")
    assert "Traceback" not in r.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_extra_ca_bundle_lets_pip_through_a_tls_inspecting_proxy(tmp_path, docker_base_image):
    """pip in the image goes through a TLS-inspecting proxy (tests/fixtures/tls_proxy.py: its own
    CA, on loopback, the build's pip pointed at it by HTTPS_PROXY): without `container.ca_bundle`
    the proxy's certificate is refused; with the proxy's CA as the bundle the same build installs
    the package the proxy served."""
    with TlsInspectingProxy(tmp_path / "proxy") as proxy:
        args = {"INSTALL_ML": "0", "EXTRA_PIP_PACKAGES": f"{PROBE}=={PROBE_VERSION}", "HTTPS_PROXY": proxy.url}
        # the proxy listens on the box's loopback: a build reaches it only on the host's network, as configured
        config_path = project(tmp_path / "without", docker_base_image, build_args=args, build_network="host")
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box", "--force"], capture_output=True, text=True, timeout=600)
        assert r.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr[-3000:]
        assert "pypi.org" in proxy.connects and proxy.served == []  # pip did go through the proxy, and got nothing
        config_path = project(tmp_path / "with", docker_base_image, ca_bundle=str(proxy.ca), build_args=args, build_network="host")
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config_path), "build", "box", "--force"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "added extra CA bundle" in r.stderr and f"Successfully installed {PROBE}-{PROBE_VERSION}" in r.stderr
        assert f"/packages/{WHEEL}" in proxy.served
    image = r.stdout.strip()
    ran = subprocess.run(["docker", "run", "--rm", image, "python3", "-c", "import harness_ca_probe; print(harness_ca_probe.VERSION)"], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == PROBE_VERSION, ran.stderr
    subprocess.run(["docker", "rmi", "-f", image], capture_output=True, timeout=60)  # one-off image
