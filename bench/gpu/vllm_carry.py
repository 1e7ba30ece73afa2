#!/usr/bin/env python3
"""Carry vLLM to the GPU machine, which reaches no index: wheels derived here, carried in parts.

    python bench/gpu/vllm_carry.py derive DEST [--requirement vllm==0.26.0] [--image-packages FILE] [--needs FILE] [--exclude NAME...]
    python bench/gpu/vllm_carry.py slim WHEEL --into DIR [--drop PREFIX...]    (the wheel without what a Hopper GPU never loads)
    python bench/gpu/vllm_carry.py split DEST PREFIX [--part-mib 50]
    python bench/gpu/vllm_carry.py assemble PART_DIR... --into DIR          (on the device)
    python bench/gpu/vllm_carry.py install DIR TARGET [--for-device] [--exclude NAME...]   (on the device; --for-device: here, for its platform)
    python bench/gpu/vllm_carry.py pack PREFIX FILE... [--part-mib 56]       (files in order, one stream cut in parts)
    python bench/gpu/vllm_carry.py unpack STAGE --into DIR                    (on the device: each file whose parts have come)
    python bench/gpu/vllm_carry.py stage STAGE --into DIR [--family F]        (on the device: this call's ./.carry[-F]<N>/ kept, then unpack)
    python bench/gpu/vllm_carry.py install DIR TARGET --new-only ...          (on the device: the wheels of DIR no install took yet)

derive: downloads the requirement's wheel for the device's Python (3.12, manylinux x86-64, no
dependencies), reads its Requires-Dist (markers evaluated for that platform, extras followed),
and downloads each requirement the image lacks (not in `pip list --format=freeze` of the image,
bench/gpu/image-packages.txt, or there at a version the requirement excludes), then theirs, until
nothing is missing; DEST/carry.json says what was taken and why (which wheel asked for it) and what
the image already has. Without the image's list, ../shared/gpu/vllm-0.26.0-needs.txt (the direct
requirements the image lacks) stands for it, and nothing beyond those is derived (carry.json
says so). vLLM 0.26.0: the newest whose torch pin (2.11.0) is the image's.
slim: WHEEL rewritten into DIR (same name) without the members under each --drop prefix, its
RECORD without their lines; the default drops what vLLM 0.26.0 carries for other GPUs and other
Pythons (SLIM_DROP: 0.26.0's wheel from 290 MiB to 145 MiB). The MoE kernels
(_moe_C_stable_libtorch) stay: without them vLLM serves no MoE model (Kimi-K2.5), and fails
only when the model's first MoE layer runs (`torch.ops._moe_C` has no `moe_align_block_size`).
split: each wheel cut into chunks of at most --part-mib, packed into PREFIX1/, PREFIX2/, ... of
at most that size each (one device call each: 64 MiB with everything else), with
PREFIX1/manifest.json (every wheel's chunks and sha256).
assemble: the chunks of every part directory joined again and checked against the manifest.
install: `pip install --no-index --no-deps --target TARGET` of every wheel but --exclude's (by
distribution name: the pipeline alone out of the vLLM carry); then PYTHONPATH=TARGET. With
--new-only, only the wheels that no earlier install from DIR took (DIR/.installed lists them):
a carry call installs what has come since the last (the pipeline's wheels into one target, vLLM's
into another later).
stage: a device call carries some part directories of one pack (./.carry1/, ... or, packed with
the PREFIX .carry-F, ./.carry-F1/, ...); they are gone at the next call, so they are copied into
STAGE, where the earlier calls' parts wait, and `unpack` writes what is whole.
bench/gpu/vllm_check.py checks the result on the device before anything else uses it.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # the device's bare image: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import InvalidVersion, Version

HERE = Path(__file__).resolve().parent
IMAGE_PACKAGES = HERE / "image-packages.txt"  # the image's `python3 -m pip list --format=freeze`, recorded on a lent call
NEEDS = HERE.parents[1].parent / "shared" / "gpu" / "vllm-0.26.0-needs.txt"
# The device: Python 3.12 on manylinux x86-64 (the H200 image).
DEVICE = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
          "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORM_ARGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_35_x86_64",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
MANIFEST = "manifest.json"
# What slim drops from vLLM 0.26.0's wheel by default: FlashAttention 2 (Hopper runs FA3), the SM100
# (Blackwell) attention sources, DeepGEMM's builds for other Pythons than the device's 3.12, and the
# Rust front end (vllm-rs; `vllm serve` is the Python one).
SLIM_DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/third_party/fmha_sm100/", "vllm/vllm-rs",
             *(f"vllm/third_party/deep_gemm/_C.cpython-3{minor}-x86_64-linux-gnu.so" for minor in (10, 11, 13, 14)))


def read_freeze(path: Path) -> dict[str, str]:
    """`pip list --format=freeze` -> {canonical name: version}."""
    out = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name and not name.startswith("#"):
            out[canonicalize_name(name)] = version.strip()
    return out


def read_needs(path: Path) -> list[str]:
    """The needs file: requirement lines, comments and blank lines dropped."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(meta).decode("utf-8", "replace")
    headers = text.split("\n\n", 1)[0].splitlines()
    value = lambda key: next(line.split(":", 1)[1].strip() for line in headers if line.startswith(key + ":"))  # noqa: E731
    return value("Name"), value("Version"), [line.split(":", 1)[1].strip() for line in headers if line.startswith("Requires-Dist:")]


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether the requirement applies on the device (its marker, for the extras asked for)."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**DEVICE, "extra": extra}) for extra in (extras or {""}))


