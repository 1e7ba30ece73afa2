"""harness.toml validation: every problem is ONE line naming the file and the key, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_config
from harness.errors import ConfigError, UsageError


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "harness.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ('[hosts.gpu]\nssh = "u@h"\nworkdri = "/x"\n', "hosts.gpu.workdri", "unknown key"),
        ('[hosts.gpu]\nssh = 22\n', "hosts.gpu.ssh", "expected a string, got int 22"),
        ('[hosts.gpu]\nssh = "u@h"\nconnect_timeout = "10"\n', "hosts.gpu.connect_timeout", "expected a number"),
        ('[hosts.gpu]\nssh = "u@h"\nruntime = "podman"\n', "hosts.gpu.runtime", "expected one of 'docker', 'host'"),
        ('[hosts.gpu]\nssh = "u@h"\n[hosts.gpu.container]\nshm_size = 16\n', "hosts.gpu.container.shm_size", "expected a string"),
        ('[hosts.gpu]\nworkdir = "/x"\n', "hosts.gpu", "expected ssh ="),
        ('[hostz.gpu]\nssh = "u@h"\n', "hostz", "unknown key"),
        # a host's name is its table's key; `name` inside the table would silently lose
        ('[hosts.gpu]\nssh = "u@h"\nname = "other"\n', "hosts.gpu.name", "unknown key"),
        ('[hosts.gpu]\nssh = "u@h"\ngpus = [0, 0]\n', "hosts.gpu.gpus", "distinct GPU indices"),
        ('[hosts.gpu]\nssh = "u@h"\ngpus = [-1]\n', "hosts.gpu.gpus", "distinct GPU indices"),
        ('[hosts.gpu]\nssh = "u@h"\nruntime = "docker"\ngpus = [1]\n', "hosts.gpu.gpus", "container.gpus"),
        ('[hosts.gpu]\nssh = "u@h"\nkeepalive = 5\nkeepalive_s = 5\n', "hosts.gpu.keepalive_s", "keep one of them"),
        ('[hosts.gpu]\nssh = "u@h"\nkeepalive_s = 0\n', "hosts.gpu.keepalive", "seconds >= 1"),
    ],
)
def test_invalid_config_is_one_line_naming_file_and_key(tmp_path, text, key, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key and expected in e.value.problem
    r = cli("hosts", cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"harness: error: {path}")
    assert f": {key}: " in lines[0] and expected in lines[0]


@pytest.mark.parametrize("key", ["keepalive", "keepalive_s"])
def test_both_spellings_of_keepalive_are_one_setting(tmp_path, key):
    """`keepalive` is the documented key; `keepalive_s` (the transport's old name) reads the same,
    down to the ssh option and `harness hosts --json`."""
    from harness.transport.connection import ConnectionSpec

    write(tmp_path, f'[hosts.gpu]\nssh = "u@h"\n{key} = 7\n')
    host = load_config(tmp_path / "harness.toml").host("gpu")
    assert host.keepalive == ConnectionSpec.of(host).keepalive == 7
    r = cli("hosts", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"]["gpu"]["keepalive"] == 7


def test_unknown_host_suggests_the_near_match(tmp_path):
    write(tmp_path, '[hosts.gpu]\nssh = "u@h"\n[hosts.local]\nlocal = true\n')
    r = cli("exec", "gpu2", "--", "true", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"harness: error: {tmp_path / 'harness.toml'}: unknown host 'gpu2' (did you mean 'gpu'?)"]



@pytest.mark.parametrize("argv", [
    ["exec", "pair", "--", "true"], ["shell", "pair"], ["inspect", "pair", "json.dumps"], ["pull", "pair", "last"],
    ["sources", "pair", "json"], ["forward", "pair", "8000"], ["tensorboard", "pair"],
])
def test_a_group_is_refused_by_the_commands_of_one_host(tmp_path, argv):
    # the hosts are unreachable (a closed port): the refusal comes before any connection (exit 255)
    write(tmp_path, '[hosts.a]\nssh = "u@127.0.0.1:1"\n[hosts.b]\nssh = "u@127.0.0.1:1"\n[groups.pair]\nhosts = ["a", "b"]\n')
    r = cli(*argv, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["harness: error: pair is a group (a, b): this command takes one host; name one of them"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["harness.toml"]  # nothing pulled, nothing written

def test_missing_config_and_bad_toml(tmp_path):
    r = cli("hosts", cwd=tmp_path)
    assert r.returncode == 2 and "no harness.toml" in r.stderr and "harness init" in r.stderr
    write(tmp_path, "[hosts.gpu\n")
    r = cli("hosts", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "invalid TOML" in r.stderr


def test_init_writes_a_valid_starter_and_never_overwrites(tmp_path):
    (tmp_path / "remote_scripts").mkdir()  # init writes beside the code sync sends (tests/test_first_session.py)
    (tmp_path / "container").mkdir()
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path = tmp_path / "harness.toml"
    text = path.read_text()
    assert text.count("#") > 10  # commented
    config = load_config(path)
    assert config.hosts["local"].is_local and config.hosts["gpu"].runtime == "docker"
    path.write_text(text + "# mine\n")
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 2 and "already exists" in r.stderr
    assert path.read_text().endswith("# mine\n")


def test_hosts_lists_hosts_and_groups(tmp_path):
    write(tmp_path, '[hosts.a]\nssh = "u@h:2222"\n[hosts.b]\nlocal = true\n[groups.pair]\nhosts = ["a", "b"]\n')
    r = cli("hosts", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "u@h:2222" in r.stdout and "pair" in r.stdout and "local" in r.stdout


def test_bad_ssh_target_is_a_usage_error():
    from harness.transport.openssh import SSHTarget

    assert SSHTarget.parse("me@box:2222") == SSHTarget("box", "me", 2222)
    assert SSHTarget.parse("alias") == SSHTarget("alias")
    assert SSHTarget.parse("[::1]:22") == SSHTarget("::1", "", 22)
    for bad in ("me@box:99999", "-oProxyCommand=x", "a b"):
        with pytest.raises(UsageError):
            SSHTarget.parse(bad)


def test_host_gpus_limit_what_the_stages_see(tmp_path):
    """`gpus` on a host-runtime host becomes the CUDA_VISIBLE_DEVICES of what runs there (one
    node per GPU of a shared box); run for real through the local transport."""
    from harness.runtime import runtime_for
    from harness.transport.local import LocalTransport

    config = load_config(write(tmp_path, f'[hosts.n1]\nlocal = true\nworkdir = "{tmp_path}"\ngpus = [1, 3]\n[hosts.all]\nlocal = true\nworkdir = "{tmp_path}"\n'))
    show = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]
    for host, expected in (("n1", "1,3"), ("all", "unset")):
        transport = LocalTransport(host)
        result = transport.run(runtime_for(config.host(host), transport).wrap(show))
        assert result.ok and result.text.strip() == expected, (host, result.text)
