"""The CPU half of carrying vLLM to the GPU machine (bench/gpu/vllm_carry.py), with real pip on
wheels made here: derive (what the image lacks, from the wheels' metadata, markers and extras
followed), split into parts no larger than asked, assemble (checked against the manifest) and
install into a scratch directory for the device's platform (Python 3.12, manylinux x86-64)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.fixtures.pipeline_data import REPO_ROOT

CARRY = REPO_ROOT / "bench" / "gpu" / "vllm_carry.py"


def make_wheel(index: Path, name: str, version: str, requires: list[str], payload: bytes = b"") -> Path:
    """A pure-Python wheel: NAME/__init__.py (with `payload` as a data file) and its metadata."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(), f"{name}/payload.bin": payload,
             f"{dist}/METADATA": ("Metadata-Version: 2.1\n" + f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n" for path, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    path = index / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, data in files.items():
            z.writestr(member, data)
    return path


def carry(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's index settings are not the test's
    return subprocess.run([sys.executable, str(CARRY), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def index_of(tmp_path: Path) -> Path:
    index = tmp_path / "index"
    index.mkdir()
    make_wheel(index, "topvllm", "1.0", ["alpha>=1", "beta[fast]<3", 'gamma; sys_platform == "win32"', "delta>=2", "epsilon",
                                         'theta; python_version < "3.12"', 'iota[x]; python_version >= "3.12"'])
    make_wheel(index, "alpha", "1.2", [], payload=os.urandom(40_000))  # larger than a part: cut into chunks
    make_wheel(index, "beta", "2.0", ['zeta; extra == "fast"', 'eta; extra == "slow"'])
    make_wheel(index, "delta", "2.1", [])
    make_wheel(index, "zeta", "1.0", ["alpha"])
    make_wheel(index, "iota", "1.0", ['kappa; extra == "x"'])
    make_wheel(index, "kappa", "1.0", [])
    return index


def test_derive_split_assemble_and_install_for_the_device(tmp_path):
    index = index_of(tmp_path)
    image = tmp_path / "image-packages.txt"
    image.write_text("epsilon==1.0\ndelta==1.5\ntorch==2.11.0\n")  # delta too old for delta>=2: carried
    pip = ["--pip-arg=--no-index", f"--pip-arg=--find-links={index}"]
    derived = carry("derive", str(tmp_path / "wheels"), "--requirement", "topvllm==1.0", "--image-packages", str(image), *pip, cwd=tmp_path)
    assert derived.returncode == 0, derived.stdout + derived.stderr
    report = json.loads((tmp_path / "wheels" / "carry.json").read_text())
    assert sorted(report["taken"]) == ["alpha", "beta", "delta", "iota", "kappa", "topvllm", "zeta"]  # not gamma (win32), theta (< 3.12), eta (another extra)
    assert report["in_image"] == {"epsilon": "1.0"} and report["transitive"] and not report["failed"]
    assert report["taken"]["zeta"]["why"] == "beta 2.0" and report["taken"]["kappa"]["why"] == "iota 1.0"
    originals = {w.name: w.read_bytes() for w in (tmp_path / "wheels").glob("*.whl")}

    part_bytes = 16 * 1024
    split = carry("split", str(tmp_path / "wheels"), str(tmp_path / "part"), "--part-mib", str(part_bytes / 2**20), cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    parts = [Path(line) for line in split.stdout.split()]
    assert len(parts) >= 3 and all(sum(f.stat().st_size for f in p.iterdir() if f.name != "manifest.json") <= part_bytes for p in parts)

    missing = carry("assemble", *map(str, parts[1:]), "--into", str(tmp_path / "joined"), cwd=tmp_path)
    assert missing.returncode != 0 and "manifest.json" in missing.stderr  # every part is needed, the first too
    joined = carry("assemble", *map(str, parts), "--into", str(tmp_path / "joined"), cwd=tmp_path)
    assert joined.returncode == 0, joined.stderr
    assert {w.name: w.read_bytes() for w in (tmp_path / "joined").glob("*.whl")} == originals
    chunk = next(f for f in parts[0].iterdir() if f.name != "manifest.json")
    chunk.write_bytes(b"x" + chunk.read_bytes()[1:])  # a part damaged on the way: refused, nothing at the final path
    damaged = carry("assemble", *map(str, parts), "--into", str(tmp_path / "again"), cwd=tmp_path)
    assert damaged.returncode != 0 and "sha256 differs" in damaged.stderr
    assert not list((tmp_path / "again").glob(chunk.name.rsplit(".", 1)[0]))

    installed = carry("install", str(tmp_path / "joined"), str(tmp_path / "site"), "--for-device", cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "site" / "topvllm" / "__init__.py").is_file() and (tmp_path / "site" / "alpha" / "payload.bin").stat().st_size == 40_000
    probe = subprocess.run([sys.executable, "-c", "import topvllm, zeta, kappa; print(topvllm.VERSION)"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert probe.stdout.strip() == "1.0", probe.stderr
    # --exclude: the pipeline's wheels alone out of the same directory (bench/gpu/stage_speed.sh)
    some = carry("install", str(tmp_path / "joined"), str(tmp_path / "some"), "--for-device", "--exclude", "TopVLLM", "alpha", cwd=tmp_path)
    assert some.returncode == 0, some.stderr
    assert not (tmp_path / "some" / "topvllm").exists() and not (tmp_path / "some" / "alpha").exists() and (tmp_path / "some" / "zeta").is_dir()


def test_without_the_images_list_the_needs_file_stands_for_it(tmp_path):
    index = index_of(tmp_path)
    needs = tmp_path / "needs.txt"
    needs.write_text("# direct requirements the image lacks\ntopvllm==1.0\nbeta[fast]<3\n")
    derived = carry("derive", str(tmp_path / "wheels"), "--requirement", "topvllm==1.0", "--image-packages", str(tmp_path / "none.txt"),
                    "--needs", str(needs), "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", cwd=tmp_path)
    assert derived.returncode == 0, derived.stderr
    report = json.loads((tmp_path / "wheels" / "carry.json").read_text())
    assert sorted(report["taken"]) == ["beta", "topvllm"] and report["transitive"] is False  # nothing beyond the list is derived


def test_a_requirement_no_index_has_fails_derive_naming_it(tmp_path):
    index = index_of(tmp_path)
    (index / "delta-2.1-py3-none-any.whl").unlink()
    image = tmp_path / "image-packages.txt"
    image.write_text("epsilon==1.0\n")
    derived = carry("derive", str(tmp_path / "wheels"), "--requirement", "topvllm==1.0", "--image-packages", str(image),
                    "--pip-arg=--no-index", f"--pip-arg=--find-links={index}", cwd=tmp_path)
    assert derived.returncode == 1 and '"delta": "pip download delta>=2' in derived.stdout


def test_pack_carries_files_in_order_and_unpack_writes_each_once_its_parts_have_come(tmp_path):
    """The files as one stream in parts: what comes first (the pipeline's wheels, the model) is
    whole, and checked, before the rest has travelled; a damaged part is refused, never used."""
    first, model, last = tmp_path / "first.whl", tmp_path / "model.gguf", tmp_path / "last.whl"
    for path, size in ((first, 3_000), (model, 9_000), (last, 11_000)):
        path.write_bytes(os.urandom(size))
    r = carry("pack", str(tmp_path / ".carry"), str(first), str(model), str(last), "--part-mib", str(5_000 / 2**20), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    parts = sorted(tmp_path.glob(".carry*"))
    assert len(parts) == 5  # 23,000 bytes in parts of 5,000
    stage, into = tmp_path / "stage", tmp_path / "files"
    stage.mkdir()
    for part in parts[:3]:  # 15,000 bytes: first and model are whole (12,000), last is not
        subprocess.run(["cp", "-r", str(part), str(stage)], check=True)
    r = carry("unpack", str(stage), "--into", str(into), cwd=tmp_path)
    assert r.returncode == 0 and "still travelling: last.whl" in r.stdout, r.stdout + r.stderr
    assert (into / "first.whl").read_bytes() == first.read_bytes() and (into / "model.gguf").read_bytes() == model.read_bytes()
    assert not (into / "last.whl").exists()
    for part in parts[3:]:
        subprocess.run(["cp", "-r", str(part), str(stage)], check=True)
    damaged = next(stage.glob(".carry5/stream.*"))
    data = damaged.read_bytes()
    damaged.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    r = carry("unpack", str(stage), "--into", str(into), cwd=tmp_path)
    assert r.returncode != 0 and "last.whl: sha256 differs" in r.stderr and not (into / "last.whl").exists()
    subprocess.run(["cp", str(parts[4] / damaged.name), str(damaged)], check=True)
    r = carry("unpack", str(stage), "--into", str(into), cwd=tmp_path)
    assert r.returncode == 0 and "every file is here" in r.stdout and (into / "last.whl").read_bytes() == last.read_bytes()


def test_pack_leaves_out_a_second_version_of_a_distribution(tmp_path):
    """The pipeline's wheels come first and vLLM's dependencies after: where both hold one
    distribution at two versions, the later one is left out (pip installs no two versions of one
    package together: on an H100 it refused the whole carry), and the carry says so."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pinned, newer = make_wheel(wheels, "httpx_two", "2.16.2", []), make_wheel(wheels, "httpx_two", "2.17.0", [])
    other = make_wheel(wheels, "servepkg", "1.0", [])
    r = carry("pack", str(tmp_path / ".carry"), str(pinned), str(newer), str(other), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"left out {newer.name}: {pinned.name} comes first" in r.stderr
    manifest = json.loads((tmp_path / ".carry1" / "manifest.json").read_text())
    assert [e["name"] for e in manifest["files"]] == [pinned.name, other.name]


def test_install_of_two_versions_of_a_distribution_names_them_in_one_line(tmp_path):
    """A carry packed before pack left duplicates out: install says which two, installs nothing."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pinned, newer = make_wheel(wheels, "httpx_two", "2.16.2", []), make_wheel(wheels, "httpx_two", "2.17.0", [])
    make_wheel(wheels, "servepkg", "1.0", [])
    r = carry("install", str(wheels), str(tmp_path / "site"), "--new-only", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert f"two versions of one distribution ({pinned.name}, {newer.name})" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "site").exists() and not (wheels / ".installed").exists()
    newer.unlink()
    r = carry("install", str(wheels), str(tmp_path / "site"), "--new-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"installed 2 wheels into {tmp_path / 'site'}"


def test_stage_keeps_each_calls_parts_and_install_takes_only_new_wheels(tmp_path):
    """Across device calls: each call's part directories of one family are kept (the next call
    no longer has them), another family's parts stay apart, and `install --new-only` installs
    what has come since the last install, once (here for this machine, into scratch targets)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    first, second = make_wheel(wheels, "pipeline", "1.0", []), make_wheel(wheels, "servepkg", "2.0", [], payload=os.urandom(9_000))
    other = tmp_path / "notes.txt"
    other.write_text("another pack\n")
    packs = tmp_path / "packs"
    packs.mkdir()
    assert carry("pack", str(packs / ".carry"), str(first), str(second), "--part-mib", str(5_000 / 2**20), cwd=tmp_path).returncode == 0
    assert carry("pack", str(packs / ".carry-ev"), str(other), cwd=tmp_path).returncode == 0
    parts = sorted(packs.glob(".carry[0-9]*"))
    assert len(parts) >= 2
    stage, files, site = tmp_path / "stage", tmp_path / "files", tmp_path / "site"
    calls = [parts[:1], parts[1:]]
    for n, call in enumerate(calls):  # the repository's root as one call sees it: its carried dirs only
        root = tmp_path / f"call{n}"
        root.mkdir()
        for part in call + ([packs / ".carry-ev1"] if n == 0 else []):
            subprocess.run(["cp", "-r", str(part), str(root)], check=True)
        r = carry("stage", str(stage), "--into", str(files), "--root", str(root), cwd=root)
        assert r.returncode == 0, r.stderr
        r = carry("install", str(files), str(site), "--new-only", cwd=root)
        assert r.returncode == 0, r.stderr
        if n == 0:
            assert (files / first.name).is_file() and not (files / second.name).exists()
            assert r.stdout.strip() == f"installed 1 wheels into {site}" and (site / "pipeline").is_dir()
    assert r.stdout.strip() == f"installed 1 wheels into {site}" and (site / "servepkg" / "payload.bin").read_bytes() == (
        zipfile.ZipFile(second).read("servepkg/payload.bin"))
    assert carry("install", str(files), str(site), "--new-only", cwd=tmp_path).stdout.strip() == "no new wheels"
    assert not (files / "notes.txt").exists()  # the -ev family is its own pack
    r = carry("stage", str(tmp_path / "es"), "--into", str(tmp_path / "ef"), "--family", "ev", "--root", str(tmp_path / "call0"), cwd=tmp_path)
    assert r.stdout.splitlines()[-1] == "every file is here" and (tmp_path / "ef" / "notes.txt").read_text() == "another pack\n"
    r = carry("stage", str(tmp_path / "ks"), "--into", str(tmp_path / "kf"), "--family", "km", "--root", str(tmp_path / "call1"), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "nothing of .carry-km has come"


def test_slim_leaves_out_the_named_members_and_installs(tmp_path):
    """slim: the members under each --drop prefix gone from the wheel and its RECORD, the rest
    installable by pip as before; a prefix that matches nothing is refused (another wheel)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, "servepkg", "2.0", [], payload=os.urandom(9_000))
    with zipfile.ZipFile(wheel, "a") as z:  # a deflated executable member, and paths with commas (RECORD quotes them)
        info = zipfile.ZipInfo("servepkg/kernel.so")
        info.external_attr, info.compress_type = 0o100755 << 16, zipfile.ZIP_DEFLATED
        z.writestr(info, b"\0" * 4096)
        z.writestr("servepkg/configs/E=8,N=64.json", b"{}")
        z.writestr("servepkg/configs/E=8,N=128.json", b"{}")
    with zipfile.ZipFile(wheel) as z:
        record = z.read("servepkg-2.0.dist-info/RECORD").decode()
    rows = record + '"servepkg/configs/E=8,N=64.json",,\n"servepkg/configs/E=8,N=128.json",,\nservepkg/kernel.so,,\n'
    rewritten = tmp_path / "rewritten" / wheel.name  # the wheel again with those in its RECORD
    rewritten.parent.mkdir()
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for member in src.infolist():
            dst.writestr(member, rows if member.filename.endswith("/RECORD") else src.read(member))
    wheel = rewritten
    r = carry("slim", str(wheel), "--into", str(tmp_path / "slim"), "--drop", "servepkg/payload", "servepkg/configs/E=8,N=64", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    slimmed = tmp_path / "slim" / wheel.name
    with zipfile.ZipFile(slimmed) as z, zipfile.ZipFile(wheel) as before:
        assert "servepkg/payload.bin" not in z.namelist() and "servepkg/__init__.py" in z.namelist()
        kept = z.read("servepkg-2.0.dist-info/RECORD").decode()
        assert "servepkg/payload.bin" not in kept and "E=8,N=64.json" not in kept and '"servepkg/configs/E=8,N=128.json",,' in kept
        for name in ("servepkg/kernel.so", "servepkg/__init__.py"):  # each member as it was: mode, compression, bytes
            a, b = before.getinfo(name), z.getinfo(name)
            assert (b.external_attr, b.compress_type, z.read(name)) == (a.external_attr, a.compress_type, before.read(name))
    r = carry("install", str(tmp_path / "slim"), str(tmp_path / "site"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "servepkg" / "__init__.py").is_file() and not (tmp_path / "site" / "servepkg" / "payload.bin").exists()
    r = carry("slim", str(wheel), "--into", str(tmp_path / "slim2"), "--drop", "servepkg/nothing_here", cwd=tmp_path)
    assert r.returncode != 0 and "nothing under servepkg/nothing_here" in r.stderr
    assert not list((tmp_path / "slim2").glob("*"))  # no partial wheel left