def satisfied(requirement: Requirement, version: str | None) -> bool:
    if version is None:
        return False
    if version == "":  # in the image, its version not recorded (image-packages.txt from KINDS.md): taken as it is
        return True
    try:
        return not requirement.specifier or requirement.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def download(requirement: str, dest: Path, pip_args: list[str]) -> Path:
    """One wheel for the device, no dependencies; the file pip saved (or found already there)."""
    before = set(dest.glob("*.whl"))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", *PLATFORM_ARGS, *pip_args,
                           "-d", str(dest), requirement], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {requirement}: " + (proc.stderr.strip().splitlines() or ["failed"])[-1])
    new = set(dest.glob("*.whl")) - before
    if new:
        return new.pop()
    name = canonicalize_name(Requirement(requirement).name)
    found = [w for w in dest.glob("*.whl") if distribution(w.name) == name]
    if not found:
        raise RuntimeError(f"pip download {requirement}: no wheel in {dest}")
    return max(found, key=lambda w: w.stat().st_mtime)


def derive(dest: Path, top: str, image: dict[str, str] | None, needs: list[str] | None, exclude: set[str], pip_args: list[str]) -> dict:
    """Download `top` and what the image lacks of its requirements (see the module's doc)."""
    dest.mkdir(parents=True, exist_ok=True)
    taken: dict[str, dict] = {}
    in_image: dict[str, str] = {}
    excluded: dict[str, str] = {}
    failed: dict[str, str] = {}
    queue: list[tuple[str, str]] = [(top, "asked for")]
    if image is None:
        queue += [(line, f"{NEEDS.name} (no image package list)") for line in needs or []]
    while queue:
        line, why = queue.pop(0)
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if not applies(requirement, set()) and why != "asked for":
            continue
        if name in exclude:
            excluded[name] = why
            continue
        if image is not None and satisfied(requirement, image.get(name)):
            in_image[name] = image[name]
            continue
        if name in taken and satisfied(requirement, taken[name]["version"]):
            new_extras = set(requirement.extras) - set(taken[name]["extras"])
            if new_extras and image is not None:  # the same wheel, asked for with more extras: their requirements too
                taken[name]["extras"] = sorted(set(taken[name]["extras"]) | new_extras)
                queue += _requirements(dest / taken[name]["file"], new_extras, f"{name} {taken[name]['version']}")
            continue
        if name in taken:
            failed[name] = f"{line} (from {why}) conflicts with {taken[name]['version']} taken for {taken[name]['why']}"
            continue
        spec = f"{requirement.name}{requirement.specifier}"
        try:
            wheel = download(spec, dest, pip_args)
        except RuntimeError as e:
            failed[name] = str(e)
            continue
        _, version, _ = wheel_metadata(wheel)
        taken[name] = {"version": version, "file": wheel.name, "bytes": wheel.stat().st_size, "sha256": sha256(wheel), "why": why,
                       "extras": sorted(requirement.extras)}
        print(f"{wheel.name}  {wheel.stat().st_size / 2**20:.1f} MiB  ({why})", flush=True)
        if image is not None:  # without the image's list nothing beyond the needs file is derived
            queue += _requirements(wheel, set(requirement.extras), f"{name} {version}")
    report = {"requirement": top, "platform": DEVICE, "image_packages": str(IMAGE_PACKAGES) if image is not None else None,
              "transitive": image is not None, "taken": taken, "in_image": in_image, "excluded": excluded, "failed": failed,
              "bytes": sum(t["bytes"] for t in taken.values())}
    (dest / "carry.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def _requirements(wheel: Path, extras: set[str], why: str) -> list[tuple[str, str]]:
    """The wheel's requirements that apply on the device with these extras (only the extras'
    own when `extras` is what is new), as queue entries."""
    _, _, requires = wheel_metadata(wheel)
    out = []
    for line in requires:
        req = Requirement(line)
        if applies(req, extras):
            out.append((_without_marker(req), why))
    return out


def _without_marker(requirement: Requirement) -> str:
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    return f"{requirement.name}{extras}{requirement.specifier}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def slim(wheel: Path, into: Path, drop: tuple[str, ...]) -> tuple[Path, list[str]]:
    """WHEEL written into INTO without the members under `drop` (see the module's doc); the new
    wheel and the names dropped. A prefix that matches nothing is an error: the wheel is not the
    one the list was made for."""
    into.mkdir(parents=True, exist_ok=True)
    out = into / wheel.name
    if out.resolve() == wheel.resolve():
        raise SystemExit(f"{out}: --into must be another directory than the wheel's")
    dropped: list[str] = []
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        unmatched = [d for d in drop if not any(n.startswith(d) for n in names)]
        if unmatched:
            raise SystemExit(f"{wheel.name}: nothing under {', '.join(unmatched)}; not the wheel SLIM_DROP was made for")
        record = next((n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)), None)
        if record is None:
            raise SystemExit(f"{wheel.name}: no .dist-info/RECORD; not a wheel")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename.startswith(drop):
                    dropped.append(info.filename)
                elif info.filename != record:
                    dst.writestr(info, src.read(info))  # each member's own compression and mode
            kept = io.StringIO()
            writer = csv.writer(kept, lineterminator="\n")  # RECORD is CSV: a path with a comma is quoted
            for row in csv.reader(io.StringIO(src.read(record).decode())):
                if row and not row[0].startswith(drop):
                    writer.writerow(row)
            dst.writestr(src.getinfo(record), kept.getvalue())
    tmp.rename(out)
    return out, dropped


def split(dest: Path, prefix: str, part_bytes: int) -> list[Path]:
    """Every wheel of DEST in chunks, packed into part directories of at most part_bytes each."""
    wheels = sorted(dest.glob("*.whl"), key=lambda w: w.stat().st_size, reverse=True)
    manifest: dict[str, dict] = {}
    parts: list[list[tuple[str, bytes]]] = [[]]
    sizes = [0]
    for wheel in wheels:
        data = wheel.read_bytes()
        chunks = []
        for i in range(0, max(len(data), 1), part_bytes):
            chunk = data[i:i + part_bytes]
            name = f"{wheel.name}.{i // part_bytes:03d}"
            slot = next((j for j, used in enumerate(sizes) if used + len(chunk) <= part_bytes), None)
            if slot is None:
                parts.append([])
                sizes.append(0)
                slot = len(parts) - 1
            parts[slot].append((name, chunk))
            sizes[slot] += len(chunk)
            chunks.append(name)
        manifest[wheel.name] = {"chunks": chunks, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    out = []
    for j, files in enumerate(parts, 1):
        part = Path(f"{prefix}{j}")
        part.mkdir(parents=True, exist_ok=True)
        for name, chunk in files:
            (part / name).write_bytes(chunk)
        out.append(part)
    (out[0] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def assemble(parts: list[Path], into: Path) -> list[Path]:
    """The wheels again, each checked against the manifest's sha256."""
    manifest_path = next((p / MANIFEST for p in parts if (p / MANIFEST).is_file()), None)
    if manifest_path is None:
        raise SystemExit(f"no {MANIFEST} in {', '.join(map(str, parts))}: give every part directory")
    manifest = json.loads(manifest_path.read_text())
    chunks = {c.name: c for p in parts for c in p.iterdir() if c.name != MANIFEST}
    into.mkdir(parents=True, exist_ok=True)
    wheels = []
    for wheel, entry in manifest.items():
        missing = [c for c in entry["chunks"] if c not in chunks]
        if missing:
            raise SystemExit(f"{wheel}: chunks {', '.join(missing)} are in no part given")
        tmp = into / (wheel + ".tmp")
        with open(tmp, "wb") as f:
            for c in entry["chunks"]:
                f.write(chunks[c].read_bytes())
        if sha256(tmp) != entry["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{wheel}: sha256 differs from the manifest's after joining its chunks")
        tmp.rename(into / wheel)
        wheels.append(into / wheel)
    return wheels


def pack(files: list[Path], prefix: str, part_bytes: int) -> list[Path]:
    """FILES, in order, as one stream cut into PREFIX1/, PREFIX2/, ... of part_bytes each (the last
    shorter), each part with the whole manifest: a file is whole as soon as its parts have come,
    so what comes first (the pipeline's wheels, the model) is used while the rest travels. A wheel
    of a distribution an earlier wheel already has is left out (said on stderr): pip installs no
    two versions of one package together, and the first is the pipeline's pin."""
    entries, offset, kept, seen = [], 0, [], {}
    for f in files:
        name = distribution(f.name) if f.suffix == ".whl" else f.name
        if name in seen:
            print(f"left out {f.name}: {seen[name]} comes first", file=sys.stderr)
            continue
        seen[name] = f.name
        kept.append(f)
    files = kept
    for f in files:
        size = f.stat().st_size
        entries.append({"name": f.name, "offset": offset, "bytes": size, "sha256": sha256(f)})
        offset += size
    manifest = {"part_bytes": part_bytes, "total": offset, "files": entries}
    out, buffer, index = [], b"", 1

    def flush(data: bytes) -> None:
        part = Path(f"{prefix}{len(out) + 1}")
        part.mkdir(parents=True, exist_ok=True)
        (part / f"stream.{len(out) + 1:03d}").write_bytes(data)
        (part / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        out.append(part)

    for f in files:
        with open(f, "rb") as source:
            while block := source.read(1 << 22):
                buffer += block
                while len(buffer) >= part_bytes:
                    flush(buffer[:part_bytes])
                    buffer = buffer[part_bytes:]
                    index += 1
    if buffer:
        flush(buffer)
    return out


def unpack(stage: Path, into: Path) -> list[str]:
    """Every file of the manifest whose bytes are all in the parts under STAGE, written to INTO
    and checked (once: a file already there is left); returns the names still incomplete."""
    manifest = json.loads(next(stage.rglob(MANIFEST)).read_text())
    size = manifest["part_bytes"]
    parts = {int(p.name.split(".")[1]): p for p in stage.rglob("stream.*")}
    into.mkdir(parents=True, exist_ok=True)
    waiting = []
    for entry in manifest["files"]:
        target = into / entry["name"]
        if target.is_file():
            continue
        first, last = entry["offset"] // size + 1, (entry["offset"] + entry["bytes"] - 1) // size + 1
        if any(i not in parts for i in range(first, last + 1)):
            waiting.append(entry["name"])
            continue
        tmp = into / (entry["name"] + ".tmp")
        with open(tmp, "wb") as f:
            at, left = entry["offset"], entry["bytes"]
            while left:
                i = at // size + 1
                with open(parts[i], "rb") as p:
                    p.seek(at - (i - 1) * size)
                    data = p.read(min(left, size - (at - (i - 1) * size)))
                f.write(data)
                at, left = at + len(data), left - len(data)
        if sha256(tmp) != entry["sha256"]:
            tmp.unlink()
            raise SystemExit(f"{entry['name']}: sha256 differs from the manifest's after joining its parts")
        tmp.rename(target)
        print(f"{target}  {entry['bytes'] / 2**20:.1f} MiB", flush=True)
    return waiting


def distribution(wheel: str) -> str:
    """A wheel file's distribution, as pip compares them (its name before the first '-')."""
    return canonicalize_name(wheel.split("-", 1)[0])


def carry_name(family: str) -> str:
    """The part directories' name before their number: .carry, or .carry-F for family F."""
    return ".carry" + (f"-{family}" if family else "")


def stage(family: str, root: Path, stage_dir: Path, into: Path) -> list[str] | None:
    """This call's part directories of one family (root/.carry[-F]<N>/) copied into stage_dir,
    then `unpack`: the names still incomplete, or None where no part of the family has come."""
    pattern = re.compile(rf"{re.escape(carry_name(family))}\d+")
    stage_dir.mkdir(parents=True, exist_ok=True)
    for part in sorted(root.iterdir()):
        if part.is_dir() and pattern.fullmatch(part.name):
            shutil.copytree(part, stage_dir / part.name, dirs_exist_ok=True)
    if not any(stage_dir.rglob(MANIFEST)):
        return None
    return unpack(stage_dir, into)


INSTALLED = ".installed"  # in the wheels' directory: the wheels an install --new-only took


def install(wheels_dir: Path, target: Path, for_device: bool, exclude: set[str] = frozenset(), new_only: bool = False) -> list[str]:
    """Installs the wheels (see the module's doc); returns their names."""
    record = wheels_dir / INSTALLED
    taken = set(record.read_text().split()) if new_only and record.is_file() else set()
    wheels = sorted(w for w in wheels_dir.glob("*.whl") if distribution(w.name) not in exclude and w.name not in taken)
    if not wheels:
        if new_only:
            return []
        raise SystemExit(f"{wheels_dir}: no wheels")
    # pip refuses the whole install over two versions of one distribution, in a traceback that
    # does not say which: say it in one line (a carry packed before `pack` left them out)
    versions: dict[str, list[str]] = {}
    for w in sorted(wheels_dir.glob("*.whl")):
        versions.setdefault(distribution(w.name), []).append(w.name)
    new = {w.name for w in wheels}
    if twice := [", ".join(v) for v in versions.values() if len(v) > 1 and new.intersection(v)]:
        raise SystemExit(f"{wheels_dir}: two versions of one distribution ({'; '.join(twice)}): pip installs one; pack the carry again "
                         "(vllm_carry.py pack keeps the first) or remove the one not wanted")
    platform = PLATFORM_ARGS if for_device else []
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                    *platform, "--target", str(target), *map(str, wheels)], check=True)
    if new_only:
        with open(record, "a") as f:
            f.write("".join(f"{w.name}\n" for w in wheels))
    return [w.name for w in wheels]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("derive")
    d.add_argument("dest")
    d.add_argument("--requirement", default="vllm==0.26.0")
    d.add_argument("--image-packages", default=str(IMAGE_PACKAGES), help="the image's pip list --format=freeze (absent: --needs stands for it)")
    d.add_argument("--needs", default=str(NEEDS))
    d.add_argument("--exclude", nargs="*", default=[], help="packages not to carry (an import error names any that is needed)")
    d.add_argument("--pip-arg", action="append", default=[], help="passed to pip download (tests: --no-index, --find-links=DIR)")
    m = sub.add_parser("slim")
    m.add_argument("wheel")
    m.add_argument("--into", required=True)
    m.add_argument("--drop", nargs="*", default=list(SLIM_DROP), help="member prefixes to leave out (default: SLIM_DROP)")
    s = sub.add_parser("split")
    s.add_argument("dest")
    s.add_argument("prefix")
    s.add_argument("--part-mib", type=float, default=50.0)
    a = sub.add_parser("assemble")
    a.add_argument("parts", nargs="+")
    a.add_argument("--into", required=True)
    k = sub.add_parser("pack")
    k.add_argument("prefix")
    k.add_argument("files", nargs="+")
    k.add_argument("--part-mib", type=float, default=56.0)
    u = sub.add_parser("unpack")
    u.add_argument("stage")
    u.add_argument("--into", required=True)
    i = sub.add_parser("install")
    i.add_argument("wheels")
    i.add_argument("target")
    i.add_argument("--for-device", action="store_true", help="install here for the device's platform (Python 3.12, manylinux x86-64)")
    i.add_argument("--exclude", nargs="*", default=[], help="distributions not to install (e.g. vllm and its grammar wheels, for the pipeline alone)")
    i.add_argument("--new-only", action="store_true", help="only the wheels no earlier --new-only install from this directory took")
    g = sub.add_parser("stage")
    g.add_argument("stage")
    g.add_argument("--family", default="", help="F of the part directories .carry-F<N> (none: .carry<N>)")
    g.add_argument("--into", required=True)
    g.add_argument("--root", default=".", help="where the call's part directories are (the repository's root)")
    args = p.parse_args(argv)
    if args.command == "derive":
        image_path = Path(args.image_packages)
        image = read_freeze(image_path) if image_path.is_file() else None
        needs = read_needs(Path(args.needs)) if image is None else None
        if image is None and needs is None:
            raise SystemExit(f"neither {image_path} nor {args.needs}: record the image's pip list first")
        report = derive(Path(args.dest), args.requirement, image, needs, {canonicalize_name(n) for n in args.exclude}, args.pip_arg)
        print(f"{len(report['taken'])} wheels, {report['bytes'] / 2**20:.1f} MiB; {len(report['in_image'])} requirements in the image"
              + (f"; failed: {json.dumps(report['failed'])}" if report["failed"] else ""))
        if report["failed"]:
            sys.exit(1)
    elif args.command == "slim":
        out, dropped = slim(Path(args.wheel), Path(args.into), tuple(args.drop))
        print(f"{out}  {out.stat().st_size / 2**20:.1f} MiB ({len(dropped)} members left out)")
    elif args.command == "split":
        parts = split(Path(args.dest), args.prefix, int(args.part_mib * 2**20))
        print("\n".join(str(part) for part in parts))
    elif args.command == "assemble":
        print("\n".join(str(w) for w in assemble([Path(x) for x in args.parts], Path(args.into))))
    elif args.command == "pack":
        parts = pack([Path(f) for f in args.files], args.prefix, int(args.part_mib * 2**20))
        print("\n".join(f"{part}  {sum(f.stat().st_size for f in part.iterdir()) / 2**20:.1f} MiB" for part in parts))
    elif args.command == "unpack":
        waiting = unpack(Path(args.stage), Path(args.into))
        print(f"still travelling: {', '.join(waiting)}" if waiting else "every file is here")
    elif args.command == "stage":
        waiting = stage(args.family, Path(args.root), Path(args.stage), Path(args.into))
        print(f"nothing of {carry_name(args.family)} has come" if waiting is None else f"still travelling: {', '.join(waiting)}" if waiting else "every file is here")
    else:
        names = install(Path(args.wheels), Path(args.target), args.for_device, {canonicalize_name(n) for n in args.exclude}, args.new_only)
        if args.new_only:
            print(f"installed {len(names)} wheels into {args.target}" if names else "no new wheels")


if __name__ == "__main__":
    main()
